//===- CudaRunner.cpp - The model's work on the CUDA backend --------------===//
//
// Projections of stored hidden states, prefills into paged caches (whole or
// streamed layer by layer), decode steps and timed prefills, on the
// device's lanes over the model's weights in device memory (CudaModel.h),
// and the ModelRunner that serves them to plans and servers.
//
//===----------------------------------------------------------------------===//

#include "CudaDeviceImpl.h"

namespace kvc {
namespace cuda {

StatusOr<double> CudaDevice::project(const ModelCompute &model,
                                     const CudaModel &gpu,
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
    return internalError("project: the buffer does not hold the chunk's hidden "
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

Status CudaDevice::prefillInto(const ModelCompute &model, const CudaModel &gpu,
                               PagedKVCache &cache, const BlockTable &table,
                               const int32_t *tokens, int64_t position,
                               int64_t n, int64_t layers,
                               const ModelRunner::LayerWritten &written) {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  if (layers < 0)
    layers = model.config().numLayers;
  KVC_RETURN_IF_ERROR(cache.checkRange(table, 0, layers, 0, position + n));
  KVC_ASSIGN_OR_RETURN(lease, acquire(LaneUse::Compute));
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
CudaDevice::streamPrefill(const ModelCompute &model, const CudaModel &gpu,
                          int64_t tokens) {
  const ModelConfig &c = model.config();
  if (tokens <= 0 || tokens > c.maxPositions)
    return invalidArgument(
        "prefill stream: a request of " + std::to_string(tokens) +
        " tokens; the model's context holds " + std::to_string(c.maxPositions));
  PagedCacheConfig config{c.numLayers, c.numKvHeads,       c.headDim,
                          16,          (tokens + 15) / 16, 0};
  KVC_ASSIGN_OR_RETURN(cache, createCache(config));
  KVC_ASSIGN_OR_RETURN(table, cache->allocate(tokens));
  return std::unique_ptr<PrefillStream>(std::make_unique<Stream>(
      *this, gpu, std::move(cache), std::move(table), tokens));
}

Status CudaDevice::decode(const ModelCompute &model, const CudaModel &gpu,
                          PagedKVCache &cache, const BlockTable &table,
                          int64_t position, const int32_t *tokens, int64_t n,
                          float *logits, const ModelRunner::LayerGate &attend) {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  if (n <= 0)
    return invalidArgument("logits need at least one token");
  KVC_RETURN_IF_ERROR(
      cache.checkRange(table, 0, cache.config().layers, 0, position + n));
  KVC_ASSIGN_OR_RETURN(lease, acquire(LaneUse::Compute));
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
  KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits, out,
                                           size_t(vocab) * sizeof(float),
                                           cudaMemcpyDeviceToHost, lane.stream),
                           "device-to-host copy");
  return lane.sync("decode");
}

StatusOr<double> CudaDevice::timePrefill(const ModelCompute &model,
                                         const CudaModel &gpu,
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

StatusOr<std::unique_ptr<CudaModel>>
CudaDevice::borrowWeights(const ModelConfig &config,
                          const CudaLlamaWeights &weights) {
  KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device),
                           "selecting the device");
  return CudaModel::borrow(config, weights);
}

StatusOr<const CudaModel *> CudaDevice::modelFor(const ModelCompute &model) {
  const auto *llama = dynamic_cast<const LlamaModel *>(&model);
  if (!llama)
    return unimplemented(
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

GemmPrecision CudaDevice::precisionFor(const ModelCompute &model) const {
  return options_.gemm == CudaDeviceOptions::Gemm::F32    ? GemmPrecision::F32
         : options_.gemm == CudaDeviceOptions::Gemm::BF16 ? GemmPrecision::BF16
         : model.config().dtype == DType::F32             ? GemmPrecision::F32
                                                          : GemmPrecision::BF16;
}

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

} // namespace cuda

StatusOr<std::unique_ptr<ModelRunner>>
createCudaRunner(Device &device, const ModelCompute &model,
                 const CudaLlamaWeights &weights) {
  auto *cuda = dynamic_cast<cuda::CudaDevice *>(&device);
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
      std::make_unique<cuda::CudaRunner>(*cuda, model, std::move(gpu)));
}

} // namespace kvc
