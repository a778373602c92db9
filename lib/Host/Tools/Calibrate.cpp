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
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <unistd.h>

namespace kvc {

namespace {

/// Runs `work` again and again on a thread of its own, from construction to
/// destruction: the load a probe is measured beside. A restore's host side
/// runs its fetch, the upload's check and the copy to the device at once,
/// sharing the host's memory bandwidth (and, on a small machine, its
/// cores); each measured alone would price a restore at fast links as if
/// it had the host to itself.
class Beside {
public:
  explicit Beside(std::function<void()> work)
      : thread_([this, work = std::move(work)] {
          while (!stop_.load(std::memory_order_relaxed))
            work();
        }) {}
  ~Beside() {
    stop_ = true;
    thread_.join();
  }

private:
  std::atomic<bool> stop_{false};
  std::thread thread_; // Last: it starts once stop_ exists.
};

/// Runs `work` over items [0, count) on `lanes` threads side by side, each
/// taking the next `batch` items ([first, end), on lane `lane`) until none
/// are left, as a restore's fetch lanes take chunks; the last failure.
Status onLanes(int lanes, std::size_t count, std::size_t batch,
               const std::function<Status(std::size_t first, std::size_t end,
                                          int lane)> &work) {
  std::mutex failure;
  Status status;
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (int l = 0; l < lanes; ++l)
    threads.emplace_back([&, l] {
      for (std::size_t first; (first = next.fetch_add(batch)) < count;)
        if (Status done = work(first, std::min(count, first + batch), l);
            !done.isOk()) {
          std::lock_guard<std::mutex> lock(failure);
          status = done;
        }
    });
  for (std::thread &thread : threads)
    thread.join();
  return status;
}

/// The objects of calibration's stored KV: each of `refs` encoded from the
/// same fixed values (finite, spread over [-1, 1]).
StatusOr<std::vector<std::string>>
encodedKv(const ChunkObjects &objects, const std::vector<ChunkRef> &refs) {
  std::vector<std::string> encoded;
  std::vector<float> values;
  for (const ChunkRef &ref : refs) {
    values.resize(size_t(objects.shape(ref).numel()));
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = float(int64_t(i * 2654435761u % 2001) - 1000) * 1e-3f;
    KVC_ASSIGN_OR_RETURN(object, objects.encode(ref, values.data()));
    encoded.push_back(std::move(object));
  }
  return encoded;
}

/// Objects in a store, read as a restore reads them: objects of a stored
/// chunk's size (4 MiB: 256 tokens of 4 layers of 8 KV heads of 128 in
/// bf16) one by one into a reused buffer, or, with `lanes` > 1, by that many
/// readers fetching batches of 8. A local store's probe holds 256 MiB, more
/// than a CPU's last-level cache (else it times the cache); a remote
/// store's 32 MiB a lane. Removed with the probe.
class TierProbe {
public:
  static StatusOr<std::unique_ptr<TierProbe>> create(const std::string &url,
                                                     bool remote, int lanes) {
    KVC_ASSIGN_OR_RETURN(tier, openTier(url));
    auto probe = std::unique_ptr<TierProbe>(
        new TierProbe(std::move(tier), std::max(1, lanes)));
    const int objects = remote ? 8 * probe->lanes_ : 64;
    std::string payload(kBytes, '\0');
    for (size_t i = 0; i < kBytes; ++i)
      payload[i] = char(i * 131 + 7);
    for (int i = 0; i < objects; ++i) {
      probe->names_.push_back("calibrate-" + std::to_string(i));
      KVC_RETURN_IF_ERROR(probe->tier_->put(probe->names_.back(), payload));
    }
    if (probe->tier_->readsInPlace())
      probe->arena_.assign(probe->names_.size() * kBytes, '\0');
    return probe;
  }
  ~TierProbe() {
    for (const std::string &name : names_)
      (void)tier_->remove(name);
  }

  /// Reads every object once.
  Status readAll() {
    if (!arena_.empty()) {
      // Each object into a place of its own, as a restore reads into a
      // cache's rows or its staging: memory the reads did not just warm
      // (the arena is past a CPU's last-level cache), its pages faulted in;
      // `lanes` readers side by side, as a restore's fetch lanes.
      return onLanes(
          lanes_, names_.size(), 1,
          [&](std::size_t i, std::size_t, int) -> Status {
            KVC_ASSIGN_OR_RETURN(
                size,
                tier_->getInto(names_[i], {{&arena_[i * kBytes], kBytes}}));
            if (size != kBytes)
              return dataLoss("calibrate: " + names_[i] + " changed size");
            return Status::ok();
          });
    }
    if (lanes_ == 1) {
      std::string buffer;
      for (const std::string &name : names_)
        KVC_RETURN_IF_ERROR(tier_->get(name, buffer));
      return Status::ok();
    }
    // Pipelined batches of 8, as a remote store's readers fetch.
    return onLanes(
        lanes_, names_.size(), 8,
        [&](std::size_t first, std::size_t end, int) -> Status {
          std::vector<std::string> buffers;
          Status status;
          for (Status &read : tier_->getMany(
                   {names_.begin() + first, names_.begin() + end}, buffers))
            if (!read.isOk())
              status = read;
          return status;
        });
  }

  /// GB/s of reads: the best of 3 rounds.
  StatusOr<double> readGBs() {
    Status status;
    const double seconds = bestOf(3, [&] {
      if (status.isOk())
        status = readAll();
    });
    KVC_RETURN_IF_ERROR(status);
    return double(names_.size() * kBytes) / seconds / 1e9;
  }

private:
  static constexpr size_t kBytes = size_t(4) << 20;

  TierProbe(std::unique_ptr<Tier> tier, int lanes)
      : tier_(std::move(tier)), lanes_(lanes) {}

  std::unique_ptr<Tier> tier_;
  int lanes_;
  std::vector<std::string> names_;
  /// Where a tier that reads in place reads each object (readAll).
  std::string arena_;
};

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

/// A restore's upload where no decode step ran before it
/// (ChunkSteps::decodeElements): the model's layers (at most 32) as one
/// chunk of `tokens` tokens stored raw, an object a layer, every object
/// checked at once on the host workers where a file or memory tier read it
/// in place (ChunkObjects::checkInPlace, the model's KV in bf16 as the
/// cache holds it), or checked and copied out into the device's host
/// memory (a model of another dtype, converted), then copied to the
/// device.
class UploadProbe {
public:
  static StatusOr<std::unique_ptr<UploadProbe>>
  create(const ModelCompute &model, int64_t tokens, Device &device) {
    const ModelConfig &config = model.config();
    ModelConfig shape = config;
    shape.numLayers = std::min<int64_t>(config.numLayers, 32);
    auto probe = std::unique_ptr<UploadProbe>(new UploadProbe(
        ChunkObjects(shape, model.fingerprint(), "", StoreLayout{tokens, 1})));
    const std::vector<int32_t> prompt = calibrationTokens(config, tokens);
    probe->refs_ =
        probe->objects_.refs(prompt.data(), tokens, Form::KV, CodecSpec());
    KVC_ASSIGN_OR_RETURN(stored, encodedKv(probe->objects_, probe->refs_));
    probe->stored_ = std::move(stored);
    int64_t words = 0;
    for (std::size_t o = 0; o < probe->refs_.size(); ++o) {
      probe->bytes_ += int64_t(probe->stored_[o].size());
      words += probe->objects_.shape(probe->refs_[o]).numel();
    }
    probe->out_ = HostWords(device.hostMemory());
    probe->out_.resize(size_t(words));
    probe->inPlace_ = config.dtype == DType::BF16;
    if (probe->inPlace_)
      for (std::size_t o = 0; o < probe->refs_.size(); ++o) {
        // As a read in place leaves it: the payload at its place.
        std::string &object = probe->stored_[o];
        std::memcpy(probe->at(o), object.data() + kChunkHeaderBytes,
                    object.size() - kChunkHeaderBytes);
        object.resize(kChunkHeaderBytes);
      }
    return probe;
  }

  /// Checks every object once, in place or copying it out.
  Status check() {
    std::vector<Status> checked(refs_.size(), Status::ok());
    hostWorkers().forEach(refs_.size(), [&](std::size_t o) {
      const int64_t numel = objects_.shape(refs_[o]).numel();
      checked[o] =
          inPlace_
              ? objects_.checkInPlace(
                    refs_[o], stored_[o],
                    {std::string_view(reinterpret_cast<const char *>(at(o)),
                                      std::size_t(numel) * sizeof(uint16_t))})
              : objects_.decode(refs_[o], stored_[o], at(o));
    });
    for (const Status &status : checked)
      KVC_RETURN_IF_ERROR(status);
    return Status::ok();
  }

  /// GB/s of stored objects checked and copied out: the best of 5 rounds.
  StatusOr<double> checkGBs() {
    double best = 0;
    for (int round = 0; round < 5; ++round) {
      Clock::time_point start = Clock::now();
      KVC_RETURN_IF_ERROR(check());
      best = std::max(best, double(bytes_) / secondsSince(start) / 1e9);
    }
    return best;
  }

  /// One upload of the chunk: checked, then copied to `device`.
  Status upload(Device &device, DeviceBuffer &into) {
    KVC_RETURN_IF_ERROR(check());
    return device.upload(out_, /*consume=*/false, into);
  }

private:
  explicit UploadProbe(ChunkObjects objects) : objects_(std::move(objects)) {}

  /// Object `o`'s place in the chunk: its layer's K and V.
  uint16_t *at(std::size_t o) {
    return out_.data() + int64_t(o) * objects_.shape(refs_[o]).numel();
  }

  ChunkObjects objects_;
  std::vector<ChunkRef> refs_;
  /// Each object; only its header when the payload was read in place.
  std::vector<std::string> stored_;
  HostWords out_; ///< In the device's host memory, as a restore's slots.
  int64_t bytes_ = 0;
  bool inPlace_ = false;
};

/// A restore's fetch of raw K and V into a CPU's cache
/// (ChunkSteps::fetchIntoCache): the model's KV (at most 32 layers) stored
/// raw in a tier that reads in place, an object a layer of `tokens` tokens,
/// copies of them past a CPU's last-level cache (256 MiB), read by `lanes`
/// threads side by side, each object into a place of its own and checked
/// there as it lands (ChunkObjects::checkInPlace). What a lane spends on
/// the checks, per byte, is what the cost model adds to its reads
/// (host.read_check_gbs).
class ReadCheckProbe {
public:
  static StatusOr<std::unique_ptr<ReadCheckProbe>>
  create(const std::string &url, const ModelCompute &model, int64_t tokens,
         int lanes) {
    KVC_ASSIGN_OR_RETURN(tier, openTier(url));
    ModelConfig shape = model.config();
    shape.numLayers = std::min<int64_t>(shape.numLayers, 32);
    auto probe = std::unique_ptr<ReadCheckProbe>(new ReadCheckProbe(
        std::move(tier),
        ChunkObjects(shape, model.fingerprint(), "", StoreLayout{tokens, 1}),
        std::max(1, lanes)));
    const std::vector<int32_t> prompt = calibrationTokens(shape, tokens);
    const std::vector<ChunkRef> refs =
        probe->objects_.refs(prompt.data(), tokens, Form::KV, CodecSpec());
    KVC_ASSIGN_OR_RETURN(stored, encodedKv(probe->objects_, refs));
    size_t bytes = 0;
    for (const std::string &object : stored)
      bytes += object.size();
    const size_t copies = std::max<size_t>(1, (size_t(256) << 20) / bytes);
    size_t at = 0;
    for (size_t i = 0; i < copies * refs.size(); ++i) {
      const std::string &object = stored[i % refs.size()];
      Object o{"calibrate-check-" + std::to_string(i), refs[i % refs.size()],
               at, object.size() - kChunkHeaderBytes};
      KVC_RETURN_IF_ERROR(probe->tier_->put(o.name, object));
      probe->checked_ += o.payload;
      at += o.payload;
      probe->stored_.push_back(std::move(o));
    }
    probe->arena_.assign(at, '\0');
    return probe;
  }
  ~ReadCheckProbe() {
    for (const Object &o : stored_)
      (void)tier_->remove(o.name);
  }

  /// GB/s a lane checks: the bytes checked over the seconds the lanes
  /// spent checking them, the best of 3 rounds of reading every object.
  StatusOr<double> checkGBs() {
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      // Per lane: its header buffer and the seconds it spent checking.
      std::vector<std::string> headers(size_t(lanes_),
                                       std::string(kChunkHeaderBytes, '\0'));
      std::vector<double> checking(size_t(lanes_), 0.0);
      KVC_RETURN_IF_ERROR(onLanes(
          lanes_, stored_.size(), 1, [&](std::size_t i, std::size_t, int lane) {
            return readAndCheck(stored_[i], headers[size_t(lane)],
                                checking[size_t(lane)]);
          }));
      best = std::max(
          best, double(checked_) /
                    std::accumulate(checking.begin(), checking.end(), 0.0) /
                    1e9);
    }
    return best;
  }

private:
  struct Object {
    std::string name;
    ChunkRef ref;
    size_t at = 0, payload = 0; ///< Its payload's place in the arena.
  };

  ReadCheckProbe(std::unique_ptr<Tier> tier, ChunkObjects objects, int lanes)
      : tier_(std::move(tier)), objects_(std::move(objects)), lanes_(lanes) {}

  /// What the fetch does with one object: read, then checked where it
  /// landed, the check's time added to `seconds`.
  Status readAndCheck(const Object &o, std::string &header, double &seconds) {
    char *payload = &arena_[o.at];
    KVC_ASSIGN_OR_RETURN(size,
                         tier_->getInto(o.name, {{header.data(), header.size()},
                                                 {payload, o.payload}}));
    if (size != header.size() + o.payload)
      return dataLoss("calibrate: " + o.name + " changed size");
    Clock::time_point start = Clock::now();
    KVC_RETURN_IF_ERROR(objects_.checkInPlace(
        o.ref, header, {std::string_view(payload, o.payload)}));
    seconds += secondsSince(start);
    return Status::ok();
  }

  std::unique_ptr<Tier> tier_;
  ChunkObjects objects_;
  int lanes_;
  std::vector<Object> stored_;
  std::string arena_;
  size_t checked_ = 0;
};

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

  // What is measured is this device's compute: a CPU's (whose cache is
  // host memory) is one whatever the target said; a GPU keeps its chip,
  // whose kernels the plans generate, and its peak (ComputeFit::applyTo).
  ComputeDesc &c = target.compute;
  {
    KVC_ASSIGN_OR_RETURN(probe, device.cacheFor(config, 16));
    if (probe.first->memory() == CacheMemory::Host) {
      c.kind = ComputeDesc::Kind::CPU;
      c.chip.clear();
    }
  }

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
  KVC_RETURN_IF_ERROR(fit.applyTo(c));
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

  // The host side of a restore: the copy to the device (its link), the
  // upload's check of stored objects, and (below) each local tier's reads,
  // each measured alone and beside the others, as a restore runs them; the
  // target holds what they do beside each other. The store read beside the
  // uploads is the first disk tier's kind, else DRAM.
  std::string besideUrl = "mem://";
  for (const TierDesc &tier : target.tiers)
    if (tier.kind == TierDesc::Kind::Disk) {
      besideUrl = "file://" + scratch + "beside";
      break;
    }
  KVC_ASSIGN_OR_RETURN(
      uploads,
      UploadProbe::create(model, referenceChunkTokens(config), device));
  {
    KVC_ASSIGN_OR_RETURN(reads, TierProbe::create(besideUrl, false, 1));
    KVC_ASSIGN_OR_RETURN(link, device.uploadGBs());
    KVC_ASSIGN_OR_RETURN(memory, device.memoryGBs());
    KVC_ASSIGN_OR_RETURN(check, uploads->checkGBs());
    StatusOr<double> linkBeside = 0.0, checkBeside = 0.0;
    {
      Beside fetching([&] { (void)reads->readAll(); });
      linkBeside = device.uploadGBs();
      if (linkBeside.isOk())
        checkBeside = uploads->checkGBs();
    }
    KVC_RETURN_IF_ERROR(linkBeside.status());
    KVC_RETURN_IF_ERROR(checkBeside.status());
    std::fprintf(log,
                 "copy bandwidth: %.2f GB/s to the device (%.2f GB/s beside a "
                 "store's reads), %.2f GB/s within it\n",
                 link, *linkBeside, memory);
    c.memGBs = memory;
    target.link.h2dGBs = *linkBeside;
    target.link.d2hGBs = link; // A save's copies: not measured beside.
    target.host.checkGBs = *checkBeside;
    std::fprintf(log,
                 "upload check: %.2f GB/s of stored objects checked %s on "
                 "%d host threads (%.2f GB/s beside a store's reads)\n",
                 check,
                 config.dtype == DType::BF16 ? "where they were read"
                                             : "and copied out",
                 hostWorkers().workers() + 1, *checkBeside);
  }
  std::error_code ignored;
  std::filesystem::remove_all(scratch + "beside", ignored);

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

  // The check a fetch lane runs on raw K and V it has read into a CPU's
  // cache (the model's in bf16, as the cache holds them): on the lanes of
  // the first disk tier, else of the memory tier.
  if (target.compute.kind == ComputeDesc::Kind::CPU &&
      config.dtype == DType::BF16) {
    auto firstOf = [&](TierDesc::Kind kind) -> const TierDesc * {
      for (const TierDesc &tier : target.tiers)
        if (tier.kind == kind)
          return &tier;
      return nullptr;
    };
    const TierDesc *local = firstOf(TierDesc::Kind::Disk);
    if (!local)
      local = firstOf(TierDesc::Kind::DRAM);
    if (local) {
      const std::string url = local->kind == TierDesc::Kind::Disk
                                  ? "file://" + scratch + "read-check"
                                  : "mem://";
      StatusOr<double> rate = 0.0;
      {
        auto probe = ReadCheckProbe::create(
            url, model, referenceChunkTokens(config), int(local->lanes));
        if (!probe)
          return probe.status().withContext("read check");
        rate = (*probe)->checkGBs();
      }
      std::filesystem::remove_all(scratch + "read-check", ignored);
      KVC_RETURN_IF_ERROR(rate.status().withContext("read check"));
      target.host.readCheckGBs = *rate;
      std::fprintf(log,
                   "read check: %.2f GB/s a lane of K and V it read into the "
                   "cache, on tier %s's %lld lanes\n",
                   *rate, local->name.c_str(), (long long)local->lanes);
    }
  }

  // Tiers: a local one's reads alone and beside a restore's uploads, on
  // its lanes.
  {
    std::unique_ptr<DeviceBuffer> uploaded = device.allocate();
    for (TierDesc &tier : target.tiers) {
      std::string url;
      const int lanes = std::max<int>(1, int(tier.lanes));
      const bool remote = tier.kind == TierDesc::Kind::Remote;
      if (tier.kind == TierDesc::Kind::DRAM) {
        url = "mem://";
      } else if (tier.kind == TierDesc::Kind::Disk) {
        url = "file://" + scratch + tier.name;
      } else if (auto given = remotes.find(tier.name); given != remotes.end()) {
        url = given->second;
      }
      if (url.empty()) {
        std::fprintf(log,
                     "tier %s: %.2f GB/s (kept: no store given to measure)\n",
                     tier.name.c_str(), tier.readGBs);
        continue;
      }
      StatusOr<double> alone = 0.0, beside = 0.0;
      {
        auto probe = TierProbe::create(url, remote, lanes);
        if (!probe)
          return probe.status().withContext("tier " + tier.name);
        alone = (*probe)->readGBs();
        if (alone.isOk() && !remote) {
          Beside uploading([&] { (void)uploads->upload(device, *uploaded); });
          beside = (*probe)->readGBs();
        }
      }
      if (tier.kind == TierDesc::Kind::Disk)
        std::filesystem::remove_all(scratch + tier.name, ignored);
      KVC_RETURN_IF_ERROR(alone.status().withContext("tier " + tier.name));
      KVC_RETURN_IF_ERROR(beside.status().withContext("tier " + tier.name));
      // A remote store's URL may hold credentials: not printed. Its reads
      // cross the network, not this host's memory: measured alone.
      if (remote) {
        tier.readGBs = *alone;
        std::fprintf(log, "tier %s (the store given): %.2f GB/s read\n",
                     tier.name.c_str(), *alone);
      } else {
        // A CPU's restore uploads nothing beside its reads (K and V are
        // read into its cache, an upload of staging is a swap): alone.
        const bool cpu = target.compute.kind == ComputeDesc::Kind::CPU;
        tier.readGBs = cpu ? *alone : *beside;
        std::fprintf(log,
                     "tier %s (%s): %.2f GB/s read (%.2f GB/s beside a "
                     "restore's uploads%s)\n",
                     tier.name.c_str(), url.c_str(), *alone, *beside,
                     cpu ? ", which a CPU's restore does not run" : "");
      }
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
