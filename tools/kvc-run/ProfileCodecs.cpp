//===- ProfileCodecs.cpp - kvc-run profile-codecs -------------------------===//

#include "ProfileCodecs.h"
#include "kvc/Host/Tools/CodecTiming.h"
#include "kvc/Host/Tools/DecodeQuality.h"

#include "kvc/Planning/CodecProfile.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Codec/CodecQuality.h"
#include "kvc/Support/Format.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>

namespace kvc {

Status runCodecProfile(const LlamaModel &model, const std::vector<int32_t> &ids,
                       uint64_t seed, int64_t decodeSteps,
                       const std::string &outPath) {
  const ModelConfig &c = model.config();
  const int64_t tokens = int64_t(ids.size());
  std::mt19937_64 rng(seed);
  std::optional<host::DecodeQualityProbe> probe;
  if (decodeSteps > 0) {
    KVC_ASSIGN_OR_RETURN(made, host::DecodeQualityProbe::create(
                                   model, ids, /*cuts=*/4, decodeSteps));
    probe = std::move(made);
  }
  LlamaModel::Cache cache = model.newCache();
  KVC_RETURN_IF_ERROR(model.prefill(cache, ids.data(), tokens));
  // KV as a store holds it, one object per layer (rates are timed on
  // these), and as one chunk of every layer, layer-major (K then V per
  // layer), which the errors are measured on.
  std::printf("profile-codecs: %lld tokens prefilled; timing each codec of "
              "the planner's space (a few seconds each)\n",
              (long long)tokens);
  std::fflush(stdout);
  const KVObjects objects = kvObjects(model, cache, tokens);
  ChunkShape shape = chunkShape(c, Form::KV, tokens, 0, c.numLayers);
  std::vector<float> kv;
  kv.reserve(shape.numel());
  for (const KVObjects::Object &object : objects.objects)
    kv.insert(kv.end(), object.values.begin(), object.values.end());
  // Queries like the keys: K rows of other tokens.
  std::vector<float> queries;
  for (int q = 0; q < 8; ++q) {
    int64_t t = int64_t(rng() % uint64_t(tokens));
    queries.insert(queries.end(), &cache.k[0][t * model.kvDim()],
                   &cache.k[0][t * model.kvDim()] + c.headDim);
  }
  std::vector<float> reference = sampleAttention(kv, shape, queries);
  const double rawBytes = double(shape.numel()) * dtypeBytes(c.dtype);

  // Rates per core: of the whole codec in GB/s of raw KV (decoding to bf16,
  // as the CPU backend does), and of its lossless stage alone in GB/s of
  // the bytes that stage codes (what the profile records).
  std::printf("%-28s %8s %9s %9s %9s %6s %10s %10s %10s %10s\n", "codec",
              "ratio", "K,V err", "attn err", "KL", "agree", "enc GB/s",
              "dec GB/s", "lossl enc", "lossl dec");
  std::vector<planning::CodecProfileEntry> entries;
  std::vector<float> decoded(shape.numel());
  const planning::CodecProfile space = planning::CodecProfile::defaults();
  for (const planning::CodecProfileEntry &candidate : space.entries()) {
    const CodecSpec &codec = candidate.codec;
    if (!checkCodec(codec, shape).isOk())
      continue;
    StatusOr<std::string> encoded = encodeChunk(kv.data(), shape, codec, c.dtype);
    if (!encoded.isOk())
      return encoded.status();
    KVC_RETURN_IF_ERROR(
        decodeChunk(*encoded, shape, codec, c.dtype, decoded.data()));
    planning::CodecProfileEntry entry;
    entry.codec = codec;
    entry.ratio = double(encoded->size()) / rawBytes;
    entry.quality = relativeL2(decoded, kv);
    double attnError =
        relativeL2(sampleAttention(decoded, shape, queries), reference);
    KVC_ASSIGN_OR_RETURN(rates, timeCodec(objects, codec));
    entry.encodeGBs = rates.losslessEncodeGBs;
    entry.decodeGBs = rates.losslessDecodeGBs;
    entry.codecEncodeGBs = rates.encodeGBs;
    entry.codecDecodeGBs = rates.decodeGBs;
    std::string kl = "-", agree = "-";
    if (probe) {
      KVC_ASSIGN_OR_RETURN(quality, probe->measure(codec));
      entry.kl = quality.kl;
      entry.agreement = quality.agreement;
      kl = formatSignificant(quality.kl, 3);
      agree = formatSignificant(quality.agreement, 3);
    }
    std::printf("%-28s %8.3f %9.4f %9.4f %9s %6s %10.2f %10.2f",
                codec.str().c_str(), entry.ratio, entry.quality, attnError,
                kl.c_str(), agree.c_str(), rates.encodeGBs, rates.decodeGBs);
    if (codec.lossless != CodecSpec::Lossless::None)
      std::printf(" %10.2f %10.2f", entry.encodeGBs, entry.decodeGBs);
    std::printf("\n");
    std::fflush(stdout); // A row as it is measured, not all at the end.
    entries.push_back(entry);
  }
  std::ofstream out(outPath);
  out << planning::CodecProfile(entries).print();
  if (!out)
    return unavailable(outPath + ": cannot write profile");
  std::printf("wrote %zu entries to %s\n", entries.size(), outPath.c_str());
  return Status::ok();
}

} // namespace kvc
