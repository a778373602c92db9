//===- Backend.h - The device side of a restore -----------------*- C++ -*-===//
//
// The executor decides what happens to each chunk and when (the plan's
// tasks on resource lanes); a Backend does the part that touches the
// device the KV cache lives on:
//
//   lanes         the worker pools a plan's tasks run on
//   createCache   a paged KV cache in device memory (cacheFor: one sized
//                 for a request)
//   allocate      device buffers for chunks in flight (staging slots)
//   upload        host staging -> device          (transfer_to_device)
//   project       hidden states -> K, V           (project; HCache)
//   prefill       token ranges through the first k layers into the paged
//                 cache                           (chunk_compute; Cake):
//                 one session per restore, shared by every backend
//                 (PagedPrefill.cpp), over the two calls below
//   prefillInto   a model's layers over a paged cache
//   copyRows      rows of one paged cache into another
//   scatter       a chunk's K and V -> the paged cache through the block
//                 table                           (scatter)
//   launchRestore a plan bundle's generated restore kernel: chunks'
//                 stored payloads (quantized, transformed) -> the paged
//                 cache, in one launch            (dequant, untransform,
//                                                  scatter; KernelAbi.h)
//   launchSave    a bundle's generated save kernel: K and V of the cache
//                 -> stored objects' payloads on the host, in one launch
//                                                 (gather, transform, quant)
//   launchProject a bundle's generated projection: RMSNorm prologue, the
//                 backend's K/V GEMM, RoPE/scatter epilogue: hidden
//                 states -> the paged cache       (project, scatter)
//   streamPrefill a request's prefill span by span, each layer's hidden
//                 states, K and V shown on the host as they are computed
//                 (a save's source; the full prefill verification holds
//                 restores against: fullPrefill)
//   readBack      K and V of cached rows -> host fp32 (verification)
//   decode        a decode step over the restored cache -> next-token
//                 logits (what the model says after a restore)
//   timePrefill, uploadGBs, memoryGBs
//                 what calibration measures of the backend itself
//
// Fetching and host-side decoding stay in the executor: they run on host
// threads whatever the device. A backend that launches generated kernels
// gets chunks whose plan names one still encoded (only their lossless
// stage undone on the host); the others arrive decoded to bf16. The model a
// backend computes with is a ModelCompute, kvc's reference model or a server's
// own.
//
// Ownership: buffers, caches and prefill sessions a backend returns are the
// caller's and may outlive nothing but the backend. Every call is
// thread-safe; concurrent restores share one backend.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BACKEND_BACKEND_H
#define KVC_RUNTIME_BACKEND_BACKEND_H

#include "kvc/Runtime/Device/PagedKVCache.h"
#include "kvc/Runtime/Device/Kernel.h"
#include "kvc/Runtime/Device/TaskGraph.h"
#include "kvc/Runtime/Model/ModelCompute.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvc {

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

/// One request's prefill into its paged cache: the computed part of a
/// restore, and the exact recompute of chunks that could not be loaded.
/// Thread-safe.
class PrefillSession {
public:
  virtual ~PrefillSession() = default;
  /// Writes exact K and V of the box's tokens and layers into the cache.
  virtual Status compute(const ChunkBox &box) = 0;
  /// FLOPs of the projections and MLPs prefilled so far.
  virtual double flops() const = 0;
  /// Bytes of any private exact context the session had to hold.
  virtual int64_t exactContextBytes() const = 0;
};

/// One request's prefill from its first token, span by span, showing each
/// layer's input hidden states, K and V on the host as it computes them:
/// what a save stores, and the full prefill restores are verified against.
class PrefillStream {
public:
  virtual ~PrefillStream() = default;
  /// Runs the request's next `n` tokens through every layer over the
  /// tokens before them, calling `onLayer` for each layer in order (its
  /// pointers valid during the call).
  virtual Status next(const int32_t *tokens, int64_t n,
                      const ModelCompute::LayerCallback &onLayer) = 0;
};

class Backend {
public:
  virtual ~Backend() = default;

  virtual const char *name() const = 0;

  /// Worker pools with `lanes` workers per resource (Vocabulary.h's pool
  /// names): host threads for tiers and decoding, the device's queues for
  /// copies and compute.
  virtual StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) = 0;

  /// A paged KV cache in this backend's memory, holding `config`.
  virtual StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) = 0;

  /// A cache of this backend's (createCache) just large enough for `tokens`
  /// tokens of `model`'s KV, and the table that holds them in it.
  StatusOr<std::pair<std::unique_ptr<PagedKVCache>, BlockTable>>
  cacheFor(const ModelConfig &model, int64_t tokens);

  /// An empty device buffer; upload and project size it.
  virtual std::unique_ptr<DeviceBuffer> allocate() = 0;

  /// Copies `words` 16-bit words of host memory into `to`. When `consume`
  /// is set the caller gives the host vector up, and a backend whose device
  /// is host memory takes it instead of copying.
  virtual Status upload(std::vector<uint16_t> &host, bool consume,
                        DeviceBuffer &to) = 0;

  /// K and V (bf16, per layer K then V, [tokens][kvDim] each) of the box
  /// from its hidden states in `hidden` (per layer [tokens][hidden], in
  /// `dtype`), written to `kv`. Returns the FLOPs it took.
  virtual StatusOr<double> project(const ModelCompute &model,
                                   const DeviceBuffer &hidden, DType dtype,
                                   const ChunkBox &box, DeviceBuffer &kv) = 0;

  /// Writes the box's K and V (bf16, laid out as project writes them) into
  /// `cache` through `table`.
  virtual Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                         PagedKVCache &cache, const BlockTable &table) = 0;

  /// Whether the backend launches generated restore kernels (launchRestore).
  /// The CPU backend does not: its decode lanes decode chunks completely,
  /// as CPU targets price them.
  virtual bool launchesKernels() const { return false; }

  /// Whether launchRestore can run `kernel` into `cache`: ok, or why not
  /// (a kernel of another shape, a cache the kernel cannot address).
  virtual Status canLaunch(const BundleKernel &kernel,
                           const PagedKVCache &cache) const {
    (void)kernel, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " backend launches no generated kernels");
  }

  /// Runs the generated restore kernel `kernel` over `chunks` in one launch
  /// (KernelAbi.h's chunk table): it dequantizes and untransforms each
  /// chunk's payload and writes its box's K and V into `cache` through
  /// `table`.
  virtual Status launchRestore(const BundleKernel &kernel,
                               const std::vector<RestoreChunk> &chunks,
                               PagedKVCache &cache, const BlockTable &table) {
    (void)chunks, (void)table;
    return Backend::canLaunch(kernel, cache); // Unimplemented.
  }

  /// Whether launchSave can run `kernel` over `cache`: ok, or why not.
  virtual Status canLaunchSave(const BundleKernel &kernel,
                               const PagedKVCache &cache) const {
    (void)kernel, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " backend launches no generated save kernels");
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
    return Backend::canLaunchSave(kernel, cache);
  }

  /// Whether launchProject can run `prologue` (an RmsNorm kernel) and
  /// `epilogue` (a RopeScatter kernel) for `model` into `cache`: ok, or why
  /// not (kernels of another shape, a cache they cannot address, GEMMs in
  /// another precision than the prologue writes).
  virtual Status canLaunchProject(const BundleKernel &prologue,
                                  const BundleKernel &epilogue,
                                  const ModelCompute &model,
                                  const PagedKVCache &cache) const {
    (void)prologue, (void)epilogue, (void)model, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " backend launches no generated projections");
  }

  /// HCache's projection through generated kernels: `prologue` normalizes
  /// the box's hidden states (`hidden`, uploaded, in `dtype`) to bf16, the
  /// backend's GEMM projects them to K and V (fp32), and `epilogue` rotates
  /// K, rounds both to bf16 and writes them into `cache` through `table`.
  /// Returns the FLOPs it took.
  virtual StatusOr<double>
  launchProject(const BundleKernel &prologue, const BundleKernel &epilogue,
                const ModelCompute &model, const DeviceBuffer &hidden,
                DType dtype, const ChunkBox &box, PagedKVCache &cache,
                const BlockTable &table) {
    (void)hidden, (void)dtype, (void)box, (void)table;
    return Backend::canLaunchProject(prologue, epilogue, model, cache);
  }

  /// A prefill of `tokens` into `cache` with `model`, through prefillInto
  /// and copyRows (PagedPrefill.cpp says how it keeps every box exact).
  std::unique_ptr<PrefillSession> prefill(const ModelCompute &model,
                                          const std::vector<int32_t> &tokens,
                                          PagedKVCache &cache,
                                          const BlockTable &table);

  /// Called with each layer, in order, once a prefill's K and V of it are
  /// in the cache, readable from other threads and device streams.
  using LayerWritten = std::function<void(int64_t layer)>;

  /// Runs `n` tokens at positions position.. through the first `layers`
  /// layers of `model`, over `cache`, which holds tokens [0, position) of
  /// those layers through `table`: writes their K and V there, telling
  /// `written` (when set) as each layer's are.
  virtual Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                             const BlockTable &table, const int32_t *tokens,
                             int64_t position, int64_t n, int64_t layers,
                             const LayerWritten &written = {}) = 0;

  /// Copies rows first.. first+n of `layer` from one cache of this backend
  /// to another (same model).
  virtual Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                          PagedKVCache &to, const BlockTable &toTable,
                          int64_t layer, int64_t first, int64_t n) = 0;

  /// A prefill stream of `model` for a request of at most `tokens` tokens.
  /// By default the model's own prefill over host vectors, which the CPU
  /// backend runs; a device's backend prefills in its memory.
  virtual StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, int64_t tokens);

  /// K and V of tokens [first, first + n) of `layer`, as fp32 on the host.
  virtual Status readBack(const PagedKVCache &cache, const BlockTable &table,
                          int64_t layer, int64_t first, int64_t n, float *k,
                          float *v) = 0;

  /// Called with each layer, in order, before a step's attention reads it
  /// from the cache; an error ends the step with it.
  using LayerGate = std::function<Status(int64_t layer)>;

  /// A decode step after a restore: runs `n` tokens at `position` through
  /// every layer of `model` over `cache` (which holds tokens [0, position)
  /// through `table`), writing their K and V, and the next-token logits
  /// ([vocab], host memory) after the last of them. A server's forward pass
  /// beside a restore gates each layer on the restore's writing it
  /// (`attend`: RestoreHandle::waitLayer); the step writes only rows
  /// position.. of each layer, which the restore does not.
  virtual Status decode(const ModelCompute &model, PagedKVCache &cache,
                        const BlockTable &table, int64_t position,
                        const int32_t *tokens, int64_t n, float *logits,
                        const LayerGate &attend = {}) = 0;

  /// Calibration: seconds of one prefill of `n` tokens at `position` over a
  /// context holding the tokens before it (`context`, copied first, not
  /// timed).
  virtual StatusOr<double> timePrefill(const ModelCompute &model,
                                       const ModelCompute::Cache &context,
                                       const std::vector<int32_t> &tokens,
                                       int64_t position, int64_t n) = 0;
  /// Calibration: host-to-device copy bandwidth, GB/s.
  virtual StatusOr<double> uploadGBs() = 0;
  /// Calibration: the device memory's bandwidth, GB/s of bytes read plus
  /// written, which the steps on device memory (dequant, untransform,
  /// scatter) are priced at. By default the upload's: a device that is host
  /// memory.
  virtual StatusOr<double> memoryGBs() { return uploadGBs(); }
};

/// A full prefill of `tokens` on `backend` (streamPrefill, in one span):
/// every layer's K and V, what verification holds a restore against.
StatusOr<ModelCompute::Cache> fullPrefill(const ModelCompute &model,
                                          const std::vector<int32_t> &tokens,
                                          Backend &backend);

/// The CPU backend: the device is host memory, compute is the model's own
/// (LlamaModel's OpenBLAS GEMMs), uploads are copies out of staging. One
/// per process, stateless.
Backend &cpuBackend();

/// `backend`, or the CPU backend where a caller gave none.
inline Backend &backendOr(Backend *backend) {
  return backend ? *backend : cpuBackend();
}

} // namespace kvc

#endif // KVC_RUNTIME_BACKEND_BACKEND_H
