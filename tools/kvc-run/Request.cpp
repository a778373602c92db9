//===- Request.cpp - What kvc-run's commands read a request from ----------===//

#include "Commands.h"

#include "kvc/Runtime/Device/Registry.h"

#include "kvc/Runtime/Base/Memory.h"
#include "kvc/Host/Stores.h"
#include "kvc/Runtime/Model/Llama2c.h"
#include "kvc/Runtime/Model/Tokenizer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

namespace kvc::run {

namespace {
Device *selected = nullptr;
} // namespace

Device &backend() { return selected ? *selected : cpuDevice(); }

StatusOr<std::shared_ptr<LlamaModel>> loadModel(const std::string &dir) {
  static std::map<std::string, std::shared_ptr<LlamaModel>> loaded;
  std::error_code error;
  const std::string key =
      std::filesystem::weakly_canonical(dir, error).string();
  auto it = loaded.find(key);
  if (it != loaded.end())
    return it->second;
  // A model that computes on another device than the host's copies its
  // checkpoint there as stored; its fp32 host weights are made only if a
  // host-side step asks for them.
  LlamaModel::LoadOptions options;
  options.hostWeights = &backend() == &cpuDevice();
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(dir, options));
  std::shared_ptr<LlamaModel> shared = std::move(model);
  loaded.emplace(key, shared);
  return shared;
}

Status selectBackend(const std::string &name, const std::string &gemm) {
  if (!gemm.empty() && gemm != "f32" && gemm != "bf16")
    return invalidArgument("--gemm expects f32 or bf16, got " + gemm);
  DeviceOptions options;
  options.gemm = gemm;
  KVC_ASSIGN_OR_RETURN(opened, openDevice(name, options));
  selected = opened;
  return Status::ok();
}

StatusOr<DType> parseDType(const std::string &name) {
  if (name == "bf16")
    return DType::BF16;
  if (name == "f16")
    return DType::F16;
  if (name == "f32")
    return DType::F32;
  return invalidArgument("--dtype expects bf16, f16 or f32, got " + name);
}

StatusOr<StoreLayout> storeLayout(Args &args) {
  StoreLayout layout;
  KVC_ASSIGN_OR_RETURN(chunkTokens,
                       args.integer("chunk-tokens", layout.chunkTokens));
  KVC_ASSIGN_OR_RETURN(layerGroup,
                       args.integer("layer-group", layout.layerGroup));
  if (chunkTokens <= 0 || layerGroup <= 0)
    return invalidArgument("--chunk-tokens and --layer-group must be positive");
  return StoreLayout{chunkTokens, layerGroup};
}

Status refuseLayoutOptions(Args &args) {
  if (args.has("chunk-tokens") || args.has("layer-group"))
    return invalidArgument(
        "--chunk-tokens and --layer-group: the Connector reads the store's "
        "layout from the store (they are for a save and cake)");
  return Status::ok();
}

StatusOr<std::unique_ptr<ChunkStore>>
openStore(Args &args, const LlamaModel &model, TierAccess access) {
  host::StoreOptions options;
  KVC_ASSIGN_OR_RETURN(url, args.required("store"));
  // A reader without --chunk-tokens or --layer-group reads the layout the
  // store records (host::openStore); a writer records its own.
  const bool recorded = access == TierAccess::Existing &&
                        !args.has("chunk-tokens") && !args.has("layer-group");
  KVC_ASSIGN_OR_RETURN(layout, storeLayout(args));
  options.url = url;
  options.layout = recorded ? StoreLayout{0, 1} : layout;
  options.tenant = args.get("tenant");
  options.access = access;
  return host::openStore(options, model);
}

/// Fails when the f32 K and V of `tokens` tokens (what a prefill of them
/// holds, before any other buffer) exceed the memory this machine has
/// available: said at once, not after a prefill that would swap or die.
namespace {

Status checkFits(const ModelConfig &model, int64_t tokens) {
  const double needed = double(tokens) * double(model.numLayers) * 2.0 *
                        double(model.numKvHeads * model.headDim) * 4.0;
  const int64_t available = availableMemoryBytes();
  if (available > 0 && needed > double(available)) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "%lld tokens: their K and V alone need %.1f GiB, this "
                  "machine has %.1f GiB available",
                  (long long)tokens, needed / double(1 << 30),
                  double(available) / double(1 << 30));
    return failedPrecondition(text);
  }
  return Status::ok();
}

} // namespace

StatusOr<std::vector<int32_t>> requestTokens(Args &args,
                                             const ModelConfig &model) {
  std::vector<int32_t> tokens;
  auto tooLong = [&](const std::string &what, int64_t n) {
    return invalidArgument(what + ": " + std::to_string(n) +
                           " tokens, the model holds at most " +
                           std::to_string(model.maxPositions) + " positions");
  };
  if (int(args.has("tokens")) + int(args.has("random-tokens")) +
          int(args.has("prompt")) >
      1)
    return invalidArgument(
        "give one of --tokens, --random-tokens and --prompt");
  if (args.has("prompt")) {
    const std::string path = tokenizerPath(args.get("model"));
    if (path.empty())
      return invalidArgument("--prompt needs a model with a tokenizer.bin "
                             "(import-llama2c writes one); give --tokens");
    KVC_ASSIGN_OR_RETURN(tokenizer, Tokenizer::load(path, model.vocabSize));
    const std::string prompt = args.get("prompt");
    if (int64_t fewest = tokenizer->fewestTokens(prompt);
        fewest > model.maxPositions)
      return invalidArgument(
          "--prompt: " + std::to_string(prompt.size()) + " bytes, at least " +
          std::to_string(fewest) + " tokens; the model holds at most " +
          std::to_string(model.maxPositions) + " positions");
    tokens = tokenizer->encode(prompt);
    if (int64_t(tokens.size()) > model.maxPositions)
      return tooLong("--prompt", int64_t(tokens.size()));
    return tokens;
  }
  if (args.has("tokens")) {
    KVC_ASSIGN_OR_RETURN(path, args.required("tokens"));
    std::ifstream in(path);
    if (!in)
      return notFound(path + ": cannot open token file");
    for (std::string word; in >> word;) {
      char *end = nullptr;
      errno = 0;
      long long t = std::strtoll(word.c_str(), &end, 10);
      if (*end || errno == ERANGE || t < 0 || t >= model.vocabSize)
        return invalidArgument(
            path + ": token " + std::to_string(tokens.size() + 1) + " is \"" +
            word + "\", not a token id below the vocabulary of " +
            std::to_string(model.vocabSize));
      if (int64_t(tokens.size()) == model.maxPositions) {
        // Count the rest (without keeping them) to say how long it is.
        int64_t n = int64_t(tokens.size()) + 1;
        for (std::string more; in >> more;)
          ++n;
        return tooLong(path, n);
      }
      tokens.push_back(int32_t(t));
    }
    if (tokens.empty())
      return invalidArgument(path + ": no tokens");
    KVC_RETURN_IF_ERROR(checkFits(model, int64_t(tokens.size())));
    return tokens;
  }
  KVC_ASSIGN_OR_RETURN(count, args.integer("random-tokens", 0));
  KVC_ASSIGN_OR_RETURN(seed, args.integer("seed", 0));
  if (!args.has("random-tokens"))
    return invalidArgument("give --tokens FILE or --random-tokens N");
  if (count <= 0)
    return invalidArgument("--random-tokens must be positive, got " +
                           std::to_string(count));
  if (count > model.maxPositions)
    return tooLong("--random-tokens", count);
  KVC_RETURN_IF_ERROR(checkFits(model, count));
  std::mt19937_64 rng{uint64_t(seed)};
  for (int64_t i = 0; i < count; ++i)
    tokens.push_back(int32_t(rng() % uint64_t(model.vocabSize)));
  return tokens;
}

} // namespace kvc::run
