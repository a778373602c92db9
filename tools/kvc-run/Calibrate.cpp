//===- Calibrate.cpp - kvc-run calibrate ----------------------------------===//

#include "Calibrate.h"
#include "Timing.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include "kvc/Planning/ComputeFit.h"
#include "kvc/Planning/CostModel.h"
#include "kvc/Runtime/Store/Tier.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kvc {

namespace {

StatusOr<double> tierReadGBs(const std::string &url) {
  auto tier = openTier(url);
  if (!tier)
    return tier.status();
  constexpr int kObjects = 32;
  constexpr size_t kBytes = size_t(1) << 20;
  std::string payload(kBytes, '\0');
  for (size_t i = 0; i < kBytes; ++i)
    payload[i] = char(i * 131 + 7);
  for (int i = 0; i < kObjects; ++i)
    KVC_RETURN_IF_ERROR(
        (*tier)->put("calibrate-" + std::to_string(i), payload));
  std::string buffer;
  Status status;
  double seconds = bestOf(3, [&] {
    for (int i = 0; i < kObjects && status.isOk(); ++i)
      status = (*tier)->get("calibrate-" + std::to_string(i), buffer);
  });
  KVC_RETURN_IF_ERROR(status);
  for (int i = 0; i < kObjects; ++i)
    (void)(*tier)->remove("calibrate-" + std::to_string(i));
  return double(kObjects * kBytes) / seconds / 1e9;
}

/// The chunk calibration measures attention with: the planner's smallest
/// (256 tokens), or less for short-context models.
int64_t referenceChunkTokens(const ModelConfig &config) {
  return std::min<int64_t>(256, config.maxPositions / 8);
}

/// `n` tokens of calibration's fixed prompt.
std::vector<int32_t> calibrationTokens(const ModelConfig &config, int64_t n) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i)
    tokens[i] = int32_t((i * 7919) % config.vocabSize);
  return tokens;
}

/// Seconds of one prefill of `chunk` tokens at `position` after `base`'s
/// first `position` tokens (copying the cache is not timed).
StatusOr<double> chunkSeconds(const LlamaModel &model,
                              const LlamaModel::Cache &base,
                              const std::vector<int32_t> &tokens,
                              int64_t position, int64_t chunk) {
  LlamaModel::Cache cache = base;
  cache.tokens = position;
  for (auto *kv : {&cache.k, &cache.v})
    for (std::vector<float> &layer : *kv)
      layer.resize(position * model.kvDim());
  auto start = std::chrono::steady_clock::now();
  KVC_RETURN_IF_ERROR(model.prefill(cache, tokens.data() + position, chunk));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace

StatusOr<ReferenceChunk> measureReferenceChunk(const LlamaModel &model,
                                               const TargetDesc &target) {
  const ModelConfig &config = model.config();
  ReferenceChunk out;
  out.tokens = referenceChunkTokens(config);
  std::vector<int32_t> tokens = calibrationTokens(config, out.tokens);
  std::vector<double> timings;
  for (int i = 0; i < 3; ++i) {
    KVC_ASSIGN_OR_RETURN(
        seconds, chunkSeconds(model, model.newCache(), tokens, 0, out.tokens));
    timings.push_back(seconds);
  }
  out.measuredSeconds = median(timings);
  planning::CostModel cost(config, target, planning::CodecProfile::defaults());
  out.predictedSeconds = cost.prefillSeconds(0, out.tokens, config.numLayers);
  return out;
}

StatusOr<TargetDesc> calibrate(const LlamaModel &model, TargetDesc target,
                               const std::string &scratchDir) {
  const ModelConfig &config = model.config();
  planning::CostModel cost(config, target, planning::CodecProfile::defaults());

  ComputeDesc &c = target.compute;
  c.kind = ComputeDesc::Kind::CPU;

  // Prefill: chunks of 16-512 tokens from position 0 (the GEMM efficiency
  // curve) and the reference chunk after longer and longer prefixes (its
  // attention), timed in interleaved rounds and each taken at its fastest
  // round; then fitted jointly (ComputeFit.h). The fastest, as `compare`
  // takes a plan's runs: on a shared machine a co-tenant slows the GEMMs
  // for seconds at a time (up to 2x here), and a median taken while that
  // lasts for half of the rounds would calibrate some chunks slow and
  // others fast — a fit off by 30% on this VM.
  const int64_t chunk = referenceChunkTokens(config);
  std::vector<planning::PrefillSample> samples;
  for (int64_t m : {16, 32, 64, 128, 256, 512})
    if (m <= config.maxPositions)
      samples.push_back({0, m, 0});
  for (int64_t p : {256, 512, 1024, 1536})
    if (p >= chunk && p + chunk <= config.maxPositions)
      samples.push_back({p, chunk, 0});
  int64_t prefix = 0, longest = 0;
  for (const planning::PrefillSample &s : samples) {
    prefix = std::max(prefix, s.position);
    longest = std::max(longest, s.position + s.tokens);
  }
  std::vector<int32_t> tokens = calibrationTokens(config, longest);
  LlamaModel::Cache base = model.newCache();
  KVC_RETURN_IF_ERROR(model.prefill(base, tokens.data(), prefix));
  constexpr int kRounds = 7;
  std::vector<std::vector<double>> timings(samples.size());
  for (int round = 0; round < kRounds; ++round)
    for (std::size_t i = 0; i < samples.size(); ++i) {
      KVC_ASSIGN_OR_RETURN(seconds, chunkSeconds(model, base, tokens,
                                                 samples[i].position,
                                                 samples[i].tokens));
      timings[i].push_back(seconds);
    }
  for (std::size_t i = 0; i < samples.size(); ++i)
    samples[i].seconds =
        *std::min_element(timings[i].begin(), timings[i].end());
  planning::ComputeFit fit = planning::fitComputeRates(cost, samples);
  fit.applyTo(c);
  planning::CostModel fitted(config, target,
                             planning::CodecProfile::defaults());
  std::printf("prefill, fastest of %d rounds:\n", kRounds);
  std::printf("%-16s %10s %12s %12s %6s\n", "prefill tokens", "after",
              "GFLOP/s", "measured ms", "fit");
  for (const planning::PrefillSample &s : samples) {
    double predicted = fitted.prefillSeconds(s.position, s.position + s.tokens,
                                             config.numLayers);
    std::printf(
        "%-16lld %10lld %12.2f %12.2f %+5.0f%%\n", (long long)s.tokens,
        (long long)s.position,
        cost.prefillFlops(s.position, s.position + s.tokens, config.numLayers) /
            s.seconds / 1e9,
        s.seconds * 1e3, (predicted / s.seconds - 1) * 100);
  }
  if (fit.attentionFlops > 0)
    std::printf("fit: GEMMs at %.2f GFLOP/s, half rate at %.0f tokens; "
                "attention at %.2f GFLOP/s; every chunk within %.0f%%\n",
                fit.denseFlops / 1e9, fit.halfTokens, fit.attentionFlops / 1e9,
                fit.worstError * 100);
  else
    std::printf("fit: GEMMs at %.2f GFLOP/s, half rate at %.0f tokens; "
                "attention priced as GEMMs (the chunks do not separate it); "
                "every chunk within %.0f%%\n",
                fit.denseFlops / 1e9, fit.halfTokens, fit.worstError * 100);

  // Copy bandwidth: memory and the (host-to-host) link.
  {
    std::vector<char> from(size_t(256) << 20, 1), to(from.size());
    double seconds =
        bestOf(3, [&] { std::memcpy(to.data(), from.data(), from.size()); });
    double gbs = double(from.size()) / seconds / 1e9;
    std::printf("copy bandwidth: %.2f GB/s\n", gbs);
    c.memGBs = gbs;
    target.link.h2dGBs = target.link.d2hGBs = gbs;
  }

  // Tiers.
  for (TierDesc &tier : target.tiers) {
    std::string url;
    if (tier.kind == TierDesc::Kind::DRAM)
      url = "mem://";
    else if (tier.kind == TierDesc::Kind::Disk)
      url = "file://" + scratchDir + "/kvc-calibrate-" + tier.name;
    if (url.empty()) {
      std::printf("tier %s: %.2f GB/s (kept: remote tiers are not measured)\n",
                  tier.name.c_str(), tier.readGBs);
      continue;
    }
    StatusOr<double> gbs = tierReadGBs(url);
    if (!gbs)
      return gbs.status().withContext("tier " + tier.name);
    tier.readGBs = *gbs;
    std::printf("tier %s (%s): %.2f GB/s read\n", tier.name.c_str(),
                url.c_str(), *gbs);
    if (tier.kind == TierDesc::Kind::Disk) {
      std::error_code ignored;
      std::filesystem::remove_all(scratchDir + "/kvc-calibrate-" + tier.name,
                                  ignored);
    }
  }
  // Codec stages, per core, on this model's KV: the lossless coders on its
  // int8-quantized bytes, quantization on the raw chunk.
  {
    const int64_t tokens = std::min<int64_t>(256, config.maxPositions);
    std::vector<int32_t> ids = calibrationTokens(config, tokens);
    LlamaModel::Cache cache = model.newCache();
    KVC_RETURN_IF_ERROR(model.prefill(cache, ids.data(), tokens));
    ChunkShape shape =
        chunkShape(config, ChunkForm::KV, tokens, 0, config.numLayers);
    std::vector<float> kv;
    for (int64_t l = 0; l < config.numLayers; ++l) {
      kv.insert(kv.end(), cache.k[l].begin(), cache.k[l].end());
      kv.insert(kv.end(), cache.v[l].begin(), cache.v[l].end());
    }
    const double rawBytes = double(shape.numel()) * dtypeBytes(config.dtype);
    auto rateOf = [&](CodecRateDesc::Stage stage) -> CodecRateDesc & {
      for (CodecRateDesc &rate : target.codecs)
        if (rate.stage == stage)
          return rate;
      target.codecs.push_back(CodecRateDesc{stage, 0, 0});
      return target.codecs.back();
    };
    CodecSpec int8;
    int8.quant = CodecSpec::Quant::Int8;
    StatusOr<std::string> quantized =
        encodeChunk(kv.data(), shape, int8, config.dtype);
    if (!quantized)
      return quantized.status();
    std::vector<uint16_t> decoded(shape.numel());
    CodecRateDesc &quant = rateOf(CodecRateDesc::Stage::Quant);
    quant.encodeGBs = rawBytes / timeIt([&] {
                        (void)encodeChunk(kv.data(), shape, int8, config.dtype);
                      }) / 1e9;
    quant.decodeGBs = rawBytes / timeIt([&] {
                        (void)decodeChunkToBf16(*quantized, shape, int8,
                                                config.dtype, decoded.data());
                      }) / 1e9;
    std::printf("codec quant (int8, decoded to bf16 as the CPU backend does): "
                "encode %.2f, decode %.2f GB/s per core\n",
                quant.encodeGBs, quant.decodeGBs);
    const std::pair<CodecRateDesc::Stage, CodecSpec::Lossless> coders[] = {
        {CodecRateDesc::Stage::Deflate, CodecSpec::Lossless::Deflate},
        {CodecRateDesc::Stage::Zstd, CodecSpec::Lossless::Zstd},
        {CodecRateDesc::Stage::Lz4, CodecSpec::Lossless::Lz4}};
    for (const auto &[stage, coder] : coders) {
      std::string packed, unpacked;
      double enc = timeIt([&] {
        StatusOr<std::string> out = compressBytes(*quantized, coder);
        if (out)
          packed = std::move(*out);
      });
      double dec = timeIt([&] {
        (void)decompressBytes(packed, coder, unpacked, quantized->size());
      });
      CodecRateDesc &rate = rateOf(stage);
      rate.encodeGBs = double(quantized->size()) / enc / 1e9;
      rate.decodeGBs = double(quantized->size()) / dec / 1e9;
      std::printf("codec %s: encode %.2f, decode %.2f GB/s per core\n",
                  codecStageName(stage), rate.encodeGBs, rate.decodeGBs);
    }
  }

  target.description = "calibrated by kvc-run calibrate from " + target.name;
  target.calibrated = true;
  target.name += "-calibrated";
  KVC_RETURN_IF_ERROR(target.validate());
  return target;
}

} // namespace kvc
