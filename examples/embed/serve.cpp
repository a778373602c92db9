//===- serve.cpp - kvc embedded in a server, in miniature -----------------===//
//
// Plays an LLM server that keeps KV caches of finished requests in a store
// and restores them when a request with the same prefix comes back:
//
//   1. the server owns its paged KV cache (one allocation, vLLM's flash
//      layout per layer) and a block manager handing out blocks;
//   2. request A is prefilled into it (here with kvc's reference model, the
//      server's own model in a real one) and its KV saved to a store
//      through the Connector, layer by layer;
//   3. request B has A's prompt: the server asks its host::Connector how
//      much of it is stored and what to do (the Connector prices each plan
//      with the planner and compiles the one it chooses in-process);
//   4. the Connector loads into blocks of the server's own cache; the
//      server consumes each layer as soon as that layer is resident, while
//      later layers still load, checks it equals what A computed, and
//      prefills the tokens left to it;
//   5. it prints the restore's metrics.
//
// Usage: kvc-embed-example TARGET_JSON [MODEL_DIR]
// (a small model is generated when no model is given). Exits non-zero on
// any error or on a restored value that differs from the saved one.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/CompilerHook.h"
#include "kvc/Host/Connector.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <cstdio>
#include <string>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

using namespace kvc;

namespace {

/// The server's KV memory: per layer, K and V of every block, in vLLM's
/// flash layout [num_blocks][block_size][num_kv_heads][head_dim].
struct ServerCache {
  PagedCacheConfig config;
  std::vector<uint16_t> memory;
  std::vector<int32_t> freeBlocks;

  StatusOr<BlockTable> allocate(int64_t tokens) {
    BlockTable table;
    for (int64_t t = 0; t < tokens; t += config.blockSize) {
      if (freeBlocks.empty())
        return failedPrecondition("out of KV blocks");
      table.blocks.push_back(freeBlocks.back());
      freeBlocks.pop_back();
    }
    return table;
  }
};

Status fail(const std::string &message) { return internalError(message); }

Status serve(const std::string &targetPath, std::string modelDir) {
  // Without a model, a generated one: written to a directory of this
  // process's, loaded, and removed.
  std::string generated;
  if (modelDir.empty()) {
    generated = modelDir = (std::filesystem::temp_directory_path() /
                            ("kvc-embed-model-" + std::to_string(::getpid())))
                               .string();
    GenModelOptions options;
    options.seed = 3;
    KVC_RETURN_IF_ERROR(generateModel(modelDir, options));
  }
  StatusOr<std::unique_ptr<LlamaModel>> loaded = LlamaModel::load(modelDir);
  if (!generated.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(generated, ignored);
  }
  KVC_ASSIGN_OR_RETURN(model, std::move(loaded));
  KVC_ASSIGN_OR_RETURN(target, loadTargetDesc(targetPath));
  const ModelConfig &config = model->config();
  // The server's device and its model's runner there (its forward pass).
  Device &device = cpuDevice();
  std::unique_ptr<ModelRunner> runner = device.createRunner(*model);

  // 1. The server's cache: room for two 1024-token requests, K and V per
  //    layer as vLLM allocates them, handed to the Connector once.
  ServerCache server;
  server.config.layers = config.numLayers;
  server.config.numKvHeads = config.numKvHeads;
  server.config.headDim = config.headDim;
  server.config.numBlocks = 2 * 1024 / server.config.blockSize;
  const int64_t perLayer = server.config.numBlocks * server.config.blockSize *
                           config.numKvHeads * config.headDim;
  server.memory.resize(2 * config.numLayers * perLayer);
  host::ServerCaches caches;
  caches.numBlocks = server.config.numBlocks;
  caches.blockSize = server.config.blockSize;
  caches.numKvHeads = config.numKvHeads;
  caches.headDim = config.headDim;
  for (int64_t l = 0; l < config.numLayers; ++l) {
    caches.keys.push_back(server.memory.data() + 2 * l * perLayer);
    caches.values.push_back(server.memory.data() + (2 * l + 1) * perLayer);
  }
  for (int32_t b = int32_t(server.config.numBlocks) - 1; b >= 0; --b)
    server.freeBlocks.push_back(b);
  KVC_ASSIGN_OR_RETURN(view, host::viewServerCaches(caches, config));
  PagedKVCache &cache = *view;

  // The Connector: the model, a store, the target, the compiler as its
  // planner (a server without it passes bundles: host::bundleHook).
  host::ConnectorOptions options;
  options.model = model.get();
  options.stores = {{"mem://", ""}};
  options.saveLayout = {256, 1}; // One object per layer and chunk.
  options.target = target;
  options.planner = host::compilerPlanHook();
  KVC_ASSIGN_OR_RETURN(connector, host::Connector::create(options));
  KVC_RETURN_IF_ERROR(connector->registerCaches(std::move(view)));

  // 2. Request A, prefilled by the server and saved layer by layer.
  std::vector<int32_t> prompt(1024);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = int32_t((i * 131 + 17) % config.vocabSize);
  const int64_t n = int64_t(prompt.size());
  KVC_ASSIGN_OR_RETURN(tableA, server.allocate(n));
  Clock::time_point saving = Clock::now();
  KVC_RETURN_IF_ERROR(runner->prefillInto(cache, tableA, prompt.data(), 0, n,
                                          config.numLayers));
  for (int64_t l = 0; l < config.numLayers; ++l)
    KVC_RETURN_IF_ERROR(connector->saveLayer("A", prompt, l, tableA.blocks));
  KVC_ASSIGN_OR_RETURN(saved, connector->waitSave("A"));
  std::printf("request A: prefilled and saved %lld tokens (%lld objects) in "
              "%.2f ms\n",
              (long long)n, (long long)saved.written,
              secondsSince(saving) * 1e3);

  // 3. Request B: A's prompt. What does the store hold, and what to do?
  KVC_ASSIGN_OR_RETURN(found, connector->lookup(prompt));
  std::printf("request B: the store holds %lld of its %lld tokens%s\n",
              (long long)found.tokens, (long long)n,
              found.fromIndex ? " (this process saved them)" : "");
  KVC_ASSIGN_OR_RETURN(decision, connector->decide("B", prompt, 0));
  std::printf("request B: %s\n", decision.why.c_str());
  if (!decision.loads())
    return fail("request B: nothing to load");

  // 4. Restore into blocks of the server's own cache, layer by layer.
  KVC_ASSIGN_OR_RETURN(tableB, server.allocate(n));
  Clock::time_point start = Clock::now();
  KVC_RETURN_IF_ERROR(connector->startLoad("B", tableB.blocks));
  const int64_t resident = decision.loadTokens, kv = model->kvDim();
  std::vector<float> kA(resident * kv), vA(resident * kv), kB(resident * kv),
      vB(resident * kv);
  for (int64_t l = 0; l < config.numLayers; ++l) {
    KVC_RETURN_IF_ERROR(connector->waitLayer("B", l));
    const double at = secondsSince(start);
    // The server's attention for layer l would run here; this one checks
    // the layer against request A's.
    KVC_RETURN_IF_ERROR(
        device.readBack(cache, tableA, l, 0, resident, kA.data(), vA.data()));
    KVC_RETURN_IF_ERROR(
        device.readBack(cache, tableB, l, 0, resident, kB.data(), vB.data()));
    if (kA != kB || vA != vB)
      return fail("layer " + std::to_string(l) +
                  " differs from the KV request A saved");
    std::printf("request B: layer %lld resident at %.2f ms, equal to request "
                "A's\n",
                (long long)l, at * 1e3);
  }
  KVC_ASSIGN_OR_RETURN(metrics, connector->waitLoad("B"));
  KVC_ASSIGN_OR_RETURN(failed, connector->failedBlocks("B"));
  if (!failed.empty() || !metrics.fallbacks.empty())
    return fail("request B: chunks were not loaded intact");
  // The server prefills the tokens it was left.
  KVC_RETURN_IF_ERROR(runner->prefillInto(cache, tableB,
                                          prompt.data() + resident, resident,
                                          n - resident, config.numLayers));

  // 5. Metrics.
  // (The process's first restore: it pays for its pools' threads and the
  // first touch of its buffers, so no prediction is held against it.)
  std::printf("request B: loaded %lld tokens by plan %s in %.2f ms, then "
              "prefilled %lld\n",
              (long long)resident, decision.strategy.c_str(),
              metrics.makespanSeconds * 1e3, (long long)(n - resident));
  for (const auto &[tier, bytes] : metrics.bytesRead)
    std::printf("  read %-8s %.2f MB\n", tier.c_str(), double(bytes) * 1e-6);
  for (const auto &[resource, seconds] : metrics.busySeconds)
    std::printf("  busy %-8s %.2f ms\n", resource.c_str(), seconds * 1e3);
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  const std::string first = argc > 1 ? argv[1] : "";
  const bool help = first == "--help" || first == "-h";
  if (help || argc < 2 || argc > 3 || first.rfind("-", 0) == 0) {
    std::fprintf(help ? stdout : stderr,
                 "usage: %s TARGET_JSON [MODEL_DIR]\n"
                 "  a server in miniature: saves a request's KV, plans and "
                 "runs its restore\n  through kvc's library for the target "
                 "TARGET_JSON, on a generated model or\n  MODEL_DIR's\n",
                 argv[0]);
    return help ? 0 : 2;
  }
  setComputeThreads(1);
  Status status = serve(argv[1], argc == 3 ? argv[2] : "");
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-embed-example: %s\n", status.toString().c_str());
    return 1;
  }
  return 0;
}
