//===- ServerRunner.h - A runner that prefills with the server's model ----===//
//
// The runner a Python server gives its Connector (Connector.prefill_with):
// what a plan computes or recomputes is prefilled by the server's own model
// (transformers' forward for kvc.transformers), called back from kvc's
// executor threads; projections, decode steps, streams and calibration
// stay the device's runner of kvc's model.
//
// The callback sees plain arrays, so that it can serve any cache a restore
// prefills into (the server's memory, or the restore's private exact
// context, PagedPrefill.cpp): it is given the context K and V the cache
// holds of the layers it computes, and returns the new tokens' K and V,
// which this runner writes into the cache (rounded to its dtype, as a
// server's cache write rounds them). Host caches only: a device cache's
// prefill stays the device's runner's.
//
// Threads: the callback runs with the GIL taken on the executor's thread;
// every call into the Connector that waits releases the GIL first
// (module.cpp), so the two never wait on each other.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PYTHON_SERVERRUNNER_H
#define KVC_PYTHON_SERVERRUNNER_H

#include "kvc/Runtime/Model/ModelRunner.h"

#include <nanobind/nanobind.h>

#include <memory>

namespace kvc::python {

class ServerRunner final : public ModelRunner {
public:
  ServerRunner(Device &device, const ModelCompute &model);
  ~ServerRunner() override;

  /// The server's prefill: called as fn(tokens, position, layers, past)
  /// with past[l] = (K, V) float32 arrays [position, kv_heads, head_dim]
  /// for each layer l < layers; returns a sequence of `layers` (K, V)
  /// pairs of [len(tokens), kv_heads, head_dim] float arrays. None: kvc's
  /// model prefills. Called with the GIL held.
  void setPrefill(nanobind::object fn);
  /// Prefills the callback served (for tests and reports).
  int64_t served() const;

  Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const LayerWritten &written) override;

  StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    return inner_->project(hidden, dtype, box, kv);
  }
  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue,
                          const PagedKVCache &cache) const override {
    return inner_->canLaunchProject(prologue, epilogue, cache);
  }
  StatusOr<double> launchProject(const BundleKernel &prologue,
                                 const BundleKernel &epilogue,
                                 const DeviceBuffer &hidden, DType dtype,
                                 const ChunkBox &box, PagedKVCache &cache,
                                 const BlockTable &table) override {
    return inner_->launchProject(prologue, epilogue, hidden, dtype, box, cache,
                                 table);
  }
  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(int64_t tokens) override {
    return inner_->streamPrefill(tokens);
  }
  Status decode(PagedKVCache &cache, const BlockTable &table,
                int64_t position, const int32_t *tokens, int64_t n,
                float *logits, const LayerGate &attend) override {
    return inner_->decode(cache, table, position, tokens, n, logits, attend);
  }
  StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    return inner_->timePrefill(context, tokens, position, n);
  }

private:
  /// Calls the callback (GIL taken) and writes what it returns.
  Status serve(PagedKVCache &cache, const BlockTable &table,
               const int32_t *tokens, int64_t position, int64_t n,
               int64_t layers);

  std::unique_ptr<ModelRunner> inner_;
  /// The callback (a Python object: read and replaced with the GIL held).
  nanobind::object prefill_;
  int64_t served_ = 0; ///< Under the GIL too.
};

} // namespace kvc::python

#endif // KVC_PYTHON_SERVERRUNNER_H
