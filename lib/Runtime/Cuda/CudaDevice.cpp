//===- CudaDevice.cpp - Restores into a GPU's memory ----------------------===//
//
// The device's memory, lanes, events, copies, scatters and calibration
// probes (CudaDeviceImpl.h says how they fit together).
//
//===----------------------------------------------------------------------===//

#include "CudaDeviceImpl.h"

namespace kvc {
namespace cuda {

Status WaitWords::start(const CudaDriver &driver) {
  if (!driver.cuStreamWaitValue32)
    return unimplemented("the CUDA driver has no cuStreamWaitValue32");
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
  return probe(driver);
}

Status WaitWords::probe(const CudaDriver &driver) {
  cudaStream_t stream = nullptr;
  KVC_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "creating the stream wait probe's stream");
  cudaEvent_t passed = nullptr;
  if (cudaError_t error =
          cudaEventCreateWithFlags(&passed, cudaEventDisableTiming);
      error != cudaSuccess) {
    cudaStreamDestroy(stream);
    return cudaStatus(error, "creating the stream wait probe's event");
  }
  auto release = [&] {
    cudaEventDestroy(passed);
    cudaStreamDestroy(stream);
  };
  __atomic_store_n(host_, 0u, __ATOMIC_RELEASE);
  CUresult waited = driver.cuStreamWaitValue32(
      reinterpret_cast<CUstream>(stream), device_, 1, CU_STREAM_WAIT_VALUE_GEQ);
  if (waited != CUDA_SUCCESS) {
    release();
    if (waited == CUDA_ERROR_NOT_SUPPORTED)
      return unimplemented("this GPU's streams cannot wait on memory");
    return driver.check(waited, "cuStreamWaitValue32");
  }
  if (cudaError_t error = cudaEventRecord(passed, stream);
      error != cudaSuccess) {
    __atomic_store_n(host_, 1u, __ATOMIC_RELEASE);
    release();
    return cudaStatus(error, "recording the stream wait probe's event");
  }
  using namespace std::chrono_literals;
  auto passedWithin = [&](std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    do {
      if (finished(cudaEventQuery(passed)))
        return true;
      std::this_thread::sleep_for(100us);
    } while (std::chrono::steady_clock::now() < until);
    return false;
  };
  if (passedWithin(20ms)) {
    release();
    return unimplemented("this GPU's stream waits on memory pass before the "
                         "host raises their word: the host waits instead");
  }
  __atomic_store_n(host_, 1u, __ATOMIC_RELEASE);
  if (passedWithin(1000ms)) {
    release();
    return Status::ok();
  }
  // The GPU did not see the host's store. A stream left waiting would hang
  // every later device-wide synchronization (a cudaFree), so the word is
  // raised again from the GPU, on a stream of its own.
  std::string why = "this GPU's streams do not see the host raise a stream "
                    "wait's word (a probe's stream waited 1 s after it was "
                    "raised): the host waits instead";
  cudaStream_t raiser = nullptr;
  if (driver.cuStreamWriteValue32 &&
      cudaStreamCreateWithFlags(&raiser, cudaStreamNonBlocking) ==
          cudaSuccess &&
      driver.cuStreamWriteValue32(reinterpret_cast<CUstream>(raiser), device_,
                                  1, 0) == CUDA_SUCCESS &&
      passedWithin(1000ms)) {
    cudaStreamSynchronize(raiser);
    cudaStreamDestroy(raiser);
    release();
    return unimplemented(why + "; a write from the GPU released it");
  }
  // Both left as they are: destroying the waiting stream would free its
  // event under the wait, and nothing else uses either.
  return unimplemented(why + "; nor did a write from the GPU release it (a "
                             "device-wide synchronization will hang)");
}

StatusOr<std::shared_ptr<StreamSignal>>
WaitWords::wait(const CudaDriver &driver, CUstream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_)
    started_ = start(driver);
  KVC_RETURN_IF_ERROR(*started_);
  int index = -1;
  for (int i = 0; i < kWords && index < 0; ++i)
    if (!held_[i] && (!waited_[i] || finished(cudaEventQuery(passed_[i]))))
      index = i;
  if (index < 0)
    return unavailable("every stream wait word is in use");
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

StatusOr<std::unique_ptr<ResourcePools>>
CudaDevice::createPools(const std::map<std::string, int> &lanes) {
  return ResourcePools::create(lanes);
}

StatusOr<std::unique_ptr<PagedKVCache>>
CudaDevice::createCache(const PagedCacheConfig &config) {
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
  std::shared_ptr<DeviceArray> memory(new DeviceArray, [this](DeviceArray *m) {
    if (m->get())
      (void)settleWrites(m->get());
    delete m;
  });
  const size_t bytes = size_t(2 * config.layers * perLayer) * sizeof(uint16_t);
  KVC_RETURN_IF_ERROR(memory->reserve(bytes));
  KVC_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(memory->get(), 0, bytes, DeviceArray::releaseStream()),
      "clearing the paged cache");
  KVC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(DeviceArray::releaseStream()),
                           "clearing the paged cache");
  std::vector<PagedLayerMemory> layers;
  uint16_t *base = memory->get<uint16_t>();
  for (int64_t l = 0; l < config.layers; ++l)
    layers.push_back({base + 2 * l * perLayer, base + (2 * l + 1) * perLayer});
  return PagedKVCache::view(config, std::move(layers), CacheMemory::Device,
                            std::move(memory));
}

std::unique_ptr<DeviceBuffer> CudaDevice::allocate() {
  return std::make_unique<CudaBuffer>();
}

Status CudaDevice::upload(HostWords &host, bool /*consume*/, DeviceBuffer &to) {
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

Status CudaDevice::copyThroughStaging(Lane &lane, const HostWords &host,
                                      CudaBuffer &to) {
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

Status CudaDevice::scatter(const DeviceBuffer &kv, const ChunkBox &box,
                           PagedKVCache &cache, const BlockTable &table) {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  const int64_t kvDim = cache.kvDim(), tokens = box.tokens();
  const CudaBuffer &in = bufferOf(kv);
  if (in.words != box.layers() * 2 * tokens * kvDim)
    return internalError("scatter: the buffer does not hold the chunk's KV (a "
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
    RowLayout from{k, k + tokens * kvDim, nullptr, 0, 0, kvDim, box.tokenBegin};
    KVC_CUDA_RETURN_IF_ERROR(
        cuda::copyRows(from, layout(cache, box.layerBegin + l, blocks, lane),
                       box.tokenBegin, tokens, lane.stream),
        "scatter");
  }
  KVC_RETURN_IF_ERROR(in.readBy(lane.stream));
  return wrote(cache, lane, "scatter");
}

Status CudaDevice::copyRows(const PagedKVCache &from,
                            const BlockTable &fromTable, PagedKVCache &to,
                            const BlockTable &toTable, int64_t layer,
                            int64_t first, int64_t n) {
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
  KVC_CUDA_RETURN_IF_ERROR(cuda::copyRows(layout(from, layer, fromBlocks, lane),
                                          layout(to, layer, toBlocks, lane),
                                          first, n, lane.stream),
                           "copying rows");
  return wrote(to, lane, "copying rows");
}

Status CudaDevice::readBack(const PagedKVCache &cache, const BlockTable &table,
                            int64_t layer, int64_t first, int64_t n, float *k,
                            float *v) {
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

Status CudaDevice::settle(const PagedKVCache &cache) {
  if (cache.memory() != CacheMemory::Device)
    return Status::ok();
  return settleWrites(keyOf(cache));
}

StatusOr<std::shared_ptr<StreamSignal>> CudaDevice::streamWait(void *stream) {
  KVC_ASSIGN_OR_RETURN(driver, CudaDriver::get());
  KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                           "selecting the device");
  return waitWords_.wait(*driver, static_cast<CUstream>(stream));
}

StatusOr<double> CudaDevice::uploadGBs() {
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

StatusOr<double> CudaDevice::memoryGBs() {
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

Status CudaDevice::start() {
  KVC_ASSIGN_OR_RETURN(driver, CudaDriver::get());
  driver_ = driver;
  KVC_ASSIGN_OR_RETURN(lease, acquire());
  (void)lease;
  // Keep freed scratch pooled across synchronizations.
  cudaMemPool_t pool;
  KVC_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options_.device),
                           "the device's memory pool");
  uint64_t threshold = UINT64_MAX;
  return cudaStatus(cudaMemPoolSetAttribute(
                        pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                    "the device's memory pool");
}

StatusOr<CudaDevice::LaneLease> CudaDevice::acquire(LaneUse use) {
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
      if ((*at)->use == use && (*at)->user == self)
        return take(at);
    for (auto at = lanes_.begin(); at != lanes_.end(); ++at)
      if ((*at)->use == use && finished(cudaStreamQuery((*at)->stream)))
        return take(at);
  }
  KVC_ASSIGN_OR_RETURN(lane, Lane::create(options_.device, use));
  lane->id = laneCount_++;
  lane->user = self;
  return LaneLease(this, std::move(lane));
}

void CudaDevice::keepSpans(bool keep) {
  std::lock_guard<std::mutex> lock(spansMutex_);
  if (!keep) {
    keepers_ = std::max(0, keepers_ - 1);
    keepSpans_ = keepers_ > 0;
    return;
  }
  if (keepers_++ > 0)
    return;
  if ((!spanBase_ && cudaEventCreate(&spanBase_) != cudaSuccess) ||
      cudaEventRecord(spanBase_, DeviceArray::releaseStream()) != cudaSuccess ||
      cudaEventSynchronize(spanBase_) != cudaSuccess) {
    (void)cudaGetLastError();
    return; // No spans: traces of the host's tasks alone.
  }
  spanBaseHost_ = Clock::now();
  keepSpans_ = true;
}

std::vector<DeviceSpan> CudaDevice::takeSpans() {
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

StatusOr<int32_t *> CudaDevice::tableOn(Scratch &scratch,
                                        const BlockTable &table) {
  return scratch.copy(table.blocks.data(), int64_t(table.blocks.size()));
}

RowLayout CudaDevice::layout(const PagedKVCache &cache, int64_t layer,
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

const void *CudaDevice::keyOf(const PagedKVCache &cache) {
  return cache.config().layers > 0
             ? static_cast<const void *>(cache.keyCache(0))
             : &cache;
}

Status CudaDevice::afterWrites(const PagedKVCache &cache, const Lane &lane) {
  return afterWrites(keyOf(cache), lane);
}

Status CudaDevice::afterWrites(const void *key, const Lane &lane) {
  std::lock_guard<std::mutex> lock(writesMutex_);
  auto found = writes_.find(key);
  if (found == writes_.end())
    return Status::ok();
  const std::vector<cudaEvent_t> &events = found->second;
  for (size_t id = 0; id < events.size(); ++id)
    if (events[id] && int(id) != lane.id)
      KVC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.stream, events[id], 0),
                               "ordering a cache's calls");
  return Status::ok();
}

Status CudaDevice::wrote(const PagedKVCache &cache, const Lane &lane,
                         const char *what) {
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

Status CudaDevice::settleWrites(const void *key) {
  KVC_ASSIGN_OR_RETURN(lease, acquire());
  Lane &lane = *lease;
  // The lane's own earlier writes are behind it on its stream.
  KVC_RETURN_IF_ERROR(afterWrites(key, lane));
  return lane.sync("settling the cache");
}

void CudaDevice::forgetSettledCaches(const void *keep) {
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

StatusOr<std::vector<RowLayout>>
CudaDevice::layoutsOf(Scratch &scratch, const PagedKVCache &cache,
                      const BlockTable &table, const Lane &lane) {
  KVC_ASSIGN_OR_RETURN(blocks, tableOn(scratch, table));
  std::vector<RowLayout> layouts;
  for (int64_t l = 0; l < cache.config().layers; ++l)
    layouts.push_back(layout(cache, l, blocks, lane));
  return layouts;
}

} // namespace cuda

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
  auto device = std::make_unique<cuda::CudaDevice>(options);
  KVC_RETURN_IF_ERROR(device->start());
  return std::unique_ptr<Device>(std::move(device));
}

} // namespace kvc
