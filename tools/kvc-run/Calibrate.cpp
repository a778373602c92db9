//===- Calibrate.cpp - kvc-run calibrate ----------------------------------===//

#include "Calibrate.h"
#include "Timing.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include "kvc/Planning/CostModel.h"
#include "kvc/Runtime/Store/Tier.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kvc {

namespace {

/// Fits rate(m) = peak * m / (m + half) by least squares on
/// 1 / rate = 1 / peak + (half / peak) / m.
std::pair<double, double> fitRate(const std::vector<double> &rows,
                                  const std::vector<double> &rates) {
  double n = double(rows.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double x = 1.0 / rows[i], y = 1.0 / rates[i];
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  double intercept = (sy - slope * sx) / n;
  if (!(intercept > 0)) // Rates still rising at the largest chunk.
    return {*std::max_element(rates.begin(), rates.end()), 0.0};
  double peak = 1.0 / intercept;
  return {peak, std::max(0.0, slope * peak)};
}

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

/// Best of 3 prefills of `chunk` tokens at `position` after `base`'s
/// first `position` tokens.
StatusOr<double> chunkSeconds(const LlamaModel &model,
                              const LlamaModel::Cache &base,
                              const std::vector<int32_t> &tokens,
                              int64_t position, int64_t chunk) {
  Status status;
  double seconds = bestOf(3, [&] {
    LlamaModel::Cache cache = base;
    cache.tokens = position;
    for (auto *kv : {&cache.k, &cache.v})
      for (std::vector<float> &layer : *kv)
        layer.resize(position * model.kvDim());
    status = model.prefill(cache, tokens.data() + position, chunk);
  });
  KVC_RETURN_IF_ERROR(status);
  return seconds;
}

} // namespace

StatusOr<ReferenceChunk> measureReferenceChunk(const LlamaModel &model,
                                               const TargetDesc &target) {
  const ModelConfig &config = model.config();
  ReferenceChunk out;
  out.tokens = referenceChunkTokens(config);
  KVC_ASSIGN_OR_RETURN(seconds,
                       chunkSeconds(model, model.newCache(),
                                    calibrationTokens(config, out.tokens), 0,
                                    out.tokens));
  out.measuredSeconds = seconds;
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

  // Attention first: the same chunk at a long prefix and at none; the
  // difference in time is the extra attention work. The chunk is the
  // planner's smallest (256 tokens).
  const int64_t chunk = referenceChunkTokens(config);
  const int64_t prefix =
      std::min<int64_t>(1024, config.maxPositions - chunk);
  c.attentionTflops = 0;
  if (prefix >= 4 * chunk) {
    std::vector<int32_t> tokens = calibrationTokens(config, prefix + chunk);
    LlamaModel::Cache base = model.newCache();
    KVC_RETURN_IF_ERROR(model.prefill(base, tokens.data(), prefix));
    KVC_ASSIGN_OR_RETURN(late,
                         chunkSeconds(model, base, tokens, prefix, chunk));
    KVC_ASSIGN_OR_RETURN(early, chunkSeconds(model, base, tokens, 0, chunk));
    double extra = double(config.numLayers) *
                   (cost.attentionFlops(prefix, prefix + chunk) -
                    cost.attentionFlops(0, chunk));
    if (late > early) {
      c.attentionTflops = extra / (late - early) / (1e12 * c.restoreShare);
      std::printf("attention: %.2f GFLOP/s (a %lld-token chunk after %lld "
                  "tokens: %.2f ms, at 0: %.2f ms)\n",
                  c.attentionTflops * 1e3, (long long)chunk,
                  (long long)prefix, late * 1e3, early * 1e3);
    } else {
      std::printf("attention: not measurable (a chunk after %lld tokens was "
                  "no slower); priced as GEMMs\n",
                  (long long)prefix);
    }
  } else {
    std::printf("attention: priced as GEMMs (the model's context is too "
                "short to measure it)\n");
  }

  // Then the rate of everything else per chunk size: with attention
  // measured, its share of each chunk's time (the chunk's own causal
  // triangle, priced as the cost model will price it) is taken out first,
  // so that it is not counted twice — once in the dense rate, once on its
  // own (which overpredicted every computed chunk by ~6 ms here).
  std::vector<double> rows, rates;
  std::printf("%-28s %12s\n", "prefill chunk (tokens)", "GFLOP/s");
  for (int64_t m : {16, 32, 64, 128, 256, 512}) {
    if (m > config.maxPositions)
      break;
    std::vector<int32_t> tokens(m);
    for (int64_t i = 0; i < m; ++i)
      tokens[i] = int32_t((i * 7919) % config.vocabSize);
    Status status;
    double seconds = bestOf(3, [&] {
      LlamaModel::Cache cache = model.newCache();
      status = model.prefill(cache, tokens.data(), m);
    });
    KVC_RETURN_IF_ERROR(status);
    double flops = cost.prefillFlops(0, m, config.numLayers);
    if (c.attentionTflops > 0) {
      double attention = double(config.numLayers) * cost.attentionFlops(0, m);
      double attentionSeconds =
          attention / (c.attentionTflops * 1e12 * c.restoreShare);
      // Only where attention is the smaller share: a chunk timed faster than
      // its attention is priced (noise on tiny chunks) keeps its whole time.
      if (attentionSeconds < 0.5 * seconds) {
        flops -= attention;
        seconds -= attentionSeconds;
      }
    }
    double rate = flops / seconds;
    rows.push_back(double(m));
    rates.push_back(rate);
    std::printf("%-28lld %12.2f\n", (long long)m, rate / 1e9);
  }
  auto [peak, half] = fitRate(rows, rates);
  c.denseTflops = peak / (1e12 * c.gemmPeakFraction * c.restoreShare);
  c.gemmHalfTokens = half;
  std::printf("fit: peak %.2f GFLOP/s, half rate at %.0f tokens\n",
              peak / 1e9, half);

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
    std::vector<int32_t> ids(tokens);
    for (int64_t i = 0; i < tokens; ++i)
      ids[i] = int32_t((i * 7919) % config.vocabSize);
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
  target.name += "-calibrated";
  KVC_RETURN_IF_ERROR(target.validate());
  return target;
}

} // namespace kvc
