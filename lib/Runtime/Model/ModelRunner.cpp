//===- ModelRunner.cpp - What every model runner shares -------------------===//
//
// The default PrefillStream: the model's own prefill over a host
// ModelCompute::Cache, which shows each layer as it computes it. Runners on
// a device whose memory is not the host's prefill there instead (the CUDA
// runner's stream copies each layer's rows back). And the refusals of a
// runner that launches no generated projections.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Model/ModelRunner.h"

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

Status ModelRunner::canLaunchProject(const BundleKernel &prologue,
                                     const BundleKernel &epilogue,
                                     const PagedKVCache &cache) const {
  (void)prologue, (void)epilogue, (void)cache;
  return unimplemented(std::string("the ") + device_.name() +
                       " device launches no generated projections");
}

StatusOr<double> ModelRunner::launchProject(const BundleKernel &prologue,
                                            const BundleKernel &epilogue,
                                            const DeviceBuffer &hidden,
                                            DType dtype, const ChunkBox &box,
                                            PagedKVCache &cache,
                                            const BlockTable &table) {
  (void)hidden, (void)dtype, (void)box, (void)table;
  return ModelRunner::canLaunchProject(prologue, epilogue, cache);
}

StatusOr<std::unique_ptr<PrefillStream>>
ModelRunner::streamPrefill(int64_t tokens) {
  return std::unique_ptr<PrefillStream>(
      std::make_unique<HostPrefillStream>(model_, tokens));
}

StatusOr<ModelCompute::Cache> fullPrefill(ModelRunner &runner,
                                          const std::vector<int32_t> &tokens) {
  const int64_t n = int64_t(tokens.size());
  ModelCompute::Cache cache = runner.model().newCache();
  if (n == 0)
    return cache;
  KVC_ASSIGN_OR_RETURN(stream, runner.streamPrefill(n));
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
