//===- ForwardingDevice.h - Test devices over the CPU one -------*- C++ -*-===//
//
// Tests' stand-ins for a device override what they change and forward the
// rest to the CPU device. Their model work is the device's too, as a
// driver's runner runs on its device's internals (CudaRunner): the runner a
// ForwardingDevice makes calls the device's model methods below, which
// forward to the CPU device's runner unless a test overrides them.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_UNITTESTS_RUNTIME_FORWARDINGDEVICE_H
#define KVC_UNITTESTS_RUNTIME_FORWARDINGDEVICE_H

#include "kvc/Runtime/Model/ModelRunner.h"

#include <atomic>

namespace kvc {

class ForwardingDevice : public Device {
public:
  using LayerWritten = ModelRunner::LayerWritten;
  using LayerGate = ModelRunner::LayerGate;

  const char *name() const override { return "forwarding"; }
  StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) override {
    return cpuDevice().createPools(lanes);
  }
  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override {
    return cpuDevice().createCache(config);
  }
  std::unique_ptr<DeviceBuffer> allocate() override {
    return cpuDevice().allocate();
  }
  HostMemory *hostMemory() override { return cpuDevice().hostMemory(); }
  Status upload(HostWords &host, bool consume, DeviceBuffer &to) override {
    return cpuDevice().upload(host, consume, to);
  }
  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    return cpuDevice().scatter(kv, box, cache, table);
  }
  Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                  PagedKVCache &to, const BlockTable &toTable, int64_t layer,
                  int64_t first, int64_t n) override {
    return cpuDevice().copyRows(from, fromTable, to, toTable, layer, first, n);
  }
  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override {
    return cpuDevice().readBack(cache, table, layer, first, n, k, v);
  }
  StatusOr<double> uploadGBs() override { return cpuDevice().uploadGBs(); }

  std::unique_ptr<ModelRunner> createRunner(const ModelCompute &model) override;

  // The model's work (ModelRunner's, with the model first).
  virtual StatusOr<double> project(const ModelCompute &model,
                                   const DeviceBuffer &hidden, DType dtype,
                                   const ChunkBox &box, DeviceBuffer &kv) {
    return cpuDevice().createRunner(model)->project(hidden, dtype, box, kv);
  }
  virtual Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                             const BlockTable &table, const int32_t *tokens,
                             int64_t position, int64_t n, int64_t layers,
                             const LayerWritten &written) {
    return cpuDevice().createRunner(model)->prefillInto(
        cache, table, tokens, position, n, layers, written);
  }
  virtual StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, int64_t tokens);
  virtual Status decode(const ModelCompute &model, PagedKVCache &cache,
                        const BlockTable &table, int64_t position,
                        const int32_t *tokens, int64_t n, float *logits,
                        const LayerGate &attend) {
    return cpuDevice().createRunner(model)->decode(cache, table, position,
                                                   tokens, n, logits, attend);
  }
  virtual StatusOr<double> timePrefill(const ModelCompute &model,
                                       const ModelCompute::Cache &context,
                                       const std::vector<int32_t> &tokens,
                                       int64_t position, int64_t n) {
    return cpuDevice().createRunner(model)->timePrefill(context, tokens,
                                                        position, n);
  }
  virtual Status canLaunchProject(const BundleKernel &prologue,
                                  const BundleKernel &epilogue,
                                  const ModelCompute &model,
                                  const PagedKVCache &cache) const {
    (void)prologue, (void)epilogue, (void)model, (void)cache;
    return unimplemented(std::string("the ") + name() +
                         " device launches no generated projections");
  }
  virtual StatusOr<double>
  launchProject(const BundleKernel &prologue, const BundleKernel &epilogue,
                const ModelCompute &model, const DeviceBuffer &hidden,
                DType dtype, const ChunkBox &box, PagedKVCache &cache,
                const BlockTable &table) {
    (void)hidden, (void)dtype, (void)box, (void)table;
    return ForwardingDevice::canLaunchProject(prologue, epilogue, model, cache);
  }
};

/// A ForwardingDevice's runner: its device's model methods.
class ForwardingRunner final : public ModelRunner {
public:
  ForwardingRunner(ForwardingDevice &device, const ModelCompute &model)
      : ModelRunner(device, model), device_(device) {}

  StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    return device_.project(model(), hidden, dtype, box, kv);
  }
  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue,
                          const PagedKVCache &cache) const override {
    return device_.canLaunchProject(prologue, epilogue, model(), cache);
  }
  StatusOr<double> launchProject(const BundleKernel &prologue,
                                 const BundleKernel &epilogue,
                                 const DeviceBuffer &hidden, DType dtype,
                                 const ChunkBox &box, PagedKVCache &cache,
                                 const BlockTable &table) override {
    return device_.launchProject(prologue, epilogue, model(), hidden, dtype,
                                 box, cache, table);
  }
  Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const LayerWritten &written) override {
    return device_.prefillInto(model(), cache, table, tokens, position, n,
                               layers, written);
  }
  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(int64_t tokens) override {
    return device_.streamPrefill(model(), tokens);
  }
  Status decode(PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const LayerGate &attend) override {
    return device_.decode(model(), cache, table, position, tokens, n, logits,
                          attend);
  }
  StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    return device_.timePrefill(model(), context, tokens, position, n);
  }

private:
  ForwardingDevice &device_;
};

inline std::unique_ptr<ModelRunner>
ForwardingDevice::createRunner(const ModelCompute &model) {
  return std::make_unique<ForwardingRunner>(*this, model);
}

/// The CPU runner's stream, which holds the runner it came from.
inline StatusOr<std::unique_ptr<PrefillStream>>
ForwardingDevice::streamPrefill(const ModelCompute &model, int64_t tokens) {
  class Held final : public PrefillStream {
  public:
    Status next(const int32_t *tokens, int64_t n,
                const ModelCompute::LayerCallback &onLayer) override {
      return stream->next(tokens, n, onLayer);
    }
    std::unique_ptr<ModelRunner> runner;
    std::unique_ptr<PrefillStream> stream;
  };
  auto held = std::make_unique<Held>();
  held->runner = cpuDevice().createRunner(model);
  KVC_ASSIGN_OR_RETURN(stream, held->runner->streamPrefill(tokens));
  held->stream = std::move(stream);
  return std::unique_ptr<PrefillStream>(std::move(held));
}

/// The CPU device, its prefill streams counted (from any thread), or
/// refused with `refusal` when set.
class CountingDevice final : public ForwardingDevice {
public:
  /// The heap's, counted, as a device's own host memory.
  class CountingMemory final : public HostMemory {
  public:
    void *allocate(std::size_t bytes) override {
      ++allocations;
      return heapMemory().allocate(bytes);
    }
    void deallocate(void *block, std::size_t bytes) override {
      heapMemory().deallocate(block, bytes);
    }
    std::atomic<int> allocations{0};
  };

  std::unique_ptr<DeviceBuffer> allocate() override {
    ++allocations;
    return ForwardingDevice::allocate();
  }
  HostMemory *hostMemory() override { return &memory; }
  /// Copies, as a GPU's upload does, and counts where from.
  Status upload(HostWords &host, bool, DeviceBuffer &to) override {
    ++(host.owner() == &memory ? uploadsFromItsMemory : otherUploads);
    return ForwardingDevice::upload(host, /*consume=*/false, to);
  }
  CountingMemory memory;
  std::atomic<int> uploadsFromItsMemory{0}, otherUploads{0};

  /// A device with a clock of its own: each scatter kept as a span of the
  /// queue of the scatter's layers, while spans are kept.
  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    Clock::time_point start = Clock::now();
    Status status = ForwardingDevice::scatter(kv, box, cache, table);
    std::lock_guard<std::mutex> lock(spansMutex_);
    if (keep_)
      spans_.push_back({"scatter " + std::to_string(box.tokenBegin),
                        int(box.layerBegin), start, Clock::now()});
    return status;
  }
  void keepSpans(bool keep) override {
    std::lock_guard<std::mutex> lock(spansMutex_);
    keep_ = keep;
    ++keptSpans;
  }
  std::vector<DeviceSpan> takeSpans() override {
    std::lock_guard<std::mutex> lock(spansMutex_);
    return std::move(spans_);
  }
  int keptSpans = 0; ///< keepSpans calls.
  StatusOr<std::unique_ptr<PrefillStream>>
  streamPrefill(const ModelCompute &model, int64_t tokens) override {
    ++streams;
    if (!refusal.isOk())
      return refusal;
    return ForwardingDevice::streamPrefill(model, tokens);
  }
  std::atomic<int> streams{0}, allocations{0};
  Status refusal;

private:
  std::mutex spansMutex_;
  bool keep_ = false;
  std::vector<DeviceSpan> spans_;
};

} // namespace kvc

#endif // KVC_UNITTESTS_RUNTIME_FORWARDINGDEVICE_H
