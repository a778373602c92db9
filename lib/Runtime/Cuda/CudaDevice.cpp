//===- CudaDevice.cpp - Restores into a GPU's memory ----------------------===//
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
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

namespace kvc {

namespace {

using namespace cuda;

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

const CudaBuffer &bufferOf(const DeviceBuffer &buffer) {
  return static_cast<const CudaBuffer &>(buffer);
}
CudaBuffer &bufferOf(DeviceBuffer &buffer) {
  return static_cast<CudaBuffer &>(buffer);
}

/// Bytes of pinned staging per half of a lane's: large enough that a
/// piece's DMA outlasts the launch of the next.
constexpr size_t kPinnedHalf = size_t(8) << 20;

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

Status needDevice(const PagedKVCache &cache) {
  if (cache.memory() != CacheMemory::Device)
    return Status(StatusCode::FailedPrecondition,
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

  std::mutex mutex_;
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

StatusOr<std::shared_ptr<StreamSignal>>
WaitWords::wait(const CudaDriver &driver, CUstream stream) {
  if (!driver.cuStreamWaitValue32)
    return unimplemented("the CUDA driver has no cuStreamWaitValue32");
  std::lock_guard<std::mutex> lock(mutex_);
  if (!host_) {
    void *host = nullptr;
    KVC_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&host, kWords * sizeof(uint32_t),
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "allocating stream wait words");
    void *device = nullptr;
    if (cudaError_t error = cudaHostGetDevicePointer(&device, host, 0);
        error != cudaSuccess) {
      cudaFreeHost(host);
      return cudaStatus(error, "mapping stream wait words");
    }
    host_ = static_cast<volatile uint32_t *>(host);
    device_ = reinterpret_cast<CUdeviceptr>(device);
    passed_.assign(kWords, nullptr);
    held_.assign(kWords, false);
    waited_.assign(kWords, false);
  }
  int index = -1;
  for (int i = 0; i < kWords && index < 0; ++i)
    if (!held_[i] && (!waited_[i] || finished(cudaEventQuery(passed_[i]))))
      index = i;
  if (index < 0)
    return Status(StatusCode::Unavailable, "every stream wait word is in use");
  if (!passed_[index])
    KVC_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&passed_[index], cudaEventDisableTiming),
        "creating a stream wait's event");
  __atomic_store_n(host_ + index, 0u, __ATOMIC_RELEASE);
  CUresult waited = driver.cuStreamWaitValue32(
      stream, device_ + index * sizeof(uint32_t), 1, CU_STREAM_WAIT_VALUE_GEQ);
  if (waited == CUDA_ERROR_NOT_SUPPORTED)
    return unimplemented("this GPU's streams cannot wait on memory");
  KVC_RETURN_IF_ERROR(driver.check(waited, "cuStreamWaitValue32"));
  if (cudaError_t error =
          cudaEventRecord(passed_[index], static_cast<cudaStream_t>(stream));
      error != cudaSuccess) {
    // Without the event, when the stream has passed the word cannot be
    // told: let the stream go, and never reuse the word.
    __atomic_store_n(host_ + index, 1u, __ATOMIC_RELEASE);
    held_[index] = true;
    return cudaStatus(error, "recording a stream wait's event");
  }
  held_[index] = true;
  waited_[index] = true;
  return std::shared_ptr<StreamSignal>(std::make_shared<Signal>(*this, index));
}

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
  createPools(const std::map<std::string, int> &lanes) override {
    return ResourcePools::create(lanes);
  }

  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override {
    if (config.dtype != DType::BF16 && config.dtype != DType::F16)
      return unimplemented(std::string("cuda backend: a paged cache of ") +
                           dtypeName(config.dtype) +
                           " (its kernels write bf16 or f16)");
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    (void)lease;
    const int64_t stride =
        config.blockStride > 0
            ? config.blockStride
            : config.blockSize * config.numKvHeads * config.headDim;
    const int64_t perLayer = config.numBlocks * stride;
    if (config.layers <= 0 || perLayer <= 0)
      return PagedKVCache::view(config, {}, CacheMemory::Device);
    // Stream-ordered, as every allocation of the backend's; freed once the
    // writes into it are done (a restore's private cache may go while a
    // prefill into it still runs).
    std::shared_ptr<DeviceArray> memory(new DeviceArray,
                                        [this](DeviceArray *m) {
                                          if (m->get())
                                            (void)settleWrites(m->get());
                                          delete m;
                                        });
    const size_t bytes =
        size_t(2 * config.layers * perLayer) * sizeof(uint16_t);
    KVC_RETURN_IF_ERROR(memory->reserve(bytes));
    KVC_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(memory->get(), 0, bytes, DeviceArray::releaseStream()),
        "clearing the paged cache");
    KVC_CUDA_RETURN_IF_ERROR(
        cudaStreamSynchronize(DeviceArray::releaseStream()),
        "clearing the paged cache");
    std::vector<PagedLayerMemory> layers;
    uint16_t *base = memory->get<uint16_t>();
    for (int64_t l = 0; l < config.layers; ++l)
      layers.push_back(
          {base + 2 * l * perLayer, base + (2 * l + 1) * perLayer});
    return PagedKVCache::view(config, std::move(layers), CacheMemory::Device,
                              std::move(memory));
  }

  std::unique_ptr<DeviceBuffer> allocate() override {
    return std::make_unique<CudaBuffer>();
  }

  HostMemory *hostMemory() override { return &pinned_; }

  Status upload(HostWords &host, bool /*consume*/, DeviceBuffer &to) override {
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "upload");
    CudaBuffer &buffer = bufferOf(to);
    const size_t bytes = host.size() * sizeof(uint16_t);
    KVC_RETURN_IF_ERROR(buffer.reserve(bytes));
    KVC_RETURN_IF_ERROR(buffer.writeOn(lane.stream)); // Its last chunk read.
    buffer.words = int64_t(host.size());
    if (host.owner() == &pinned_) {
      // Pinned already: the DMA reads it in place.
      KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer.memory.get(), host.data(),
                                               bytes, cudaMemcpyHostToDevice,
                                               lane.stream),
                               "host-to-device copy");
    } else {
      KVC_RETURN_IF_ERROR(copyThroughStaging(lane, host, buffer));
    }
    KVC_RETURN_IF_ERROR(buffer.writtenBy(lane.stream));
    // The host waits for the copy: the caller reuses its memory (a staging
    // slot decodes its next chunk there).
    return lane.sync("host-to-device copy");
  }

  /// Pageable `host` into `to` through the lane's pinned halves, the copy
  /// into one overlapping the DMA from the other.
  Status copyThroughStaging(Lane &lane, const HostWords &host, CudaBuffer &to) {
    if (!lane.pinned) {
      KVC_CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(&lane.pinned, 2 * kPinnedHalf, cudaHostAllocDefault),
          "allocating pinned staging");
    }
    const size_t bytes = host.size() * sizeof(uint16_t);
    const char *from = reinterpret_cast<const char *>(host.data());
    char *into = to.memory.get<char>();
    for (size_t offset = 0, piece = 0; offset < bytes;
         offset += kPinnedHalf, ++piece) {
      const size_t size = std::min(kPinnedHalf, bytes - offset);
      const int half = int(piece % 2);
      char *staging = static_cast<char *>(lane.pinned) + half * kPinnedHalf;
      // The half's previous DMA must have read it before it is refilled.
      if (piece >= 2)
        KVC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane.halves[half]),
                                 "waiting for staging");
      hostWorkers().copy(staging, from + offset, size);
      KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(into + offset, staging, size,
                                               cudaMemcpyHostToDevice,
                                               lane.stream),
                               "host-to-device copy");
      KVC_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.halves[half], lane.stream),
                               "recording a copy");
    }
    return Status::ok();
  }

  StatusOr<double> project(const ModelCompute &model, const CudaModel &gpu,
                           const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) {
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "project");
    const int64_t tokens = box.tokens(), h = model.config().hiddenSize,
                  kvDim = model.kvDim();
    const int64_t wordsPer = dtype == DType::F32 ? 2 : 1;
    const CudaBuffer &in = bufferOf(hidden);
    if (in.words != box.layers() * tokens * h * wordsPer)
      return Status(StatusCode::Internal,
                    "project: the buffer does not hold the chunk's hidden "
                    "states");
    CudaBuffer &out = bufferOf(kv);
    out.words = box.layers() * 2 * tokens * kvDim;
    KVC_RETURN_IF_ERROR(out.reserve(size_t(out.words) * sizeof(uint16_t)));
    KVC_RETURN_IF_ERROR(in.readOn(lane.stream));
    KVC_RETURN_IF_ERROR(out.writeOn(lane.stream));
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(states, scratch.take<float>(tokens * h));
    for (int64_t l = 0; l < box.layers(); ++l) {
      const uint16_t *words =
          in.memory.get<uint16_t>() + l * tokens * h * wordsPer;
      const float *layerStates = reinterpret_cast<const float *>(words);
      if (dtype != DType::F32) {
        KVC_CUDA_RETURN_IF_ERROR(
            widen(words, dtype == DType::F16, tokens * h, states, lane.stream),
            "widening hidden states");
        layerStates = states;
      }
      uint16_t *k = out.memory.get<uint16_t>() + 2 * l * tokens * kvDim;
      RowLayout rows{k, k + tokens * kvDim, nullptr, 0, 0, kvDim, 0};
      KVC_RETURN_IF_ERROR(gpu.project(lane, box.layerBegin + l, layerStates,
                                      tokens, box.tokenBegin, rows));
    }
    KVC_RETURN_IF_ERROR(in.readBy(lane.stream));
    KVC_RETURN_IF_ERROR(out.writtenBy(lane.stream));
    return model.projectFlops(tokens, box.layers());
  }

  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    const int64_t kvDim = cache.kvDim(), tokens = box.tokens();
    const CudaBuffer &in = bufferOf(kv);
    if (in.words != box.layers() * 2 * tokens * kvDim)
      return Status(StatusCode::Internal,
                    "scatter: the buffer does not hold the chunk's KV (a "
                    "plan step is missing before it)");
    KVC_RETURN_IF_ERROR(cache.checkRange(table, box.layerBegin, box.layerEnd,
                                         box.tokenBegin, tokens));
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "scatter");
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(blocks, tableOn(scratch, table));
    KVC_RETURN_IF_ERROR(in.readOn(lane.stream));
    for (int64_t l = 0; l < box.layers(); ++l) {
      uint16_t *k = const_cast<uint16_t *>(in.memory.get<uint16_t>()) +
                    2 * l * tokens * kvDim;
      RowLayout from{k,     k + tokens * kvDim, nullptr, 0, 0,
                     kvDim, box.tokenBegin};
      KVC_CUDA_RETURN_IF_ERROR(
          cuda::copyRows(from, layout(cache, box.layerBegin + l, blocks, lane),
                         box.tokenBegin, tokens, lane.stream),
          "scatter");
    }
    KVC_RETURN_IF_ERROR(in.readBy(lane.stream));
    return wrote(cache, lane, "scatter");
  }

  bool launchesKernels() const override { return true; }

  /// The driver loads PTX (cuModuleLoadData), no other format.
  static Status loads(const BundleKernel &kernel) {
    if (kernel.format != "ptx")
      return Status(StatusCode::FailedPrecondition,
                    "kernel \"" + kernel.name + "\" is " + kernel.format +
                        "; the cuda backend loads ptx");
    return Status::ok();
  }

  Status canLaunch(const BundleKernel &kernel,
                   const PagedKVCache &cache) const override {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    KVC_RETURN_IF_ERROR(loads(kernel));
    return kernelArgsFor(kernel, cache).status();
  }

  Status canLaunchSave(const BundleKernel &kernel,
                       const PagedKVCache &cache) const override {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    KVC_RETURN_IF_ERROR(loads(kernel));
    if (kernel.kind != BundleKernel::Kind::Save)
      return Status(StatusCode::FailedPrecondition,
                    "kernel \"" + kernel.name + "\" is no save kernel");
    return kernelArgsFor(kernel, cache).status();
  }

  Status launchSave(const BundleKernel &kernel, const PagedKVCache &cache,
                    const BlockTable &table, const std::vector<ChunkBox> &boxes,
                    std::vector<std::string> &payloads) override {
    KVC_RETURN_IF_ERROR(canLaunchSave(kernel, cache));
    for (const ChunkBox &box : boxes)
      if (kernel.tokens != box.tokens() || kernel.layers != box.layers())
        return Status(StatusCode::Internal,
                      "launchSave: kernel \"" + kernel.name +
                          "\" does not encode this chunk");
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "generated save");
    KVC_RETURN_IF_ERROR(afterWrites(cache, lane));
    KVC_ASSIGN_OR_RETURN(function, functionOf(kernel));
    Scratch scratch(lane);
    // The payloads back to back, each 16-byte aligned.
    const int64_t n = int64_t(boxes.size());
    const int64_t stride = (kernel.payloadBytes + 15) / 16 * 16;
    KVC_ASSIGN_OR_RETURN(out, scratch.take<char>(n * stride));
    std::vector<Placed> placed;
    for (int64_t i = 0; i < n; ++i)
      placed.push_back({out + i * stride, boxes[i]});
    KVC_ASSIGN_OR_RETURN(params,
                         cacheParams(kernel, placed, cache, table, scratch));
    KVC_RETURN_IF_ERROR(launch(kernel, function, params, lane, n));
    std::string all(size_t(n * stride), '\0');
    KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all.data(), out, all.size(),
                                             cudaMemcpyDeviceToHost,
                                             lane.stream),
                             "device-to-host copy");
    KVC_RETURN_IF_ERROR(lane.sync("generated save kernel"));
    payloads.clear();
    for (int64_t i = 0; i < n; ++i)
      payloads.push_back(
          all.substr(size_t(i * stride), size_t(kernel.payloadBytes)));
    return Status::ok();
  }

  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue, const ModelConfig &c,
                          bool bf16Gemms, const PagedKVCache &cache) const {
    KVC_RETURN_IF_ERROR(CudaModel::supports(c));
    KVC_RETURN_IF_ERROR(canLaunch(epilogue, cache));
    KVC_RETURN_IF_ERROR(loads(prologue));
    if (!bf16Gemms)
      return Status(StatusCode::FailedPrecondition,
                    "the model's GEMMs take fp32 inputs; the prologue writes "
                    "bf16");
    if (prologue.hidden != c.hiddenSize || prologue.layers != epilogue.layers ||
        prologue.tokens != epilogue.tokens)
      return Status(StatusCode::FailedPrecondition,
                    "prologue \"" + prologue.name +
                        "\" normalizes another shape than the model's "
                        "hidden states or its epilogue's chunk");
    return Status::ok();
  }

  StatusOr<double>
  launchProject(const BundleKernel &prologue, const BundleKernel &epilogue,
                const ModelCompute &model, const CudaModel &gpu,
                const DeviceBuffer &hidden, DType dtype, const ChunkBox &box,
                PagedKVCache &cache, const BlockTable &table) {
    KVC_RETURN_IF_ERROR(canLaunchProject(prologue, epilogue, model.config(),
                                         gpu.bf16(), cache));
    const ModelConfig &c = model.config();
    const int64_t tokens = box.tokens(), layers = box.layers(),
                  h = c.hiddenSize, kvDim = model.kvDim();
    const CudaBuffer &in = bufferOf(hidden);
    if (epilogue.tokens != tokens || epilogue.layers != layers ||
        2 * in.words != layers * tokens * h * dtypeBytes(dtype) ||
        epilogue.payloadBytes != layers * 2 * tokens * kvDim * 4)
      return Status(StatusCode::Internal,
                    "launchProject: kernels \"" + prologue.name + "\" and \"" +
                        epilogue.name + "\" do not project this chunk");
    KVC_ASSIGN_OR_RETURN(rope, gpu.fullRopeTable());
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "generated projection");
    KVC_RETURN_IF_ERROR(in.readOn(lane.stream));
    KVC_ASSIGN_OR_RETURN(normFunction, functionOf(prologue));
    KVC_ASSIGN_OR_RETURN(ropeFunction, functionOf(epilogue));
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(normed, scratch.take<uint16_t>(layers * tokens * h));
    KVC_ASSIGN_OR_RETURN(projected,
                         scratch.take<float>(layers * 2 * tokens * kvDim));
    KVC_ASSIGN_OR_RETURN(scatter, cacheParams(epilogue, {{projected, box}},
                                              cache, table, scratch));
    KernelParams norm;
    norm.buffer("hidden", in.memory.get<char>(), 2 * in.words);
    norm.buffer("norm_weights", gpu.attnNorms(),
                c.numLayers * h * int64_t(sizeof(float)));
    norm.buffer("normed", normed, layers * tokens * h * 2);
    norm.scalar("first_layer", box.layerBegin);
    KVC_RETURN_IF_ERROR(launch(prologue, normFunction, norm, lane));
    for (int64_t l = 0; l < layers; ++l) {
      float *k = projected + 2 * l * tokens * kvDim;
      KVC_RETURN_IF_ERROR(gpu.projectKV(lane, box.layerBegin + l,
                                        normed + l * tokens * h, tokens, k,
                                        k + tokens * kvDim));
    }
    scatter.buffer("rope_table", rope,
                   c.maxPositions * c.headDim * int64_t(sizeof(float)));
    KVC_RETURN_IF_ERROR(launch(epilogue, ropeFunction, scatter, lane));
    KVC_RETURN_IF_ERROR(in.readBy(lane.stream));
    KVC_RETURN_IF_ERROR(wrote(cache, lane, "generated projection"));
    return model.projectFlops(tokens, layers);
  }

  Status launchRestore(const BundleKernel &kernel,
                       const std::vector<RestoreChunk> &chunks,
                       PagedKVCache &cache, const BlockTable &table) override {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    std::vector<Placed> placed;
    for (const RestoreChunk &chunk : chunks) {
      const CudaBuffer &in = bufferOf(*chunk.payload);
      if (kernel.tokens != chunk.box.tokens() ||
          kernel.layers != chunk.box.layers() ||
          2 * in.words < kernel.payloadBytes)
        return Status(StatusCode::Internal,
                      "launchRestore: kernel \"" + kernel.name +
                          "\" does not decode this chunk's payload");
      placed.push_back({in.memory.get<char>(), chunk.box});
    }
    KVC_ASSIGN_OR_RETURN(lease, acquire()); // The device's context current.
    Lane &lane = *lease;
    Span span(*this, lane, "generated restore");
    KVC_ASSIGN_OR_RETURN(function, functionOf(kernel));
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(params,
                         cacheParams(kernel, placed, cache, table, scratch));
    for (const RestoreChunk &chunk : chunks)
      KVC_RETURN_IF_ERROR(bufferOf(*chunk.payload).readOn(lane.stream));
    KVC_RETURN_IF_ERROR(
        launch(kernel, function, params, lane, int64_t(placed.size())));
    for (const RestoreChunk &chunk : chunks)
      KVC_RETURN_IF_ERROR(bufferOf(*chunk.payload).readBy(lane.stream));
    return wrote(cache, lane, "generated restore kernel");
  }

  Status prefillInto(const ModelCompute &model, const CudaModel &gpu,
                     PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const ModelRunner::LayerWritten &written) {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    if (layers < 0)
      layers = model.config().numLayers;
    KVC_RETURN_IF_ERROR(cache.checkRange(table, 0, layers, 0, position + n));
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "prefill");
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(layouts, layoutsOf(scratch, cache, table, lane));
    KVC_RETURN_IF_ERROR(afterWrites(cache, lane)); // Attention reads them.
    // Each layer's K and V are written for the device's later calls once
    // the lane's work up to them is (an event, for a caller that asks).
    auto shown = [&](int64_t layer, const float *) -> Status {
      KVC_RETURN_IF_ERROR(wrote(cache, lane, "prefill"));
      written(layer);
      return Status::ok();
    };
    KVC_RETURN_IF_ERROR(gpu.forward(
        lane, tokens, position, n, layers, layouts, nullptr,
        written ? CudaModel::LayerHook(shown) : CudaModel::LayerHook()));
    return wrote(cache, lane, "prefill");
  }

  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, const CudaModel &gpu,
                int64_t tokens) {
    const ModelConfig &c = model.config();
    if (tokens <= 0 || tokens > c.maxPositions)
      return invalidArgument("prefill stream: a request of " +
                             std::to_string(tokens) +
                             " tokens; the model's context holds " +
                             std::to_string(c.maxPositions));
    PagedCacheConfig config{c.numLayers, c.numKvHeads,       c.headDim,
                            16,          (tokens + 15) / 16, 0};
    KVC_ASSIGN_OR_RETURN(cache, createCache(config));
    KVC_ASSIGN_OR_RETURN(table, cache->allocate(tokens));
    return std::unique_ptr<PrefillStream>(std::make_unique<Stream>(
        *this, gpu, std::move(cache), std::move(table), tokens));
  }

  Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                  PagedKVCache &to, const BlockTable &toTable, int64_t layer,
                  int64_t first, int64_t n) override {
    KVC_RETURN_IF_ERROR(needDevice(from));
    KVC_RETURN_IF_ERROR(needDevice(to));
    KVC_RETURN_IF_ERROR(from.checkRange(fromTable, layer, first, n));
    KVC_RETURN_IF_ERROR(to.checkRange(toTable, layer, first, n));
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "copy rows");
    Scratch scratch(lane);
    KVC_ASSIGN_OR_RETURN(fromBlocks, tableOn(scratch, fromTable));
    KVC_ASSIGN_OR_RETURN(toBlocks, tableOn(scratch, toTable));
    KVC_RETURN_IF_ERROR(afterWrites(from, lane));
    KVC_CUDA_RETURN_IF_ERROR(
        cuda::copyRows(layout(from, layer, fromBlocks, lane),
                       layout(to, layer, toBlocks, lane), first, n,
                       lane.stream),
        "copying rows");
    return wrote(to, lane, "copying rows");
  }

  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    KVC_RETURN_IF_ERROR(cache.checkRange(table, layer, first, n));
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "read back");
    KVC_RETURN_IF_ERROR(afterWrites(cache, lane));
    Scratch scratch(lane);
    const int64_t count = n * cache.kvDim();
    KVC_ASSIGN_OR_RETURN(blocks, tableOn(scratch, table));
    KVC_ASSIGN_OR_RETURN(keys, scratch.take<float>(count));
    KVC_ASSIGN_OR_RETURN(values, scratch.take<float>(count));
    KVC_CUDA_RETURN_IF_ERROR(readRows(layout(cache, layer, blocks, lane), first,
                                      n, keys, values, lane.stream),
                             "reading rows");
    for (auto [to, from] : {std::pair{k, keys}, std::pair{v, values}})
      KVC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(to, from, size_t(count) * sizeof(float),
                          cudaMemcpyDeviceToHost, lane.stream),
          "device-to-host copy");
    return lane.sync("reading rows");
  }

  Status decode(const ModelCompute &model, const CudaModel &gpu,
                PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const ModelRunner::LayerGate &attend) {
    KVC_RETURN_IF_ERROR(needDevice(cache));
    if (n <= 0)
      return invalidArgument("logits need at least one token");
    KVC_RETURN_IF_ERROR(
        cache.checkRange(table, 0, cache.config().layers, 0, position + n));
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    Span span(*this, lane, "decode");
    KVC_RETURN_IF_ERROR(afterWrites(cache, lane));
    Scratch scratch(lane);
    const int64_t vocab = model.config().vocabSize;
    KVC_ASSIGN_OR_RETURN(layouts, layoutsOf(scratch, cache, table, lane));
    KVC_ASSIGN_OR_RETURN(out, scratch.take<float>(vocab));
    // The forward shows each layer after storing its K and V (rows
    // position.., the step's own) and before its attention reads the cache.
    auto gate = [&](int64_t layer, const float *) { return attend(layer); };
    KVC_RETURN_IF_ERROR(gpu.forward(
        lane, tokens, position, n, model.config().numLayers, layouts, out,
        attend ? CudaModel::LayerHook(gate) : CudaModel::LayerHook()));
    KVC_RETURN_IF_ERROR(wrote(cache, lane, "decode")); // The step's rows.
    KVC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(logits, out, size_t(vocab) * sizeof(float),
                        cudaMemcpyDeviceToHost, lane.stream),
        "device-to-host copy");
    return lane.sync("decode");
  }

  StatusOr<double> timePrefill(const ModelCompute &model, const CudaModel &gpu,
                               const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) {
    if (position < 0 || n <= 0 || position + n > int64_t(tokens.size()) ||
        context.tokens < position)
      return invalidArgument("timePrefill: tokens " + std::to_string(position) +
                             " to " + std::to_string(position + n) +
                             " are not in the request or its context");
    const ModelConfig &c = model.config();
    PagedCacheConfig config{
        c.numLayers, c.numKvHeads, c.headDim, 16, (position + n + 15) / 16, 0};
    KVC_ASSIGN_OR_RETURN(cache, createCache(config));
    KVC_ASSIGN_OR_RETURN(table, cache->allocate(position + n));
    const int64_t kvDim = model.kvDim();
    {
      KVC_ASSIGN_OR_RETURN(lease, acquire());
      Lane &lane = *lease;
      Scratch scratch(lane);
      KVC_ASSIGN_OR_RETURN(blocks, tableOn(scratch, table));
      KVC_ASSIGN_OR_RETURN(rows, scratch.take<float>(position * kvDim));
      KVC_ASSIGN_OR_RETURN(bits, scratch.take<uint16_t>(2 * position * kvDim));
      for (int64_t l = 0; l < c.numLayers && position > 0; ++l) {
        for (int m = 0; m < 2; ++m) {
          const float *host = (m == 0 ? context.k : context.v)[l].data();
          KVC_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(rows, host, size_t(position * kvDim) * 4,
                              cudaMemcpyHostToDevice, lane.stream),
              "copying the context");
          KVC_CUDA_RETURN_IF_ERROR(narrow(rows, position * kvDim,
                                          bits + m * position * kvDim,
                                          lane.stream),
                                   "copying the context");
        }
        RowLayout from{bits, bits + position * kvDim, nullptr, 0, 0, kvDim, 0};
        KVC_CUDA_RETURN_IF_ERROR(cuda::copyRows(from,
                                                layout(*cache, l, blocks, lane),
                                                0, position, lane.stream),
                                 "copying the context");
      }
      KVC_RETURN_IF_ERROR(lane.sync("copying the context"));
    }
    Clock::time_point start = Clock::now();
    KVC_RETURN_IF_ERROR(prefillInto(model, gpu, *cache, table,
                                    tokens.data() + position, position, n,
                                    c.numLayers, {}));
    KVC_RETURN_IF_ERROR(settle(*cache));
    return secondsSince(start);
  }

  Status settle(const PagedKVCache &cache) override {
    if (cache.memory() != CacheMemory::Device)
      return Status::ok();
    return settleWrites(keyOf(cache));
  }

  StatusOr<std::shared_ptr<StreamSignal>> streamWait(void *stream) override {
    KVC_ASSIGN_OR_RETURN(driver, CudaDriver::get());
    KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                             "selecting the device");
    return waitWords_.wait(*driver, static_cast<CUstream>(stream));
  }

  /// What a restore's upload does: from the device's host memory, where
  /// its staging slots decode chunks.
  StatusOr<double> uploadGBs() override {
    HostWords host(hostMemory());
    host.resize(size_t(128) << 20);
    CudaBuffer device;
    KVC_RETURN_IF_ERROR(upload(host, false, device)); // Warms up.
    double best = 0;
    for (int i = 0; i < 3; ++i) {
      Clock::time_point start = Clock::now();
      KVC_RETURN_IF_ERROR(upload(host, false, device));
      best = std::max(best, double(host.size() * 2) / secondsSince(start));
    }
    return best / 1e9;
  }

  /// A device-to-device copy of 256 MiB: its bytes read and written.
  StatusOr<double> memoryGBs() override {
    constexpr size_t kBytes = size_t(256) << 20;
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    DeviceArray from, to;
    KVC_RETURN_IF_ERROR(from.reserve(kBytes));
    KVC_RETURN_IF_ERROR(to.reserve(kBytes));
    double best = 0;
    for (int i = 0; i < 4; ++i) { // The first warms up.
      Clock::time_point start = Clock::now();
      KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to.get(), from.get(), kBytes,
                                               cudaMemcpyDeviceToDevice,
                                               lane.stream),
                               "device-to-device copy");
      KVC_RETURN_IF_ERROR(lane.sync("device-to-device copy"));
      if (i > 0)
        best = std::max(best, 2.0 * double(kBytes) / secondsSince(start));
    }
    return best / 1e9;
  }

  std::unique_ptr<ModelRunner> createRunner(const ModelCompute &model) override;

  /// A model over `weights` the caller holds on this device.
  StatusOr<std::unique_ptr<CudaModel>>
  borrowWeights(const ModelConfig &config, const CudaLlamaWeights &weights) {
    KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                             "selecting the device");
    return CudaModel::borrow(config, weights);
  }

  Status start() {
    KVC_ASSIGN_OR_RETURN(driver, CudaDriver::get());
    driver_ = driver;
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    (void)lease;
    // Keep freed scratch pooled across synchronizations.
    cudaMemPool_t pool;
    KVC_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetDefaultMemPool(&pool, options_.device),
        "the device's memory pool");
    uint64_t threshold = UINT64_MAX;
    return cudaStatus(cudaMemPoolSetAttribute(
                          pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                      "the device's memory pool");
  }

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

  /// A free lane for the calling thread: the one its last call had, where
  /// its work queues in order, else one with nothing left to run, else a
  /// new one. Calls return before their work is done, so a free lane may
  /// still be running another thread's (a prefill): an upload queued behind
  /// it would wait for it.
  StatusOr<LaneLease> acquire() {
    KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                             "selecting the device");
    const std::thread::id self = std::this_thread::get_id();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto take = [&](std::vector<std::unique_ptr<Lane>>::iterator at) {
        std::unique_ptr<Lane> lane = std::move(*at);
        lanes_.erase(at);
        lane->user = self;
        return LaneLease(this, std::move(lane));
      };
      for (auto at = lanes_.begin(); at != lanes_.end(); ++at)
        if ((*at)->user == self)
          return take(at);
      for (auto at = lanes_.begin(); at != lanes_.end(); ++at)
        if (finished(cudaStreamQuery((*at)->stream)))
          return take(at);
    }
    KVC_ASSIGN_OR_RETURN(lane, Lane::create(options_.device));
    lane->id = laneCount_++;
    lane->user = self;
    return LaneLease(this, std::move(lane));
  }

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
  void keepSpans(bool keep) override {
    std::lock_guard<std::mutex> lock(spansMutex_);
    if (!keep) {
      keepers_ = std::max(0, keepers_ - 1);
      keepSpans_ = keepers_ > 0;
      return;
    }
    if (keepers_++ > 0)
      return;
    if ((!spanBase_ && cudaEventCreate(&spanBase_) != cudaSuccess) ||
        cudaEventRecord(spanBase_, DeviceArray::releaseStream()) !=
            cudaSuccess ||
        cudaEventSynchronize(spanBase_) != cudaSuccess) {
      (void)cudaGetLastError();
      return; // No spans: traces of the host's tasks alone.
    }
    spanBaseHost_ = Clock::now();
    keepSpans_ = true;
  }

  std::vector<DeviceSpan> takeSpans() override {
    std::vector<KeptSpan> kept;
    {
      std::lock_guard<std::mutex> lock(spansMutex_);
      kept.swap(spans_);
    }
    std::vector<DeviceSpan> spans;
    for (const KeptSpan &span : kept) {
      float start = 0, end = 0;
      if (cudaEventSynchronize(span.end) == cudaSuccess &&
          cudaEventElapsedTime(&start, spanBase_, span.start) == cudaSuccess &&
          cudaEventElapsedTime(&end, spanBase_, span.end) == cudaSuccess) {
        auto at = [&](float ms) {
          return spanBaseHost_ +
                 std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double, std::milli>(ms));
        };
        spans.push_back({span.name, span.queue, at(start), at(end)});
      } else {
        (void)cudaGetLastError();
      }
      cudaEventDestroy(span.start);
      cudaEventDestroy(span.end);
    }
    return spans;
  }

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
      KVC_ASSIGN_OR_RETURN(lease, backend_.acquire());
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
  StatusOr<const CudaModel *> modelFor(const ModelCompute &model) {
    const auto *llama = dynamic_cast<const LlamaModel *>(&model);
    if (!llama)
      return Status(StatusCode::Unimplemented,
                    "cuda backend: it computes with kvc's LlamaModel only; "
                    "restore through loads, or with the CPU backend");
    std::lock_guard<std::mutex> lock(modelsMutex_);
    std::unique_ptr<CudaModel> &gpu = models_[{llama, llama->fingerprint()}];
    if (!gpu) {
      KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                               "selecting the device");
      KVC_ASSIGN_OR_RETURN(created,
                           CudaModel::create(*llama, precisionFor(model)));
      gpu = std::move(created);
    }
    return gpu.get();
  }

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
                                            Scratch &scratch) {
    KVC_ASSIGN_OR_RETURN(args, kernelArgsFor(kernel, cache));
    std::vector<ChunkAt> at;
    for (const Placed &chunk : chunks) {
      const ChunkBox &box = chunk.box;
      KVC_RETURN_IF_ERROR(cache.checkRange(table, box.layerBegin, box.layerEnd,
                                           box.tokenBegin, box.tokens()));
      at.push_back({chunk.payload, box.tokenBegin, box.layerBegin});
    }
    KVC_ASSIGN_OR_RETURN(chunkTable, kvc::chunkTable(kernel, at));
    KVC_ASSIGN_OR_RETURN(blocks, args.blocks(table));
    // [block table, padded to 8 bytes][chunk records]
    const int64_t blockWords = (int64_t(blocks.size()) + 1) / 2;
    std::vector<int64_t> tables(
        size_t(blockWords + 3 * int64_t(chunkTable.records.size())));
    std::memcpy(tables.data(), blocks.data(), blocks.size() * sizeof(int32_t));
    std::memcpy(tables.data() + blockWords, chunkTable.records.data(),
                chunkTable.records.size() * sizeof(KernelChunk));
    KVC_ASSIGN_OR_RETURN(device,
                         scratch.copy(tables.data(), int64_t(tables.size())));
    KernelParams params;
    params.buffer("payload", chunkTable.base, chunkTable.bytes);
    params.buffer("key_cache", args.keys, args.bytes);
    params.buffer("value_cache", args.values, args.bytes);
    params.buffer("block_table", device, int64_t(blocks.size()));
    params.buffer("chunks", device + blockWords,
                  3 * int64_t(chunkTable.records.size()));
    params.scalar("layer_rows", args.layerRows);
    return params;
  }

  /// Enqueues `function`, `kernel`'s, with `params` on the lane, its grid
  /// run once per chunk of the chunk table (`chunks` of them).
  Status launch(const BundleKernel &kernel, CUfunction function,
                KernelParams &params, Lane &lane, int64_t chunks = 1) {
    KVC_ASSIGN_OR_RETURN(pointers, params.pointers(kernel));
    return driver_->check(
        driver_->cuLaunchKernel(
            function, unsigned(kernel.grid[0]),
            unsigned(kernel.grid[1] * chunks), unsigned(kernel.grid[2]),
            unsigned(kernel.block[0]), unsigned(kernel.block[1]),
            unsigned(kernel.block[2]), 0,
            reinterpret_cast<CUstream>(lane.stream), pointers.data(), nullptr),
        ("launching generated kernel " + kernel.name).c_str());
  }

  /// The GEMM precision of `model` on this backend.
  GemmPrecision precisionFor(const ModelCompute &model) const {
    return options_.gemm == CudaDeviceOptions::Gemm::F32 ? GemmPrecision::F32
           : options_.gemm == CudaDeviceOptions::Gemm::BF16
               ? GemmPrecision::BF16
           : model.config().dtype == DType::F32 ? GemmPrecision::F32
                                                : GemmPrecision::BF16;
  }

  /// `kernel`'s function, its PTX binary loaded on first use (the device's
  /// context current).
  StatusOr<CUfunction> functionOf(const BundleKernel &kernel) {
    std::lock_guard<std::mutex> lock(functionsMutex_);
    std::vector<LoadedKernel> &loaded = functions_[kernel.name];
    for (const LoadedKernel &candidate : loaded)
      if (candidate.ptx == kernel.binary)
        return candidate.function;
    LoadedKernel fresh{kernel.binary};
    KVC_RETURN_IF_ERROR(driver_->check(
        driver_->cuModuleLoadData(&fresh.module, kernel.binary.c_str()),
        "loading a generated kernel's PTX"));
    Status found = driver_->check(
        driver_->cuModuleGetFunction(&fresh.function, fresh.module,
                                     kernel.function.c_str()),
        "finding a generated kernel's entry");
    if (!found.isOk()) {
      driver_->cuModuleUnload(fresh.module);
      return found;
    }
    loaded.push_back(fresh);
    return fresh.function;
  }

  static StatusOr<int32_t *> tableOn(Scratch &scratch,
                                     const BlockTable &table) {
    return scratch.copy(table.blocks.data(), int64_t(table.blocks.size()));
  }

  /// Layer `layer` of `cache` through `blocks`, for kernels on `lane`
  /// (which records an f16 cache's values out of range).
  static RowLayout layout(const PagedKVCache &cache, int64_t layer,
                          const int32_t *blocks, const Lane &lane) {
    const bool f16 = cache.config().dtype == DType::F16;
    return {const_cast<uint16_t *>(cache.keyCache(layer)),
            const_cast<uint16_t *>(cache.valueCache(layer)),
            blocks,
            cache.config().blockSize,
            cache.blockStride(),
            cache.kvDim(),
            0,
            f16,
            f16 ? lane.outOfRangeOnDevice : nullptr};
  }

  /// Where the writes into a cache are tracked: its memory (views of one
  /// memory share them).
  static const void *keyOf(const PagedKVCache &cache) {
    return cache.config().layers > 0
               ? static_cast<const void *>(cache.keyCache(0))
               : &cache;
  }

  /// Orders `lane` after every other lane's writes into `cache` so far: a
  /// call that reads it.
  Status afterWrites(const PagedKVCache &cache, const Lane &lane) {
    return afterWrites(keyOf(cache), lane);
  }
  Status afterWrites(const void *key, const Lane &lane) {
    std::lock_guard<std::mutex> lock(writesMutex_);
    auto found = writes_.find(key);
    if (found == writes_.end())
      return Status::ok();
    const std::vector<cudaEvent_t> &events = found->second;
    for (size_t id = 0; id < events.size(); ++id)
      if (events[id] && int(id) != lane.id)
        KVC_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(lane.stream, events[id], 0),
            "ordering a cache's calls");
    return Status::ok();
  }

  /// Counts what `lane` enqueued so far as a write into `cache`, which
  /// later readers on other lanes wait for (afterWrites, settle). Writes
  /// into an f16 cache are waited for at once instead: the lane's word
  /// reports a value beyond f16's range, for this call.
  Status wrote(const PagedKVCache &cache, const Lane &lane, const char *what) {
    if (cache.config().dtype == DType::F16)
      return lane.sync(what);
    std::lock_guard<std::mutex> lock(writesMutex_);
    auto [at, added] = writes_.try_emplace(keyOf(cache));
    if (added && writes_.size() > kTrackedCaches)
      forgetSettledCaches(at->first);
    std::vector<cudaEvent_t> &events = at->second;
    if (int(events.size()) <= lane.id)
      events.resize(size_t(lane.id) + 1, nullptr);
    cudaEvent_t &event = events[size_t(lane.id)];
    if (!event)
      KVC_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
          "creating a cache's event");
    return cudaStatus(cudaEventRecord(event, lane.stream), what);
  }

  /// Waits for every write into the cache at `key` so far (settle).
  Status settleWrites(const void *key) {
    KVC_ASSIGN_OR_RETURN(lease, acquire());
    Lane &lane = *lease;
    // The lane's own earlier writes are behind it on its stream.
    KVC_RETURN_IF_ERROR(afterWrites(key, lane));
    return lane.sync("settling the cache");
  }

  /// Drops the caches (but `keep`) whose writes are all done: caches come
  /// and go (a restore's private one, a server's views), their addresses
  /// reused.
  void forgetSettledCaches(const void *keep) {
    for (auto it = writes_.begin(); it != writes_.end();) {
      bool done = it->first != keep;
      for (cudaEvent_t event : it->second)
        done = done && (!event || finished(cudaEventQuery(event)));
      if (!done) {
        ++it;
        continue;
      }
      for (cudaEvent_t event : it->second)
        if (event)
          cudaEventDestroy(event);
      it = writes_.erase(it);
    }
  }

  StatusOr<std::vector<RowLayout>> layoutsOf(Scratch &scratch,
                                             const PagedKVCache &cache,
                                             const BlockTable &table,
                                             const Lane &lane) {
    KVC_ASSIGN_OR_RETURN(blocks, tableOn(scratch, table));
    std::vector<RowLayout> layouts;
    for (int64_t l = 0; l < cache.config().layers; ++l)
      layouts.push_back(layout(cache, l, blocks, lane));
    return layouts;
  }

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

/// The model's work on the device's lanes (the device's members above),
/// over the model's weights on the device: the caller's (`own`), or those
/// the device uploads for the model on first use.
class CudaRunner final : public ModelRunner {
public:
  CudaRunner(CudaDevice &device, const ModelCompute &model,
             std::unique_ptr<CudaModel> own = nullptr)
      : ModelRunner(device, model), device_(device), own_(std::move(own)) {}

  StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.project(model(), *gpu, hidden, dtype, box, kv);
  }
  /// Without uploading the weights: a plan's check, before any launch.
  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue,
                          const PagedKVCache &cache) const override {
    if (!own_ && !dynamic_cast<const LlamaModel *>(&model()))
      return unimplemented("the backend computes with kvc's LlamaModel only");
    const bool bf16 =
        own_ ? own_->bf16()
             : device_.precisionFor(model()) == GemmPrecision::BF16;
    return device_.canLaunchProject(prologue, epilogue, model().config(), bf16,
                                    cache);
  }
  StatusOr<double> launchProject(const BundleKernel &prologue,
                                 const BundleKernel &epilogue,
                                 const DeviceBuffer &hidden, DType dtype,
                                 const ChunkBox &box, PagedKVCache &cache,
                                 const BlockTable &table) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.launchProject(prologue, epilogue, model(), *gpu, hidden,
                                 dtype, box, cache, table);
  }
  Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const LayerWritten &written) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.prefillInto(model(), *gpu, cache, table, tokens, position, n,
                               layers, written);
  }
  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(int64_t tokens) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.streamPrefill(model(), *gpu, tokens);
  }
  Status decode(PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const LayerGate &attend) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.decode(model(), *gpu, cache, table, position, tokens, n,
                          logits, attend);
  }
  StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    KVC_ASSIGN_OR_RETURN(gpu, weights());
    return device_.timePrefill(model(), *gpu, context, tokens, position, n);
  }

private:
  /// The model's weights on the device.
  StatusOr<const CudaModel *> weights() const {
    if (own_)
      return own_.get();
    return device_.modelFor(model());
  }

  CudaDevice &device_;
  std::unique_ptr<CudaModel> own_;
};

std::unique_ptr<ModelRunner>
CudaDevice::createRunner(const ModelCompute &model) {
  return std::make_unique<CudaRunner>(*this, model);
}

} // namespace

StatusOr<std::unique_ptr<ModelRunner>>
createCudaRunner(Device &device, const ModelCompute &model,
                 const CudaLlamaWeights &weights) {
  auto *cuda = dynamic_cast<CudaDevice *>(&device);
  if (!cuda)
    return invalidArgument(std::string("cuda runner: weights on a GPU run on "
                                       "the cuda device, not the ") +
                           device.name() + " device");
  const ModelConfig &c = model.config();
  if (c.numKvHeads <= 0 || c.numHeads % c.numKvHeads != 0)
    return invalidArgument("cuda runner: a model of " +
                           std::to_string(c.numHeads) + " heads and " +
                           std::to_string(c.numKvHeads) + " KV heads");
  KVC_ASSIGN_OR_RETURN(gpu, cuda->borrowWeights(c, weights));
  return std::unique_ptr<ModelRunner>(
      std::make_unique<CudaRunner>(*cuda, model, std::move(gpu)));
}

StatusOr<std::unique_ptr<Device>>
createCudaDevice(const CudaDeviceOptions &options) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0)
    return Status(
        StatusCode::Unavailable,
        std::string("cuda backend: no usable GPU (") +
            (error != cudaSuccess ? cudaGetErrorString(error) : "no device") +
            ")");
  if (options.device < 0 || options.device >= count)
    return invalidArgument("cuda backend: no device " +
                           std::to_string(options.device) + " (there are " +
                           std::to_string(count) + ")");
  auto device = std::make_unique<CudaDevice>(options);
  KVC_RETURN_IF_ERROR(device->start());
  return std::unique_ptr<Device>(std::move(device));
}

} // namespace kvc
