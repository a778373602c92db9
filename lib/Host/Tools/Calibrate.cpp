//===- Calibrate.cpp - kvc-run calibrate ----------------------------------===//

#include "kvc/Host/Tools/Calibrate.h"
#include "kvc/Host/Tools/CodecTiming.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/HostWorkers.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Device/TaskGraph.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include "kvc/Planning/ComputeFit.h"
#include "kvc/Planning/CostModel.h"
#include "kvc/Runtime/Store/Tier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace kvc {

namespace {

/// Read bandwidth of the store at `url`, as a restore reads it: objects of
/// a stored chunk's size (4 MiB: 256 tokens of 4 layers of 8 KV heads of
/// 128 in bf16) read one by one into a reused buffer, or, with `lanes` > 1,
/// by that many readers fetching batches of 8. A local store's probe reads
/// 256 MiB, more than a CPU's last-level cache holds (else it times the
/// cache); a remote store's 32 MiB a lane.
StatusOr<double> tierReadGBs(const std::string &url, bool remote,
                             int lanes = 1) {
  auto tier = openTier(url);
  if (!tier)
    return tier.status();
  constexpr size_t kBytes = size_t(4) << 20;
  const int objects = remote ? 8 * std::max(1, lanes) : 64;
  std::string payload(kBytes, '\0');
  for (size_t i = 0; i < kBytes; ++i)
    payload[i] = char(i * 131 + 7);
  std::vector<std::string> names;
  for (int i = 0; i < objects; ++i) {
    names.push_back("calibrate-" + std::to_string(i));
    KVC_RETURN_IF_ERROR((*tier)->put(names.back(), payload));
  }
  std::mutex failure;
  Status status;
  double seconds = bestOf(3, [&] {
    if (lanes <= 1) {
      std::string buffer;
      for (int i = 0; i < objects && status.isOk(); ++i)
        status = (*tier)->get(names[i], buffer);
      return;
    }
    std::atomic<int> next{0};
    std::vector<std::thread> readers;
    for (int l = 0; l < lanes; ++l)
      readers.emplace_back([&] {
        std::vector<std::string> batch, buffers;
        for (int first; (first = next.fetch_add(8)) < objects;) {
          batch.assign(names.begin() + first,
                       names.begin() + std::min(objects, first + 8));
          for (Status &read : (*tier)->getMany(batch, buffers))
            if (!read.isOk()) {
              std::lock_guard<std::mutex> lock(failure);
              status = read;
            }
        }
      });
    for (std::thread &reader : readers)
      reader.join();
  });
  KVC_RETURN_IF_ERROR(status);
  for (const std::string &name : names)
    (void)(*tier)->remove(name);
  return double(objects * kBytes) / seconds / 1e9;
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

/// GB/s of stored objects a restore's upload checks and copies out where
/// no decode step did (ChunkSteps::decodeElements): the model's layers (at
/// most 32) as one chunk of `tokens` tokens stored raw, an object a layer,
/// every object checked and copied at once on the host workers; the best of
/// 5 rounds.
StatusOr<double> measureUploadCheck(const ModelCompute &model, int64_t tokens) {
  const ModelConfig &config = model.config();
  ModelConfig shape = config;
  shape.numLayers = std::min<int64_t>(config.numLayers, 32);
  ChunkObjects objects(shape, model.fingerprint(), "", StoreLayout{tokens, 1});
  const std::vector<int32_t> prompt = calibrationTokens(config, tokens);
  const std::vector<ChunkRef> refs =
      objects.refs(prompt.data(), tokens, Form::KV, CodecSpec());
  std::vector<std::string> stored;
  std::vector<float> values;
  int64_t bytes = 0, words = 0;
  for (const ChunkRef &ref : refs) {
    values.resize(size_t(objects.shape(ref).numel()));
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = float(int64_t(i * 2654435761u % 2001) - 1000) * 1e-3f;
    KVC_ASSIGN_OR_RETURN(object, objects.encode(ref, values.data()));
    bytes += int64_t(object.size());
    words += objects.shape(ref).numel();
    stored.push_back(std::move(object));
  }
  std::vector<uint16_t> out(static_cast<size_t>(words));
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<Status> checked(refs.size(), Status::ok());
    Clock::time_point start = Clock::now();
    hostWorkers().forEach(refs.size(), [&](std::size_t o) {
      checked[o] = objects.decode(
          refs[o], stored[o],
          out.data() + int64_t(o) * objects.shape(refs[o]).numel());
    });
    const double seconds = secondsSince(start);
    for (const Status &status : checked)
      KVC_RETURN_IF_ERROR(status);
    best = std::max(best, double(bytes) / seconds / 1e9);
  }
  return best;
}

} // namespace

StatusOr<ReferenceChunk> measureReferenceChunk(Device &device,
                                               const ModelCompute &model,
                                               const TargetDesc &target) {
  const ModelConfig &config = model.config();
  ReferenceChunk out;
  out.tokens = referenceChunkTokens(config);
  std::vector<int32_t> tokens = calibrationTokens(config, out.tokens);
  std::vector<double> timings;
  std::unique_ptr<ModelRunner> runner = device.createRunner(model);
  for (int i = 0; i < 3; ++i) {
    KVC_ASSIGN_OR_RETURN(
        seconds, runner->timePrefill(model.newCache(), tokens, 0, out.tokens));
    timings.push_back(seconds);
  }
  out.measuredSeconds = median(timings);
  planning::CostModel cost(config, target, planning::CodecProfile::defaults());
  out.predictedSeconds = cost.prefillSeconds(0, out.tokens, config.numLayers);
  return out;
}

StatusOr<TargetDesc>
calibrate(Device &device, const ModelCompute &model, TargetDesc target,
          const std::string &scratchDir, std::FILE *log,
          const std::map<std::string, std::string> &remotes) {
  for (const auto &[name, url] : remotes)
    if (std::none_of(target.tiers.begin(), target.tiers.end(),
                     [&](const TierDesc &tier) {
                       return tier.name == name &&
                              tier.kind == TierDesc::Kind::Remote;
                     }))
      return invalidArgument("calibrate: the target has no remote tier " +
                             name);
  // Disk tiers are timed in a directory of this process's under scratchDir,
  // which must exist: two calibrations beside each other do not collide,
  // and a mistyped scratch is an error before anything is measured.
  std::error_code error;
  if (!std::filesystem::is_directory(scratchDir, error) ||
      ::access(scratchDir.c_str(), W_OK | X_OK) != 0)
    return invalidArgument("scratch " + scratchDir +
                           ": no writable directory");
  const std::string scratch =
      scratchDir + "/kvc-calibrate-" + std::to_string(::getpid()) + "-";

  const ModelConfig &config = model.config();
  planning::CostModel cost(config, target, planning::CodecProfile::defaults());

  ComputeDesc &c = target.compute;
  c.kind = ComputeDesc::Kind::CPU;
  c.chip.clear(); // What is measured is this CPU.

  // Prefill: chunks of 16-512 tokens from position 0 (the GEMM efficiency
  // curve) and the reference chunk after longer and longer prefixes (its
  // attention), timed in interleaved rounds and each taken at its fastest
  // round; then fitted jointly (ComputeFit.h). The fastest, as `compare`
  // takes a plan's runs: on a shared machine a co-tenant can slow the GEMMs
  // for seconds at a time (up to 2x, as measured in docs/results.md), and a
  // median taken while that lasts for half of the rounds would calibrate
  // some chunks slow and others fast (a fit off by 30% where it was seen).
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
  // The prefix the timed chunks attend over, prefilled by the device (an
  // 8B model's on the CPU would take longer than the calibration).
  std::unique_ptr<ModelRunner> runner = device.createRunner(model);
  ModelCompute::Cache base = model.newCache();
  if (prefix > 0) {
    KVC_ASSIGN_OR_RETURN(
        prefilled,
        fullPrefill(*runner, std::vector<int32_t>(tokens.begin(),
                                                  tokens.begin() + prefix)));
    base = std::move(prefilled);
  }
  constexpr int kRounds = 7;
  std::vector<std::vector<double>> timings(samples.size());
  for (int round = 0; round < kRounds; ++round)
    for (std::size_t i = 0; i < samples.size(); ++i) {
      KVC_ASSIGN_OR_RETURN(seconds, runner->timePrefill(base, tokens,
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
  std::fprintf(log, "prefill, fastest of %d rounds:\n", kRounds);
  std::fprintf(log, "%-16s %10s %12s %12s %6s\n", "prefill tokens", "after",
               "GFLOP/s", "measured ms", "fit");
  for (const planning::PrefillSample &s : samples) {
    double predicted = fitted.prefillSeconds(s.position, s.position + s.tokens,
                                             config.numLayers);
    std::fprintf(
        log, "%-16lld %10lld %12.2f %12.2f %+5.0f%%\n", (long long)s.tokens,
        (long long)s.position,
        cost.prefillFlops(s.position, s.position + s.tokens, config.numLayers) /
            s.seconds / 1e9,
        s.seconds * 1e3, (predicted / s.seconds - 1) * 100);
  }
  if (fit.attentionFlops > 0)
    std::fprintf(log,
                 "fit: GEMMs at %.2f GFLOP/s, half rate at %.0f tokens; "
                 "attention at %.2f GFLOP/s; every chunk within %.0f%%\n",
                 fit.denseFlops / 1e9, fit.halfTokens, fit.attentionFlops / 1e9,
                 fit.worstError * 100);
  else
    std::fprintf(log,
                 "fit: GEMMs at %.2f GFLOP/s, half rate at %.0f tokens; "
                 "attention priced as GEMMs (the chunks do not separate it); "
                 "every chunk within %.0f%%\n",
                 fit.denseFlops / 1e9, fit.halfTokens, fit.worstError * 100);

  // The device's upload bandwidth (its link) and its memory's (on the CPU
  // device both a host-to-host copy).
  {
    KVC_ASSIGN_OR_RETURN(link, device.uploadGBs());
    KVC_ASSIGN_OR_RETURN(memory, device.memoryGBs());
    std::fprintf(log,
                 "copy bandwidth: %.2f GB/s to the device, %.2f GB/s "
                 "within it\n",
                 link, memory);
    c.memGBs = memory;
    target.link.h2dGBs = target.link.d2hGBs = link;
    KVC_ASSIGN_OR_RETURN(
        check, measureUploadCheck(model, referenceChunkTokens(config)));
    target.host.checkGBs = check;
    std::fprintf(log,
                 "upload check: %.2f GB/s of stored objects checked and "
                 "copied out on %d host threads\n",
                 check, hostWorkers().workers() + 1);
  }

  // Hand-offs between lanes: a task released by a task on another resource
  // waits for that resource's idle worker to wake. Measured after 200 us of
  // idling, as long as a chunk's step keeps the other lanes waiting (tens
  // of microseconds on a VM whose idle vCPUs halt); the median of 7 chains.
  {
    KVC_ASSIGN_OR_RETURN(
        pools, device.createPools({{"handoff:a", 1}, {"handoff:b", 1}}));
    std::vector<double> handoffs;
    for (int round = 0; round < 7; ++round) {
      KVC_ASSIGN_OR_RETURN(seconds,
                           measureHandoff(*pools, "handoff:a", "handoff:b",
                                          200e-6, /*tasks=*/32));
      handoffs.push_back(seconds);
    }
    target.host.handoffUs = median(handoffs) * 1e6;
    std::fprintf(log, "hand-off between lanes: %.1f us\n",
                 target.host.handoffUs);
  }

  // Tiers.
  for (TierDesc &tier : target.tiers) {
    std::string url;
    int lanes = 1;
    if (tier.kind == TierDesc::Kind::DRAM) {
      url = "mem://";
    } else if (tier.kind == TierDesc::Kind::Disk) {
      url = "file://" + scratch + tier.name;
    } else if (auto remote = remotes.find(tier.name); remote != remotes.end()) {
      url = remote->second;
      lanes = std::max<int>(1, int(tier.lanes));
    }
    if (url.empty()) {
      std::fprintf(log,
                   "tier %s: %.2f GB/s (kept: no store given to measure)\n",
                   tier.name.c_str(), tier.readGBs);
      continue;
    }
    StatusOr<double> gbs =
        tierReadGBs(url, tier.kind == TierDesc::Kind::Remote, lanes);
    if (!gbs)
      return gbs.status().withContext("tier " + tier.name);
    tier.readGBs = *gbs;
    // A remote store's URL may hold credentials: not printed.
    std::fprintf(log, "tier %s (%s): %.2f GB/s read\n", tier.name.c_str(),
                 tier.kind == TierDesc::Kind::Remote ? "the store given"
                                                     : url.c_str(),
                 *gbs);
    if (tier.kind == TierDesc::Kind::Disk) {
      std::error_code ignored;
      std::filesystem::remove_all(scratch + tier.name, ignored);
    }
  }
  // Codec stages, per core, on this model's KV stored as a store holds it
  // (one object per layer of 256 tokens): each quantization, the
  // Hadamard transform, and each lossless coder on the data of each width
  // (what it codes decides its speed: near-random bytes go as stored blocks
  // or raw literals, quantized bytes with structure through entropy coding).
  {
    const int64_t tokens = std::min<int64_t>(256, config.maxPositions);
    std::vector<int32_t> ids = calibrationTokens(config, tokens);
    KVC_ASSIGN_OR_RETURN(cache, fullPrefill(*device.createRunner(model), ids));
    const KVObjects kv = kvObjects(model, cache, tokens);
    auto measure = [&](CodecStage stage, std::optional<CodecSpec::Quant> on,
                       const CodecSpec &codec) -> Status {
      KVC_ASSIGN_OR_RETURN(rates, timeCodec(kv, codec));
      CodecRateDesc measured{stage, on, rates.encodeGBs, rates.decodeGBs};
      if (codec.lossless != CodecSpec::Lossless::None)
        measured = {stage, on, rates.losslessEncodeGBs,
                    rates.losslessDecodeGBs};
      // A measured stage replaces every rate the base gave it.
      auto &codecs = target.codecs;
      codecs.erase(std::remove_if(codecs.begin(), codecs.end(),
                                  [&](const CodecRateDesc &rate) {
                                    return rate.stage == stage &&
                                           (!rate.on || rate.on == on);
                                  }),
                   codecs.end());
      codecs.push_back(measured);
      std::fprintf(log,
                   "codec %-8s on %-4s (as %s): encode %7.2f, decode %7.2f "
                   "GB/s per core\n",
                   name(stage), on ? codecDataName(*on) : "any",
                   codec.str().c_str(), measured.encodeGBs, measured.decodeGBs);
      return Status::ok();
    };
    // Every stage of the codec registry, under the rate key it names.
    std::vector<CodecSpec::Quant> data = {CodecSpec::Quant::None};
    for (const CodecStageInfo &stage : codecStages())
      if (stage.kind == StageKind::Quant)
        data.push_back(CodecSpec::Quant(stage.enumerator));
    for (const CodecStageInfo &stage : codecStages()) {
      CodecSpec codec;
      switch (stage.kind) {
      case StageKind::Transform:
        codec.transform = CodecSpec::Transform(stage.enumerator);
        KVC_RETURN_IF_ERROR(measure(stage.rate, std::nullopt, codec));
        break;
      case StageKind::Quant:
        codec.quant = CodecSpec::Quant(stage.enumerator);
        KVC_RETURN_IF_ERROR(measure(stage.rate, codec.quant, codec));
        break;
      case StageKind::Lossless:
        codec.lossless = CodecSpec::Lossless(stage.enumerator);
        for (CodecSpec::Quant on : data) {
          codec.quant = on;
          KVC_RETURN_IF_ERROR(measure(stage.rate, on, codec));
        }
        break;
      }
    }
  }

  target.description = "calibrated by kvc-run calibrate from " + target.name;
  target.calibrated = true;
  target.name += "-calibrated";
  KVC_RETURN_IF_ERROR(target.validate());
  return target;
}

} // namespace kvc
