//===- CpuDevice.cpp - The CPU backend ------------------------------------===//
//
// The device is host memory: device buffers are vectors, an upload is a
// copy out of staging (or takes the staging buffer when the chunk owns it),
// the paged cache is PagedKVCache's own memory. Its runner computes with
// the model itself (any ModelCompute: LlamaModel's OpenBLAS on the pools'
// "compute" worker, or a server's own), attending over the paged cache
// itself (PagedContext).
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Model/ModelRunner.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Half.h"

#include <algorithm>
#include <cstring>

namespace kvc {

namespace {

/// A request's paged cache as a prefill's attention context: appends write
/// blocks, reads convert one run of rows at a time into scratch. With a
/// gate (not owned), each layer is first opened through it
/// (ModelRunner::LayerGate).
class PagedContext final : public KVContext {
public:
  PagedContext(PagedKVCache &cache, const BlockTable &table,
               const ModelRunner::LayerGate *gate = nullptr)
      : cache_(cache), table_(table), gate_(gate && *gate ? gate : nullptr) {}

  Status append(int64_t layer, int64_t position, int64_t n, const float *k,
                const float *v) override {
    KVC_RETURN_IF_ERROR(open(layer));
    return cache_.write(table_, layer, position, n, k, v);
  }
  Status rows(int64_t layer, int64_t first, int64_t count,
              KeyValueRows &out) override {
    KVC_RETURN_IF_ERROR(open(layer));
    k_.resize(count * cache_.kvDim());
    v_.resize(count * cache_.kvDim());
    KVC_RETURN_IF_ERROR(
        cache_.read(table_, layer, first, count, k_.data(), v_.data()));
    out = {k_.data(), v_.data()};
    return Status::ok();
  }

private:
  /// Passes the gate for every layer up to `layer` not yet opened.
  Status open(int64_t layer) {
    for (; gate_ && opened_ < layer; ++opened_)
      KVC_RETURN_IF_ERROR((*gate_)(opened_ + 1));
    return Status::ok();
  }

  PagedKVCache &cache_;
  const BlockTable &table_;
  const ModelRunner::LayerGate *gate_;
  int64_t opened_ = -1;
  std::vector<float> k_, v_;
};

/// A device buffer in host memory.
class HostBuffer final : public DeviceBuffer {
public:
  int64_t bytes() const override {
    return int64_t(words.capacity() * sizeof(uint16_t));
  }
  /// Kept across restores, as staging is: a projection's output does not
  /// fault in afresh per chunk buffer.
  HostWords words{&keptHeapMemory()};
};

const HostWords &wordsOf(const DeviceBuffer &buffer) {
  return static_cast<const HostBuffer &>(buffer).words;
}
HostWords &wordsOf(DeviceBuffer &buffer) {
  return static_cast<HostBuffer &>(buffer).words;
}

/// 16-bit words per element of `dtype`.
int64_t wordsPer(DType dtype) { return dtype == DType::F32 ? 2 : 1; }

/// `n` elements of `dtype` at `words` as floats.
void toFloats(const uint16_t *words, int64_t n, DType dtype, float *out) {
  if (dtype == DType::F32) {
    std::memcpy(out, words, size_t(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] =
        dtype == DType::BF16 ? bf16ToFloat(words[i]) : f16ToFloat(words[i]);
}

/// The model's own compute over host memory.
class CpuRunner final : public ModelRunner {
public:
  using ModelRunner::ModelRunner;

  /// Layer by layer, fp32 in the projection, bf16 out.
  StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    const ModelCompute &model = this->model();
    const int64_t tokens = box.tokens();
    const int64_t h = model.config().hiddenSize, kvDim = model.kvDim();
    const HostWords &in = wordsOf(hidden);
    if (int64_t(in.size()) != box.layers() * tokens * h * wordsPer(dtype))
      return internalError(
          "project: the buffer does not hold the chunk's hidden "
          "states");
    HostWords &out = wordsOf(kv);
    out.resizeForOverwrite(box.layers() * 2 * tokens * kvDim);
    std::vector<float> states(tokens * h), k(tokens * kvDim), v(tokens * kvDim);
    for (int64_t l = 0; l < box.layers(); ++l) {
      toFloats(in.data() + l * tokens * h * wordsPer(dtype), tokens * h, dtype,
               states.data());
      model.project(box.layerBegin + l, states.data(), tokens, box.tokenBegin,
                    k.data(), v.data());
      uint16_t *kOut = out.data() + (2 * l) * tokens * kvDim;
      uint16_t *vOut = kOut + tokens * kvDim;
      for (int64_t i = 0; i < tokens * kvDim; ++i) {
        kOut[i] = floatToBf16(k[i]);
        vOut[i] = floatToBf16(v[i]);
      }
    }
    return model.projectFlops(tokens, box.layers());
  }

  Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const LayerWritten &written) override {
    const ModelCompute &model = this->model();
    PagedContext context(cache, table);
    if (!written)
      return model.prefill(context, position, tokens, n, {}, layers);
    // The model shows a layer before it appends the layer's K and V to the
    // context: layer l is written once layer l + 1 is shown.
    KVC_RETURN_IF_ERROR(model.prefill(
        context, position, tokens, n,
        [&](const LayerSnapshot &shown) {
          if (shown.layer > 0)
            written(shown.layer - 1);
        },
        layers));
    const int64_t last = (layers < 0 ? model.config().numLayers : layers) - 1;
    if (last >= 0)
      written(last);
    return Status::ok();
  }

  Status decode(PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const LayerGate &attend) override {
    PagedContext context(cache, table, &attend);
    return model().nextLogits(context, position, tokens, n, logits);
  }

  StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    const ModelCompute &model = this->model();
    if (position + n > int64_t(tokens.size()) || context.tokens < position)
      return invalidArgument("timePrefill: tokens " + std::to_string(position) +
                             " to " + std::to_string(position + n) +
                             " are not in the request or its context");
    ModelCompute::Cache cache = context;
    cache.tokens = position;
    for (auto *kv : {&cache.k, &cache.v})
      for (std::vector<float> &layer : *kv)
        layer.resize(position * model.kvDim());
    Clock::time_point start = Clock::now();
    KVC_RETURN_IF_ERROR(model.prefill(cache, tokens.data() + position, n));
    return secondsSince(start);
  }
};

class CpuDevice final : public Device {
public:
  const char *name() const override { return "cpu"; }

  StatusOr<std::unique_ptr<ResourcePools>>
  createPools(const std::map<std::string, int> &lanes) override {
    return ResourcePools::create(lanes);
  }

  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override {
    return PagedKVCache::create(config);
  }

  std::unique_ptr<DeviceBuffer> allocate() override {
    return std::make_unique<HostBuffer>();
  }

  /// The heap's, kept across restores.
  HostMemory *hostMemory() override { return &keptHeapMemory(); }

  Status upload(HostWords &host, bool consume, DeviceBuffer &to) override {
    HostWords &words = wordsOf(to);
    if (consume)
      words.swap(host);
    else
      words.assign(host.data(), host.size());
    return Status::ok();
  }

  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    const int64_t kvDim = cache.kvDim(), tokens = box.tokens();
    const HostWords &words = wordsOf(kv);
    if (int64_t(words.size()) != box.layers() * 2 * tokens * kvDim)
      return internalError(
          "scatter: the buffer does not hold the chunk's KV (a "
          "plan step is missing before it)");
    for (int64_t l = 0; l < box.layers(); ++l)
      KVC_RETURN_IF_ERROR(
          cache.write(table, box.layerBegin + l, box.tokenBegin, tokens,
                      words.data() + (2 * l) * tokens * kvDim,
                      words.data() + (2 * l + 1) * tokens * kvDim));
    return Status::ok();
  }

  Status copyRows(const PagedKVCache &from, const BlockTable &fromTable,
                  PagedKVCache &to, const BlockTable &toTable, int64_t layer,
                  int64_t first, int64_t n) override {
    std::vector<float> k(n * from.kvDim()), v(n * from.kvDim());
    KVC_RETURN_IF_ERROR(
        from.read(fromTable, layer, first, n, k.data(), v.data()));
    return to.write(toTable, layer, first, n, k.data(), v.data());
  }

  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override {
    return cache.read(table, layer, first, n, k, v);
  }

  /// Single-thread copy bandwidth: the CPU device's "link" and memory.
  StatusOr<double> uploadGBs() override {
    std::vector<char> from(size_t(256) << 20, 1), to(from.size());
    double seconds =
        bestOf(3, [&] { std::memcpy(to.data(), from.data(), from.size()); });
    return double(from.size()) / seconds / 1e9;
  }

  std::unique_ptr<ModelRunner>
  createRunner(const ModelCompute &model) override {
    return std::make_unique<CpuRunner>(*this, model);
  }
};

} // namespace

Device &cpuDevice() {
  static CpuDevice device;
  return device;
}

} // namespace kvc
