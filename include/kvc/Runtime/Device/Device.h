//===- Device.h - The memory a KV cache lives in ----------------*- C++ -*-===//
//
// The executor decides what happens to each chunk and when (the plan's
// tasks on resource lanes); a Device does the part that touches the memory
// the KV cache lives in, through a few primitives:
//
//   createPools   the worker pools a plan's tasks run on (host threads for
//                 tiers and decoding, the device's queues for copies and
//                 compute)
//   createCache   a paged KV cache in device memory (cacheFor: one sized
//                 for a request)
//   allocate      device buffers for chunks in flight (staging slots)
//   hostMemory    host memory its uploads read in place (pinned on CUDA),
//                 which staging slots decode chunks into (HostWords.h)
//   upload        host staging -> device          (transfer_to_device)
//   scatter       a chunk's K and V -> the paged cache through the block
//                 table                           (scatter)
//   copyRows      rows of one paged cache into another
//   readBack      K and V of cached rows -> host fp32 (verification)
//   launchRestore a plan bundle's generated restore kernel: chunks' stored
//                 payloads (quantized, transformed) -> the paged cache, in
//                 one launch (dequant, untransform, scatter; KernelAbi.h)
//   launchSave    a bundle's generated save kernel: K and V of the cache ->
//                 stored objects' payloads on the host, in one launch
//                 (gather, transform, quant)
//   settle        the host waits until what calls enqueued into a cache is
//                 done (a call may return before its work is: the CUDA
//                 device orders its queues by events)
//   streamWait    a stream of the caller's (a server's forward pass) made
//                 to wait, without blocking the host, until the host
//                 raises a signal (a restored layer)
//   keepSpans, takeSpans
//                 the device's own timing of its work, for traces
//   uploadGBs, memoryGBs
//                 what calibration measures of the device itself
//   createRunner  the device's ModelRunner for a model (ModelRunner.h):
//                 the model's work — projection, prefill, decode — there
//
// A backend is a driver and what it opens: "cpu" (lib/Runtime/Cpu: host
// memory, the model's own compute) and "cuda" (lib/Runtime/Cuda), side by
// side, found by name (Registry.h). Fetching and host-side decoding stay in
// the executor: they run on host threads whatever the device. A device that
// launches generated kernels gets chunks whose plan names one still encoded
// (only their lossless stage undone on the host); the others arrive
// decoded to bf16.
//
// Ordering: a call that reads what an earlier call wrote (a scatter of an
// uploaded chunk, a prefill attending to scattered rows) runs after it on
// the device, on whichever queue either ran; a call that hands results to
// the host (readBack, launchSave, a prefill stream's layers, a runner's
// logits) and an upload (whose host memory the caller reuses) return once
// their work is done. The others may return as soon as their work is
// enqueued: the host learns it is done in the cache through settle, which
// the executor calls where the host must know (a layer reported restored,
// the end of a restore).
//
// Ownership: buffers, caches and runners a device returns are the caller's
// and may outlive nothing but the device. Every call is thread-safe;
// concurrent restores share one device.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_DEVICE_H
#define KVC_RUNTIME_DEVICE_DEVICE_H

#include "kvc/Runtime/Device/HostWords.h"
#include "kvc/Runtime/Device/Kernel.h"
#include "kvc/Runtime/Device/PagedKVCache.h"
#include "kvc/Runtime/Device/TaskGraph.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvc {

class ModelCompute;
class ModelRunner;

/// What a device stream waits on (Device::streamWait): raised once, by the
/// host, from any thread; raised on destruction if not before, so that no
/// stream is left waiting on a signal nobody holds.
class StreamSignal {
public:
  virtual ~StreamSignal() = default;
  /// Lets the stream go on. Idempotent.
  virtual void raise() = 0;
};

/// Device memory holding one chunk in flight.
class DeviceBuffer {
public:
  virtual ~DeviceBuffer() = default;
  /// Bytes it holds now (buffers grow to the largest chunk they held).
  virtual int64_t bytes() const = 0;
};

/// Tokens [tokenBegin, tokenEnd) x layers [layerBegin, layerEnd) of a
/// request: the box of one chunk.
struct ChunkBox {
  int64_t tokenBegin = 0, tokenEnd = 0;
  int64_t layerBegin = 0, layerEnd = 0;
  int64_t tokens() const { return tokenEnd - tokenBegin; }
  int64_t layers() const { return layerEnd - layerBegin; }
};

/// One chunk of a generated restore kernel's launch: its stored payload
/// after the lossless stage (ChunkObjects::payload, the objects back to
/// back), uploaded, and its box.
struct RestoreChunk {
  const DeviceBuffer *payload = nullptr;
  ChunkBox box;
};

class Device {
public:
  virtual ~Device() = default;

  /// The backend's name ("cpu", "cuda", ...).
  virtual const char *name() const = 0;

  /// Worker pools with `lanes` workers per resource (Vocabulary.h's pool
  /// names): host threads for tiers and decoding, the device's queues for
  /// copies and compute.
  virtual StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) = 0;

  /// A paged KV cache in this device's memory, holding `config`.
  virtual StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) = 0;

  /// A cache of this device's (createCache) just large enough for `tokens`
  /// tokens of `model`'s KV, and the table that holds them in it.
  StatusOr<std::pair<std::unique_ptr<PagedKVCache>, BlockTable>>
  cacheFor(const ModelConfig &model, int64_t tokens);

  /// An empty device buffer; upload and a runner's project size it.
  virtual std::unique_ptr<DeviceBuffer> allocate() = 0;

  /// Host memory that staging slots decode chunks into, kept across
  /// restores (KeptHostMemory): on CUDA page-locked, which upload reads
  /// without staging it first; the CPU's keeps the heap's. Null: the heap's,
  /// not kept.
  virtual HostMemory *hostMemory() { return nullptr; }

  /// Copies `host`'s 16-bit words into `to`. When `consume` is set the
  /// caller gives the words up, and a device that is host memory takes
  /// them instead of copying (leaving in `host` what `to` held before, for
  /// the caller to reuse).
  virtual Status upload(HostWords &host, bool consume, DeviceBuffer &to) = 0;

  /// Writes the box's K and V (bf16, per layer K then V, [tokens][kvDim]
  /// each: as ModelRunner::project writes them) into `cache` through
  /// `table`.
  virtual Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                         PagedKVCache &cache, const BlockTable &table) = 0;

  /// Copies rows first.. first+n of `layer` from one cache of this device
  /// to another (same model).
  virtual Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                          PagedKVCache &to, const BlockTable &toTable,
                          int64_t layer, int64_t first, int64_t n) = 0;

  /// K and V of tokens [first, first + n) of `layer`, as fp32 on the host.
  virtual Status readBack(const PagedKVCache &cache, const BlockTable &table,
                          int64_t layer, int64_t first, int64_t n, float *k,
                          float *v) = 0;

  /// Whether the device launches generated restore kernels (launchRestore).
  /// The CPU device does not: its decode lanes decode chunks completely,
  /// as CPU targets price them.
  virtual bool launchesKernels() const { return false; }

  /// Whether launchRestore can run `kernel` into `cache`: ok, or why not
  /// (a kernel of another shape, a cache the kernel cannot address).
  virtual Status canLaunch(const BundleKernel &kernel,
                           const PagedKVCache &cache) const {
    (void)kernel, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " device launches no generated kernels");
  }

  /// Runs the generated restore kernel `kernel` over `chunks` in one launch
  /// (KernelAbi.h's chunk table): it dequantizes and untransforms each
  /// chunk's payload and writes its box's K and V into `cache` through
  /// `table`.
  virtual Status launchRestore(const BundleKernel &kernel,
                               const std::vector<RestoreChunk> &chunks,
                               PagedKVCache &cache, const BlockTable &table) {
    (void)chunks, (void)table;
    return Device::canLaunch(kernel, cache); // Unimplemented.
  }

  /// Whether launchSave can run `kernel` over `cache`: ok, or why not.
  virtual Status canLaunchSave(const BundleKernel &kernel,
                               const PagedKVCache &cache) const {
    (void)kernel, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " device launches no generated save kernels");
  }

  /// Runs the generated save kernel `kernel` over the K and V of `boxes` in
  /// `cache` (through `table`) in one launch: `payloads` gets, per box, the
  /// object it encodes, on the host, before its lossless stage
  /// (ChunkObjects::encodePayload ends it).
  virtual Status launchSave(const BundleKernel &kernel,
                            const PagedKVCache &cache, const BlockTable &table,
                            const std::vector<ChunkBox> &boxes,
                            std::vector<std::string> &payloads) {
    (void)table, (void)boxes, (void)payloads;
    return Device::canLaunchSave(kernel, cache);
  }

  /// Blocks until every write into `cache` that calls returned so far
  /// enqueued (on any of the device's queues) is done. DataLoss when one
  /// wrote a value an f16 cache cannot hold. A device whose calls finish
  /// their work before they return (the CPU's) has nothing to wait for.
  virtual Status settle(const PagedKVCache &cache) {
    (void)cache;
    return Status::ok();
  }

  /// Makes `stream` (this device's own handle of a stream: a cudaStream_t
  /// on CUDA) wait, without blocking the host, until the returned signal
  /// is raised; work the caller queues on it after this call runs after
  /// the raise. Unimplemented on a device without such waits (the CPU's),
  /// and Unavailable when none can be made now: the caller then waits on
  /// the host instead.
  virtual StatusOr<std::shared_ptr<StreamSignal>> streamWait(void *stream) {
    (void)stream;
    return unimplemented(std::string("the ") + name() +
                         " device has no stream waits");
  }

  /// Starts (or stops) keeping the spans of the device's own work, for a
  /// trace: every call's while any caller keeps them, whichever restore
  /// made it (keepSpans(true) and (false) pair up). takeSpans waits for the
  /// work kept and returns its spans, clearing them. A device whose work is
  /// the calling thread's (the CPU's) keeps none: the host tasks' spans are
  /// its.
  virtual void keepSpans(bool keep) { (void)keep; }
  virtual std::vector<DeviceSpan> takeSpans() { return {}; }

  /// Calibration: host-to-device copy bandwidth, GB/s.
  virtual StatusOr<double> uploadGBs() = 0;
  /// Calibration: the device memory's bandwidth, GB/s of bytes read plus
  /// written, which the steps on device memory (dequant, untransform,
  /// scatter) are priced at. By default the upload's: a device that is host
  /// memory.
  virtual StatusOr<double> memoryGBs() { return uploadGBs(); }

  /// A runner of `model` on this device (ModelRunner.h), which must outlive
  /// it. What the device needs of the model (its weights in device memory)
  /// is made on first use and kept while the device lives; a runner is
  /// cheap. A model the device cannot compute with gets a runner whose
  /// compute refuses with why, so that loads still run.
  virtual std::unique_ptr<ModelRunner>
  createRunner(const ModelCompute &model) = 0;
};

/// Keeps `device`'s spans while it lives, for a traced run (`on`).
class KeptSpans {
public:
  KeptSpans(Device &device, bool on) : device_(device), on_(on) {
    if (on_)
      device_.keepSpans(true);
  }
  /// Spans not taken (a run that failed) are dropped, not left for the
  /// next trace.
  ~KeptSpans() {
    if (!on_)
      return;
    if (!taken_)
      (void)device_.takeSpans();
    device_.keepSpans(false);
  }
  KeptSpans(const KeptSpans &) = delete;
  KeptSpans &operator=(const KeptSpans &) = delete;
  /// The spans kept so far (none when not on).
  std::vector<DeviceSpan> take() {
    if (!on_)
      return {};
    taken_ = true;
    return device_.takeSpans();
  }

private:
  Device &device_;
  bool on_, taken_ = false;
};

/// Settles `cache` on `device` when it goes (Device::settle), on every
/// path out of a scope: a restore that fails returns only once nothing it
/// enqueued still writes the cache.
class SettleOnExit {
public:
  SettleOnExit(Device &device, const PagedKVCache &cache)
      : device_(device), cache_(cache) {}
  ~SettleOnExit() { (void)device_.settle(cache_); }
  SettleOnExit(const SettleOnExit &) = delete;
  SettleOnExit &operator=(const SettleOnExit &) = delete;

private:
  Device &device_;
  const PagedKVCache &cache_;
};

/// The CPU device: host memory, compute the model's own (LlamaModel's
/// OpenBLAS GEMMs), uploads copies out of staging. One per process,
/// stateless (lib/Runtime/Cpu).
Device &cpuDevice();

/// `device`, or the CPU device where a caller gave none.
inline Device &deviceOr(Device *device) {
  return device ? *device : cpuDevice();
}

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_DEVICE_H
