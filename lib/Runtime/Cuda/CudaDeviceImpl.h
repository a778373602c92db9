//===- CudaDeviceImpl.h - The CUDA backend's device -------------*- C++ -*-===//
//
// Private to lib/Runtime/Cuda: the device class and the pieces of device
// memory it hands out, shared by its files: CudaDevice.cpp (memory, lanes,
// events, copies, scatters, calibration probes), CudaLaunch.cpp (generated
// kernels: loading PTX, checking and launching restores, saves and
// projections) and CudaRunner.cpp (the model's work: projections, prefills,
// decode steps, timed prefills, and the ModelRunner over them).
//
// Lanes come from a free list and go back after each call: a thread's next
// call takes the lane its last had (its work queues there in order), another
// thread's one with nothing left to run, so there are about as many streams
// as threads that call the device at once. Calls are ordered by events, not
// by waiting on the host: a chunk's buffer holds events after its last
// write and read (an upload waits on the device for the scatter of the
// chunk before it), and each cache an event per lane after its last write
// there, which calls reading the cache on another lane wait for (attention
// over scattered rows, a save kernel, a read back). A call returns once its
// work is enqueued, except where the host needs it done: an upload (the
// caller reuses its host memory), results copied to the host, writes into
// an f16 cache (the lane reports values beyond its range), and settle. Per-call
// device memory (block tables, activations) comes from CUDA's stream-ordered
// pool, whose release threshold is raised so that freed memory stays pooled
// instead of going back to the driver at each synchronization.
//
// Generated restore kernels (a plan bundle's PTX) are loaded with the
// driver API on first launch, one module per distinct PTX text, in the
// primary context the runtime API uses, and launched on the call's lane;
// modules live as long as the device.
//
// The model's work (CudaRunner) runs on the device's lanes, with the
// model's weights in device memory (CudaModel.h) uploaded on a runner's
// first call and kept, per model, while the device lives.
//
// Host memory (hostMemory) is pinned, kept once given back: a restore's
// staging slots decode chunks into it and the upload is the DMA alone. An
// upload from other host memory (pageable) copies the chunk into the lane's
// pinned staging in pieces, alternating two halves, so that the copy of one
// piece overlaps the DMA of the one before; each piece is copied by several
// threads at once (hostWorkers(), which a restore's host decode shares: one
// thread copies at a fraction of the host's memory bandwidth).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_CUDA_CUDADEVICEIMPL_H
#define KVC_LIB_RUNTIME_CUDA_CUDADEVICEIMPL_H

#include "kvc/Runtime/Cuda/CudaDevice.h"

#include "CudaModel.h"
#include "CudaSupport.h"
#include "Kernels.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/HostWorkers.h"
#include "kvc/Runtime/Cuda/CudaDriver.h"
#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

namespace kvc::cuda {

/// A chunk in device memory, and the events that order the calls using it
/// on different lanes: its last write (an upload, a projection) and its
/// last read (a scatter, a generated kernel). Calls on one buffer come one
/// after another from the host (the executor hands a chunk on); only their
/// work on the device overlaps.
class CudaBuffer final : public DeviceBuffer {
public:
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer &) = delete;
  CudaBuffer &operator=(const CudaBuffer &) = delete;
  ~CudaBuffer() override {
    retire();
    for (cudaEvent_t event : {written_, read_})
      if (event)
        cudaEventDestroy(event);
  }
  int64_t bytes() const override { return int64_t(memory.bytes()); }

  /// Makes it hold at least `bytes`; memory it gives up is freed once the
  /// calls using it are done.
  Status reserve(size_t bytes) {
    if (bytes > memory.bytes())
      retire();
    return memory.reserve(bytes);
  }
  /// Orders `lane` after the last write (a call that reads the buffer).
  Status readOn(cudaStream_t lane) const { return after(written_, lane); }
  /// Orders `lane` after the last read and write (a call that writes it).
  Status writeOn(cudaStream_t lane) const {
    KVC_RETURN_IF_ERROR(after(read_, lane));
    return after(written_, lane);
  }
  /// What `lane` enqueued so far reads (or writes) the buffer.
  Status readBy(cudaStream_t lane) const { return record(read_, lane); }
  Status writtenBy(cudaStream_t lane) const { return record(written_, lane); }

  DeviceArray memory;
  int64_t words = 0; ///< 16-bit words it holds.

private:
  static Status after(cudaEvent_t event, cudaStream_t lane) {
    if (!event)
      return Status::ok();
    return cudaStatus(cudaStreamWaitEvent(lane, event, 0),
                      "ordering a chunk's calls");
  }
  static Status record(cudaEvent_t &event, cudaStream_t lane) {
    if (!event)
      KVC_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
          "creating a chunk's event");
    return cudaStatus(cudaEventRecord(event, lane), "ordering a chunk's calls");
  }
  /// Frees of the memory (on the release stream) wait for its users; where
  /// the stream cannot be made to wait, the host waits, and where that
  /// fails too the memory is abandoned, never freed under a reader.
  void retire() {
    for (cudaEvent_t event : {written_, read_}) {
      if (!event || !memory.get() ||
          cudaStreamWaitEvent(DeviceArray::releaseStream(), event, 0) ==
              cudaSuccess)
        continue;
      (void)cudaGetLastError();
      if (cudaEventSynchronize(event) != cudaSuccess) {
        (void)cudaGetLastError();
        memory.abandon();
      }
    }
  }

  mutable cudaEvent_t written_ = nullptr, read_ = nullptr;
};

inline const CudaBuffer &bufferOf(const DeviceBuffer &buffer) {
  return static_cast<const CudaBuffer &>(buffer);
}
inline CudaBuffer &bufferOf(DeviceBuffer &buffer) {
  return static_cast<CudaBuffer &>(buffer);
}

/// Bytes of pinned staging per half of a lane's: large enough that a
/// piece's DMA outlasts the launch of the next.
inline constexpr size_t kPinnedHalf = size_t(8) << 20;

/// Pinned host memory, kept when given back (KeptHostMemory): pinning is a
/// system call per block, which a restore's staging slots would otherwise
/// pay per restore.
class PinnedMemory final : public KeptHostMemory {
public:
  /// Pinned in the context of `device` (and usable in every other).
  explicit PinnedMemory(int device) : device_(device) {}
  ~PinnedMemory() override { disposeKept(); }

protected:
  void *obtain(size_t bytes) override {
    void *block = nullptr;
    cudaError_t error = cudaSetDevice(device_);
    if (error == cudaSuccess)
      error = cudaHostAlloc(&block, bytes, cudaHostAllocPortable);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      // The caller falls back to the heap, whose copies to the device run
      // at a fraction of a pinned buffer's: said once a process.
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "kvc: warning: cuda backend: cannot pin %zu bytes of "
                     "host memory (%s); staging falls back to pageable "
                     "memory, whose uploads are slower\n",
                     bytes, cudaGetErrorString(error));
      });
      return nullptr;
    }
    return block;
  }
  void dispose(void *block, size_t) override { cudaFreeHost(block); }

private:
  int device_;
};

inline Status needDevice(const PagedKVCache &cache) {
  if (cache.memory() != CacheMemory::Device)
    return failedPrecondition(
        "cuda backend: the paged cache is in host memory (create "
        "it with the backend, or view device memory)");
  if (cache.config().dtype != DType::BF16 && cache.config().dtype != DType::F16)
    return unimplemented(std::string("cuda backend: a paged cache of ") +
                         dtypeName(cache.config().dtype) +
                         " (its kernels write bf16 or f16)");
  return Status::ok();
}

/// Words of mapped pinned memory that callers' streams wait on
/// (cuStreamWaitValue32 until a word is 1), each reused once its signal is
/// gone and its stream has passed the wait (an event recorded after it).
/// Before the first wait a probe checks on a stream of its own that a wait
/// holds until the host writes its word and then passes: where the GPU
/// does not see the host's writes (an H200 machine's streams never passed,
/// 2026-11-29), every wait is Unimplemented and the caller waits on the
/// host instead of a server's stream hanging.
class WaitWords {
public:
  static constexpr int kWords = 1024;

  ~WaitWords() {
    // Process teardown: a static device's words outlive every stream.
    for (cudaEvent_t event : passed_)
      if (event)
        cudaEventDestroy(event);
  }

  /// A stream wait on `stream` until the returned signal is raised.
  StatusOr<std::shared_ptr<StreamSignal>> wait(const CudaDriver &driver,
                                               CUstream stream);

private:
  class Signal;

  /// The words mapped and probed, once; the probe's verdict after.
  Status start(const CudaDriver &driver);
  /// Whether a stream's wait on word 0 holds until the host raises it and
  /// then passes (within a second).
  Status probe(const CudaDriver &driver);

  std::mutex mutex_;
  std::optional<Status> started_;
  volatile uint32_t *host_ = nullptr;
  CUdeviceptr device_ = 0;
  std::vector<cudaEvent_t> passed_;
  std::vector<bool> held_, waited_;
};

class WaitWords::Signal final : public StreamSignal {
public:
  Signal(WaitWords &words, int index) : words_(words), index_(index) {}
  ~Signal() override {
    raise();
    std::lock_guard<std::mutex> lock(words_.mutex_);
    words_.held_[index_] = false;
  }
  void raise() override {
    __atomic_store_n(words_.host_ + index_, 1u, __ATOMIC_RELEASE);
  }

private:
  WaitWords &words_;
  int index_;
};

class CudaRunner;

class CudaDevice final : public Device {
  friend class CudaRunner; // Finds the model's weights (modelFor).

public:
  explicit CudaDevice(const CudaDeviceOptions &options)
      : options_(options), pinned_(options.device) {}
  ~CudaDevice() override {
    for (const auto &[name, loaded] : functions_)
      for (const LoadedKernel &kernel : loaded)
        driver_->cuModuleUnload(kernel.module);
    for (const KeptSpan &span : spans_) {
      cudaEventDestroy(span.start);
      cudaEventDestroy(span.end);
    }
    if (spanBase_)
      cudaEventDestroy(spanBase_);
    for (const auto &[cache, events] : writes_)
      for (cudaEvent_t event : events)
        if (event)
          cudaEventDestroy(event);
  }

  const char *name() const override { return "cuda"; }

  StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) override;

  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override;

  std::unique_ptr<DeviceBuffer> allocate() override;

  HostMemory *hostMemory() override { return &pinned_; }

  Status upload(HostWords &host, bool /*consume*/, DeviceBuffer &to) override;

  /// Pageable `host` into `to` through the lane's pinned halves, the copy
  /// into one overlapping the DMA from the other.
  Status copyThroughStaging(Lane &lane, const HostWords &host, CudaBuffer &to);

  StatusOr<double> project(const ModelCompute &model, const CudaModel &gpu,
                           const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv);

  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override;

  bool launchesKernels() const override { return true; }

  /// The driver loads PTX (cuModuleLoadData), no other format.
  static Status loads(const BundleKernel &kernel);

  Status canLaunch(const BundleKernel &kernel,
                   const PagedKVCache &cache) const override;

  Status canLaunchSave(const BundleKernel &kernel,
                       const PagedKVCache &cache) const override;

  Status launchSave(const BundleKernel &kernel, const PagedKVCache &cache,
                    const BlockTable &table, const std::vector<ChunkBox> &boxes,
                    std::vector<std::string> &payloads) override;

  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue, const ModelConfig &c,
                          bool bf16Gemms, const PagedKVCache &cache) const;

  StatusOr<double>
  launchProject(const BundleKernel &prologue, const BundleKernel &epilogue,
                const ModelCompute &model, const CudaModel &gpu,
                const DeviceBuffer &hidden, DType dtype, const ChunkBox &box,
                PagedKVCache &cache, const BlockTable &table);

  Status launchRestore(const BundleKernel &kernel,
                       const std::vector<RestoreChunk> &chunks,
                       PagedKVCache &cache, const BlockTable &table) override;

  Status prefillInto(const ModelCompute &model, const CudaModel &gpu,
                     PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const ModelRunner::LayerWritten &written);

  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, const CudaModel &gpu,
                int64_t tokens);

  Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                  PagedKVCache &to, const BlockTable &toTable, int64_t layer,
                  int64_t first, int64_t n) override;

  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override;

  Status decode(const ModelCompute &model, const CudaModel &gpu,
                PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const ModelRunner::LayerGate &attend);

  StatusOr<double> timePrefill(const ModelCompute &model, const CudaModel &gpu,
                               const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n);

  Status settle(const PagedKVCache &cache) override;

  StatusOr<std::shared_ptr<StreamSignal>> streamWait(void *stream) override;

  /// What a restore's upload does: from the device's host memory, where
  /// its staging slots decode chunks.
  StatusOr<double> uploadGBs() override;

  /// A device-to-device copy of 256 MiB: its bytes read and written.
  StatusOr<double> memoryGBs() override;

  std::unique_ptr<ModelRunner> createRunner(const ModelCompute &model) override;

  /// A model over `weights` the caller holds on this device.
  StatusOr<std::unique_ptr<CudaModel>>
  borrowWeights(const ModelConfig &config, const CudaLlamaWeights &weights);

  Status start();

private:
  /// A lane for one call, back to the free list when it goes.
  struct LaneLease {
    CudaDevice *backend = nullptr;
    std::unique_ptr<Lane> lane;
    LaneLease(CudaDevice *backend, std::unique_ptr<Lane> lane)
        : backend(backend), lane(std::move(lane)) {}
    LaneLease(LaneLease &&) = default;
    ~LaneLease() {
      if (lane) {
        std::lock_guard<std::mutex> lock(backend->mutex_);
        backend->lanes_.push_back(std::move(lane));
      }
    }
    Lane &operator*() { return *lane; }
  };

  /// A free lane of `use` for the calling thread: the one its last call of
  /// that use had, where its work queues in order, else one with nothing
  /// left to run, else a new one. Calls return before their work is done,
  /// so a free lane may still be running another thread's: an upload
  /// queued behind it would wait for it.
  StatusOr<LaneLease> acquire(LaneUse use = LaneUse::Load);

  /// `lane`'s work from construction to destruction as a device span,
  /// while spans are kept (keepSpans): events recorded on its stream
  /// before and after what the call enqueues.
  class Span {
  public:
    Span(CudaDevice &device, const Lane &lane, const char *name)
        : device_(device), lane_(lane), name_(name) {
      // Every call makes one: no lock unless spans are kept.
      if (!device_.keepSpans_.load(std::memory_order_relaxed))
        return;
      if (cudaEventCreate(&start_) != cudaSuccess ||
          cudaEventRecord(start_, lane_.stream) != cudaSuccess)
        drop();
    }
    ~Span() {
      if (!start_)
        return;
      cudaEvent_t end = nullptr;
      if (cudaEventCreate(&end) != cudaSuccess ||
          cudaEventRecord(end, lane_.stream) != cudaSuccess) {
        if (end)
          cudaEventDestroy(end);
        drop();
        return;
      }
      std::lock_guard<std::mutex> lock(device_.spansMutex_);
      device_.spans_.push_back({name_, lane_.id, start_, end});
    }
    Span(const Span &) = delete;
    Span &operator=(const Span &) = delete;

  private:
    void drop() {
      (void)cudaGetLastError(); // A span less, not an error of the call.
      if (start_)
        cudaEventDestroy(start_);
      start_ = nullptr;
    }
    CudaDevice &device_;
    const Lane &lane_;
    const char *name_;
    cudaEvent_t start_ = nullptr;
  };

  /// Kept while any caller keeps them (traced restores at once). The
  /// device's clock is placed on the host's when keeping starts: an event
  /// recorded on an idle stream and waited for, beside Clock::now().
  void keepSpans(bool keep) override;

  std::vector<DeviceSpan> takeSpans() override;

  /// A prefill into a paged cache of the backend's that copies each
  /// layer's hidden states, K and V back to the host for its callback.
  class Stream final : public PrefillStream {
  public:
    Stream(CudaDevice &backend, const CudaModel &gpu,
           std::unique_ptr<PagedKVCache> cache, BlockTable table,
           int64_t capacity)
        : backend_(backend), gpu_(gpu), cache_(std::move(cache)),
          table_(std::move(table)), capacity_(capacity) {}

    Status next(const int32_t *tokens, int64_t n,
                const ModelCompute::LayerCallback &onLayer) override {
      if (n <= 0)
        return Status::ok();
      if (position_ + n > capacity_)
        return invalidArgument(
            "prefill stream: " + std::to_string(position_ + n) +
            " tokens exceed the request's " + std::to_string(capacity_));
      const ModelConfig &c = gpu_.config();
      const int64_t h = c.hiddenSize, kvDim = cache_->kvDim();
      KVC_ASSIGN_OR_RETURN(lease, backend_.acquire(LaneUse::Compute));
      Lane &lane = *lease;
      Scratch scratch(lane);
      KVC_ASSIGN_OR_RETURN(layouts,
                           backend_.layoutsOf(scratch, *cache_, table_, lane));
      KVC_ASSIGN_OR_RETURN(rows, scratch.take<float>(2 * n * kvDim));
      hidden_.resize(size_t(n * h));
      k_.resize(size_t(n * kvDim));
      v_.resize(size_t(n * kvDim));
      auto show = [&](int64_t layer, const float *x) -> Status {
        KVC_CUDA_RETURN_IF_ERROR(readRows(layouts[layer], position_, n, rows,
                                          rows + n * kvDim, lane.stream),
                                 "reading rows");
        for (auto [to, from, count] :
             {std::tuple{hidden_.data(), x, n * h},
              std::tuple{k_.data(), const_cast<const float *>(rows), n * kvDim},
              std::tuple{v_.data(), const_cast<const float *>(rows + n * kvDim),
                         n * kvDim}})
          KVC_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(to, from, size_t(count) * sizeof(float),
                              cudaMemcpyDeviceToHost, lane.stream),
              "device-to-host copy");
        KVC_RETURN_IF_ERROR(lane.sync("prefill stream"));
        onLayer({layer, position_, n, hidden_.data(), k_.data(), v_.data()});
        return Status::ok();
      };
      KVC_RETURN_IF_ERROR(gpu_.forward(
          lane, tokens, position_, n, c.numLayers, layouts, nullptr,
          onLayer ? CudaModel::LayerHook(show) : CudaModel::LayerHook()));
      KVC_RETURN_IF_ERROR(lane.sync("prefill stream"));
      position_ += n;
      return Status::ok();
    }

  private:
    CudaDevice &backend_;
    const CudaModel &gpu_;
    std::unique_ptr<PagedKVCache> cache_;
    BlockTable table_;
    int64_t capacity_, position_ = 0;
    std::vector<float> hidden_, k_, v_; ///< The layer shown, on the host.
  };

  /// The GPU copy of `model`, made on first use.
  StatusOr<const CudaModel *> modelFor(const ModelCompute &model);

  /// A chunk of a launch: its payload on the device and its box.
  struct Placed {
    const void *payload;
    ChunkBox box;
  };

  /// The parameters restore, rope_scatter and save kernels share over
  /// `chunks` of `cache`: the payloads' span, the cache's bases and
  /// layer_rows (kernelArgsFor), and the block table and chunk table,
  /// copied to the device in `scratch` in one upload.
  static StatusOr<KernelParams> cacheParams(const BundleKernel &kernel,
                                            const std::vector<Placed> &chunks,
                                            const PagedKVCache &cache,
                                            const BlockTable &table,
                                            Scratch &scratch);

  /// Enqueues `function`, `kernel`'s, with `params` on the lane, its grid
  /// run once per chunk of the chunk table (`chunks` of them).
  Status launch(const BundleKernel &kernel, CUfunction function,
                KernelParams &params, Lane &lane, int64_t chunks = 1);

  /// The GEMM precision of `model` on this backend.
  GemmPrecision precisionFor(const ModelCompute &model) const;

  /// `kernel`'s function, its PTX binary loaded on first use (the device's
  /// context current).
  StatusOr<CUfunction> functionOf(const BundleKernel &kernel);

  static StatusOr<int32_t *> tableOn(Scratch &scratch, const BlockTable &table);

  /// Layer `layer` of `cache` through `blocks`, for kernels on `lane`
  /// (which records an f16 cache's values out of range).
  static RowLayout layout(const PagedKVCache &cache, int64_t layer,
                          const int32_t *blocks, const Lane &lane);

  /// Where the writes into a cache are tracked: its memory (views of one
  /// memory share them).
  static const void *keyOf(const PagedKVCache &cache);

  /// Orders `lane` after every other lane's writes into `cache` so far: a
  /// call that reads it.
  Status afterWrites(const PagedKVCache &cache, const Lane &lane);
  Status afterWrites(const void *key, const Lane &lane);

  /// Counts what `lane` enqueued so far as a write into `cache`, which
  /// later readers on other lanes wait for (afterWrites, settle). Writes
  /// into an f16 cache are waited for at once instead: the lane's word
  /// reports a value beyond f16's range, for this call.
  Status wrote(const PagedKVCache &cache, const Lane &lane, const char *what);

  /// Waits for every write into the cache at `key` so far (settle).
  Status settleWrites(const void *key);

  /// Drops the caches (but `keep`) whose writes are all done: caches come
  /// and go (a restore's private one, a server's views), their addresses
  /// reused.
  void forgetSettledCaches(const void *keep);

  StatusOr<std::vector<RowLayout>> layoutsOf(Scratch &scratch,
                                             const PagedKVCache &cache,
                                             const BlockTable &table,
                                             const Lane &lane);

  CudaDeviceOptions options_;
  const CudaDriver *driver_ = nullptr;
  /// Per cache (keyOf), each lane's event after its last write into it
  /// (indexed by Lane::id), guarded by writesMutex_.
  static constexpr size_t kTrackedCaches = 64;
  std::mutex writesMutex_;
  std::map<const void *, std::vector<cudaEvent_t>> writes_;
  WaitWords waitWords_;
  PinnedMemory pinned_;
  std::atomic<int> laneCount_{0};
  /// Spans kept for a trace (keepSpans), guarded by spansMutex_.
  struct KeptSpan {
    std::string name;
    int queue;
    cudaEvent_t start, end;
  };
  std::mutex spansMutex_;
  int keepers_ = 0;
  std::atomic<bool> keepSpans_{false};
  cudaEvent_t spanBase_ = nullptr;
  Clock::time_point spanBaseHost_;
  std::vector<KeptSpan> spans_;
  std::mutex mutex_; ///< Guards lanes_.
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::mutex modelsMutex_;
  /// Per model object and fingerprint (an object at a reused address holds
  /// the same weights only when its fingerprint matches).
  std::map<std::pair<const LlamaModel *, std::string>,
           std::unique_ptr<CudaModel>>
      models_;
  /// A generated kernel's module, by the PTX it was loaded from.
  struct LoadedKernel {
    std::string ptx;
    CUmodule module = nullptr;
    CUfunction function = nullptr;
  };
  std::mutex functionsMutex_; ///< Guards functions_.
  /// By kernel name (names are specializations: one PTX each, unless
  /// bundles from different compilers meet).
  std::map<std::string, std::vector<LoadedKernel>> functions_;
};

} // namespace kvc::cuda

#endif // KVC_LIB_RUNTIME_CUDA_CUDADEVICEIMPL_H
