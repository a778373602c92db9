//===- ForwardingBackend.h - Test backends over the CPU one -----*- C++ -*-===//
//
// Tests' stand-ins for a device backend override what they change and
// forward the rest to the CPU backend.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_UNITTESTS_RUNTIME_FORWARDINGBACKEND_H
#define KVC_UNITTESTS_RUNTIME_FORWARDINGBACKEND_H

#include "kvc/Runtime/Backend/Backend.h"

#include <atomic>

namespace kvc {

class ForwardingBackend : public Backend {
public:
  const char *name() const override { return "forwarding"; }
  StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) override {
    return cpuBackend().createPools(lanes);
  }
  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override {
    return cpuBackend().createCache(config);
  }
  std::unique_ptr<DeviceBuffer> allocate() override {
    return cpuBackend().allocate();
  }
  Status upload(std::vector<uint16_t> &host, bool consume,
                DeviceBuffer &to) override {
    return cpuBackend().upload(host, consume, to);
  }
  StatusOr<double> project(const ModelCompute &model,
                           const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    return cpuBackend().project(model, hidden, dtype, box, kv);
  }
  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    return cpuBackend().scatter(kv, box, cache, table);
  }
  Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                     const BlockTable &table, const int32_t *tokens,
                     int64_t position, int64_t n, int64_t layers,
                     const LayerWritten &written) override {
    return cpuBackend().prefillInto(model, cache, table, tokens, position, n,
                                    layers, written);
  }
  Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                  PagedKVCache &to, const BlockTable &toTable, int64_t layer,
                  int64_t first, int64_t n) override {
    return cpuBackend().copyRows(from, fromTable, to, toTable, layer, first, n);
  }
  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override {
    return cpuBackend().readBack(cache, table, layer, first, n, k, v);
  }
  Status decode(const ModelCompute &model, PagedKVCache &cache,
                const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const LayerGate &attend) override {
    return cpuBackend().decode(model, cache, table, position, tokens, n, logits,
                               attend);
  }
  StatusOr<double> timePrefill(const ModelCompute &model,
                               const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    return cpuBackend().timePrefill(model, context, tokens, position, n);
  }
  StatusOr<double> uploadGBs() override { return cpuBackend().uploadGBs(); }
};

/// The CPU backend, its prefill streams counted (from any thread), or
/// refused with `refusal` when set.
class CountingBackend final : public ForwardingBackend {
public:
  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, int64_t tokens) override {
    ++streams;
    if (!refusal.isOk())
      return refusal;
    return Backend::streamPrefill(model, tokens);
  }
  std::atomic<int> streams{0};
  Status refusal;
};

} // namespace kvc

#endif // KVC_UNITTESTS_RUNTIME_FORWARDINGBACKEND_H
