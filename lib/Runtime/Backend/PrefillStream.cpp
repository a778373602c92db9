//===- PrefillStream.cpp - A request's prefill on the host ----------------===//
//
// The default PrefillStream: the model's own prefill over a host
// ModelCompute::Cache, which shows each layer as it computes it. Backends
// whose device is not host memory prefill there instead (the CUDA backend's
// stream copies each layer's rows back).
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Backend/Backend.h"

namespace kvc {

namespace {

class HostPrefillStream final : public PrefillStream {
public:
  HostPrefillStream(const ModelCompute &model, int64_t capacity)
      : model_(model), cache_(model.newCache()), capacity_(capacity) {}

  Status next(const int32_t *tokens, int64_t n,
              const ModelCompute::LayerCallback &onLayer) override {
    if (cache_.tokens + n > capacity_)
      return invalidArgument(
          "prefill stream: " + std::to_string(cache_.tokens + n) +
          " tokens exceed the request's " + std::to_string(capacity_));
    return model_.prefill(cache_, tokens, n, onLayer);
  }

private:
  const ModelCompute &model_;
  ModelCompute::Cache cache_;
  int64_t capacity_;
};

} // namespace

StatusOr<std::unique_ptr<PrefillStream>>
Backend::streamPrefill(const ModelCompute &model, int64_t tokens) {
  return std::unique_ptr<PrefillStream>(
      std::make_unique<HostPrefillStream>(model, tokens));
}

StatusOr<ModelCompute::Cache> fullPrefill(const ModelCompute &model,
                                          const std::vector<int32_t> &tokens,
                                          Backend &backend) {
  const int64_t n = int64_t(tokens.size());
  ModelCompute::Cache cache = model.newCache();
  if (n == 0)
    return cache;
  KVC_ASSIGN_OR_RETURN(stream, backend.streamPrefill(model, n));
  Status appended;
  KVC_RETURN_IF_ERROR(
      stream->next(tokens.data(), n, [&](const LayerSnapshot &s) {
        if (appended.isOk())
          appended = cache.append(s.layer, s.position, s.tokens, s.k, s.v);
      }));
  KVC_RETURN_IF_ERROR(appended);
  cache.tokens = n;
  return cache;
}

} // namespace kvc
