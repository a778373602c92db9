//===- ModelRunner.h - A model's work on a device ---------------*- C++ -*-===//
//
// What a restore, a save and a server's forward pass ask of a model, on the
// device its KV cache lives in (Device.h). One runner per (device, model),
// made by the device (Device::createRunner), which wraps whatever model it
// is given: kvc's reference LlamaModel or a server's own ModelCompute.
//
//   project       hidden states -> K, V           (project; HCache)
//   launchProject a bundle's generated projection: RMSNorm prologue, the
//                 runner's K/V GEMM, RoPE/scatter epilogue: hidden states
//                 -> the paged cache              (project, scatter)
//   prefill       token ranges through the first k layers into the paged
//                 cache                           (chunk_compute; Cake):
//                 one session per restore, shared by every backend
//                 (PagedPrefill.cpp), over prefillInto and the device's
//                 copyRows
//   prefillInto   the model's layers over a paged cache
//   streamPrefill a request's prefill span by span, each layer's hidden
//                 states, K and V shown on the host as they are computed
//                 (a save's source; the full prefill verification holds
//                 restores against: fullPrefill)
//   decode        a decode step over a restored cache -> next-token logits
//   timePrefill   what calibration measures of the model's compute
//
// Thread-safe, as its device is. Prefill sessions and streams a runner
// returns may outlive nothing but the runner.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_MODELRUNNER_H
#define KVC_RUNTIME_MODEL_MODELRUNNER_H

#include "kvc/Runtime/Device/Device.h"
#include "kvc/Runtime/Model/ModelCompute.h"

#include <functional>
#include <memory>
#include <vector>

namespace kvc {

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

class ModelRunner {
public:
  ModelRunner(Device &device, const ModelCompute &model)
      : device_(device), model_(model) {}
  virtual ~ModelRunner() = default;

  Device &device() const { return device_; }
  const ModelCompute &model() const { return model_; }

  /// K and V (bf16, per layer K then V, [tokens][kvDim] each) of the box
  /// from its hidden states in `hidden` (per layer [tokens][hidden], in
  /// `dtype`), written to `kv`. Returns the FLOPs it took.
  virtual StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                                   const ChunkBox &box, DeviceBuffer &kv) = 0;

  /// Whether launchProject can run `prologue` (an RmsNorm kernel) and
  /// `epilogue` (a RopeScatter kernel) into `cache`: ok, or why not
  /// (kernels of another shape, a cache they cannot address, GEMMs in
  /// another precision than the prologue writes).
  virtual Status canLaunchProject(const BundleKernel &prologue,
                                  const BundleKernel &epilogue,
                                  const PagedKVCache &cache) const;

  /// HCache's projection through generated kernels: `prologue` normalizes
  /// the box's hidden states (`hidden`, uploaded, in `dtype`) to bf16, the
  /// runner's GEMM projects them to K and V (fp32), and `epilogue` rotates
  /// K, rounds both to bf16 and writes them into `cache` through `table`.
  /// Returns the FLOPs it took.
  virtual StatusOr<double>
  launchProject(const BundleKernel &prologue, const BundleKernel &epilogue,
                const DeviceBuffer &hidden, DType dtype, const ChunkBox &box,
                PagedKVCache &cache, const BlockTable &table);

  /// A prefill of `tokens` into `cache`, through prefillInto and the
  /// device's copyRows (PagedPrefill.cpp says how it keeps every box
  /// exact).
  std::unique_ptr<PrefillSession> prefill(const std::vector<int32_t> &tokens,
                                          PagedKVCache &cache,
                                          const BlockTable &table);

  /// Called with each layer, in order, once a prefill's K and V of it are
  /// in the cache, readable from other threads and device streams.
  using LayerWritten = std::function<void(int64_t layer)>;

  /// Runs `n` tokens at positions position.. through the first `layers`
  /// layers of the model, over `cache`, which holds tokens [0, position)
  /// of those layers through `table`: writes their K and V there, telling
  /// `written` (when set) as each layer's are.
  virtual Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                             const int32_t *tokens, int64_t position, int64_t n,
                             int64_t layers,
                             const LayerWritten &written = {}) = 0;

  /// A prefill stream for a request of at most `tokens` tokens. By default
  /// the model's own prefill over host vectors, which the CPU device runs;
  /// a device whose memory is not the host's prefills there.
  virtual StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(int64_t tokens);

  /// Called with each layer, in order, before a step's attention reads it
  /// from the cache; an error ends the step with it.
  using LayerGate = std::function<Status(int64_t layer)>;

  /// A decode step after a restore: runs `n` tokens at `position` through
  /// every layer over `cache` (which holds tokens [0, position) through
  /// `table`), writing their K and V, and the next-token logits ([vocab],
  /// host memory) after the last of them. A server's forward pass beside a
  /// restore gates each layer on the restore's writing it (`attend`:
  /// RestoreHandle::waitLayer); the step writes only rows position.. of
  /// each layer, which the restore does not.
  virtual Status decode(PagedKVCache &cache, const BlockTable &table,
                        int64_t position, const int32_t *tokens, int64_t n,
                        float *logits, const LayerGate &attend = {}) = 0;

  /// Calibration: seconds of one prefill of `n` tokens at `position` over a
  /// context holding the tokens before it (`context`, copied first, not
  /// timed).
  virtual StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                                       const std::vector<int32_t> &tokens,
                                       int64_t position, int64_t n) = 0;

private:
  Device &device_;
  const ModelCompute &model_;
};

/// A full prefill of `tokens` through `runner` (streamPrefill, in one
/// span): every layer's K and V, what verification holds a restore against.
StatusOr<ModelCompute::Cache> fullPrefill(ModelRunner &runner,
                                          const std::vector<int32_t> &tokens);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_MODELRUNNER_H
