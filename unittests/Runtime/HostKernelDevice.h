//===- HostKernelDevice.h - A kernel-launching host device -----*- C++ -*-===//
//
// For tests of the executor's side of generated kernels without a GPU: a
// backend that "launches" a kernel by doing what the generated code does
// (KernelJitTest shows it equals decodeChunkToBf16 bit for bit) through the
// kernel's ABI (KernelAbi.h), over host memory laid out as the CUDA backend
// lays out its cache. Used by KernelLaunchTest (restores and saves) and
// ReceiveKernelsTest (a transfer's receive plan).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_UNITTESTS_RUNTIME_HOSTKERNELDEVICE_H
#define KVC_UNITTESTS_RUNTIME_HOSTKERNELDEVICE_H

#include "ExecutorFixture.h"
#include "ForwardingDevice.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"

#include <atomic>
#include <cstring>

namespace kvc::exec_test {

/// Host memory as a device: buffers of its own, uploads counted.
class HostBuffer final : public DeviceBuffer {
public:
  int64_t bytes() const override { return int64_t(words.size() * 2); }
  std::vector<uint16_t> words;
};

/// The CPU backend's compute, with kernels launched as the generated code
/// computes them and a cache in one allocation, layers evenly apart.
class HostKernelDevice final : public ForwardingDevice {
public:
  const char *name() const override { return "host-kernels"; }
  bool launchesKernels() const override { return true; }

  /// K and V of each layer back to back in one allocation, as the CUDA
  /// backend's createCache.
  StatusOr<std::unique_ptr<PagedKVCache>>
  createCache(const PagedCacheConfig &config) override {
    const int64_t perLayer = config.numBlocks * config.blockSize *
                             config.numKvHeads * config.headDim;
    auto memory = std::make_shared<std::vector<uint16_t>>(
        size_t(2 * config.layers * perLayer));
    std::vector<PagedLayerMemory> layers;
    for (int64_t l = 0; l < config.layers; ++l)
      layers.push_back({memory->data() + 2 * l * perLayer,
                        memory->data() + (2 * l + 1) * perLayer});
    return PagedKVCache::view(config, std::move(layers), CacheMemory::Host,
                              memory);
  }

  std::unique_ptr<DeviceBuffer> allocate() override {
    return std::make_unique<HostBuffer>();
  }

  /// The model's own projection over HostBuffers (the CPU backend's reads
  /// its own buffers): each layer's K then V, bf16.
  StatusOr<double> project(const ModelCompute &model, const DeviceBuffer &in,
                           DType dtype, const ChunkBox &box,
                           DeviceBuffer &out) override {
    const int64_t n = box.tokens(), h = model.config().hiddenSize,
                  width = model.kvDim();
    std::vector<uint16_t> &kv = static_cast<HostBuffer &>(out).words;
    kv.assign(size_t(box.layers() * 2 * n * width), 0);
    std::vector<float> x(n * h), k(n * width), v(n * width);
    for (int64_t l = 0; l < box.layers(); ++l) {
      hiddenRows(static_cast<const HostBuffer &>(in), dtype, l, n * h,
                 x.data());
      model.project(box.layerBegin + l, x.data(), n, box.tokenBegin, k.data(),
                    v.data());
      for (int64_t i = 0; i < n * width; ++i) {
        kv[(2 * l * n) * width + i] = floatToBf16(k[i]);
        kv[(2 * l + 1) * n * width + i] = floatToBf16(v[i]);
      }
    }
    return model.projectFlops(n, box.layers());
  }

  /// The CPU's prefill, failing at position failPrefillAt when set, and
  /// showing each layer it writes to beforeWritten first.
  Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                     const BlockTable &table, const int32_t *tokens,
                     int64_t position, int64_t n, int64_t layers,
                     const LayerWritten &written) override {
    if (position == failPrefillAt)
      return unavailable("prefill failed at " + std::to_string(position));
    LayerWritten shown;
    if (written)
      shown = [&](int64_t layer) {
        if (beforeWritten)
          beforeWritten(layer);
        written(layer);
      };
    return ForwardingDevice::prefillInto(model, cache, table, tokens, position,
                                         n, layers, shown);
  }

  Status upload(HostWords &host, bool, DeviceBuffer &to) override {
    static_cast<HostBuffer &>(to).words.assign(host.begin(), host.end());
    uploadedBytes += int64_t(host.size() * 2);
    return Status::ok();
  }

  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    const std::vector<uint16_t> &words =
        static_cast<const HostBuffer &>(kv).words;
    const int64_t n = box.tokens() * cache.kvDim();
    for (int64_t l = 0; l < box.layers(); ++l)
      KVC_RETURN_IF_ERROR(cache.write(table, box.layerBegin + l, box.tokenBegin,
                                      box.tokens(), words.data() + 2 * l * n,
                                      words.data() + (2 * l + 1) * n));
    return Status::ok();
  }

  Status canLaunch(const BundleKernel &kernel,
                   const PagedKVCache &cache) const override {
    return kernelArgsFor(kernel, cache).status();
  }

  /// What the generated kernel does, through its ABI: for each record of
  /// the chunk table (KernelAbi.h), decodeChunkToBf16 of the payload at its
  /// offset from the span's base, each row stored at ((first_layer + l) *
  /// layer_rows + table[p / B] * B + p % B) * width of its matrix's base.
  Status launchRestore(const BundleKernel &kernel,
                       const std::vector<RestoreChunk> &chunks,
                       PagedKVCache &cache, const BlockTable &table) override {
    KVC_ASSIGN_OR_RETURN(args, kernelArgsFor(kernel, cache));
    KVC_ASSIGN_OR_RETURN(blocks, args.blocks(table));
    std::vector<ChunkAt> at;
    for (const RestoreChunk &chunk : chunks)
      at.push_back(
          {static_cast<const HostBuffer *>(chunk.payload)->words.data(),
           chunk.box.tokenBegin, chunk.box.layerBegin});
    KVC_ASSIGN_OR_RETURN(launch, chunkTable(kernel, at));
    for (const KernelChunk &record : launch.records) {
      const ChunkShape shape = shapeOf(kernel, record.firstLayer, cache);
      std::vector<uint16_t> values(shape.numel());
      KVC_RETURN_IF_ERROR(
          decodeChunkToBf16(std::string_view(launch.base + record.payloadOffset,
                                             kernel.payloadBytes),
                            shape, kernel.codec, DType::BF16, values.data()));
      const int64_t width = shape.width;
      for (int64_t l = 0; l < shape.layers; ++l)
        for (int64_t m = 0; m < 2; ++m)
          for (int64_t t = 0; t < shape.tokens; ++t) {
            const int64_t row =
                rowOf(args, blocks, kernel, record.firstLayer + l,
                      record.firstToken + t);
            uint16_t *base =
                const_cast<uint16_t *>(m ? args.values : args.keys);
            std::memcpy(base + row * width,
                        values.data() +
                            ((l * 2 + m) * shape.tokens + t) * width,
                        size_t(width) * 2);
          }
    }
    ++launches;
    launchedChunks += int64_t(chunks.size());
    return Status::ok();
  }

  Status canLaunchProject(const BundleKernel &prologue,
                          const BundleKernel &epilogue,
                          const ModelCompute &model,
                          const PagedKVCache &cache) const override {
    KVC_RETURN_IF_ERROR(canLaunch(epilogue, cache));
    if (prologue.hidden != model.config().hiddenSize)
      return failedPrecondition("another hidden size");
    return Status::ok();
  }

  /// What the generated projection does: the prologue's RMSNorm rounded to
  /// bf16, the GEMM (here in fp32 over the model's weights), the epilogue's
  /// RoPE and bf16 rounding, each row stored through the kernel's ABI.
  StatusOr<double> launchProject(const BundleKernel &prologue,
                                 const BundleKernel &epilogue,
                                 const ModelCompute &model,
                                 const DeviceBuffer &hidden, DType dtype,
                                 const ChunkBox &box, PagedKVCache &cache,
                                 const BlockTable &table) override {
    KVC_RETURN_IF_ERROR(canLaunchProject(prologue, epilogue, model, cache));
    const auto &llama = dynamic_cast<const LlamaModel &>(model);
    KVC_ASSIGN_OR_RETURN(args, kernelArgsFor(epilogue, cache));
    KVC_ASSIGN_OR_RETURN(blocks, args.blocks(table));
    const ModelConfig &c = model.config();
    const int64_t n = box.tokens(), h = c.hiddenSize, width = model.kvDim();
    std::vector<float> rotations(n * c.headDim);
    llama.ropeTable(box.tokenBegin, n, rotations.data());
    for (int64_t l = 0; l < box.layers(); ++l) {
      const int64_t layer = box.layerBegin + l;
      std::vector<float> x(n * h), normed(n * h), k(n * width, 0.0f),
          v(n * width, 0.0f);
      hiddenRows(static_cast<const HostBuffer &>(hidden), dtype, l, n * h,
                 x.data());
      rmsNorm(x.data(), n, h, float(c.rmsNormEps),
              llama.layer(layer).attnNorm.data(), normed.data());
      for (float &value : normed)
        value = bf16ToFloat(floatToBf16(value));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < width; ++o)
          for (int64_t j = 0; j < h; ++j) {
            k[t * width + o] +=
                normed[t * h + j] * llama.layer(layer).k[o * h + j];
            v[t * width + o] +=
                normed[t * h + j] * llama.layer(layer).v[o * h + j];
          }
      applyRope(k.data(), n, c.numKvHeads, c.headDim, rotations.data());
      for (int64_t t = 0; t < n; ++t) {
        const int64_t row =
            rowOf(args, blocks, epilogue, layer, box.tokenBegin + t);
        for (int64_t o = 0; o < width; ++o) {
          const_cast<uint16_t *>(args.keys)[row * width + o] =
              floatToBf16(k[t * width + o]);
          const_cast<uint16_t *>(args.values)[row * width + o] =
              floatToBf16(v[t * width + o]);
        }
      }
    }
    ++projections;
    return model.projectFlops(n, box.layers());
  }

  Status canLaunchSave(const BundleKernel &kernel,
                       const PagedKVCache &cache) const override {
    return kernelArgsFor(kernel, cache).status();
  }

  /// What the generated save kernel does: each box's rows read through the
  /// kernel's ABI, encoded by encodeChunk without a lossless stage.
  Status launchSave(const BundleKernel &kernel, const PagedKVCache &cache,
                    const BlockTable &table, const std::vector<ChunkBox> &boxes,
                    std::vector<std::string> &payloads) override {
    payloads.clear();
    for (const ChunkBox &box : boxes) {
      payloads.emplace_back();
      KVC_RETURN_IF_ERROR(saveOne(kernel, cache, table, box, payloads.back()));
    }
    ++saveLaunches;
    return Status::ok();
  }

  Status saveOne(const BundleKernel &kernel, const PagedKVCache &cache,
                 const BlockTable &table, const ChunkBox &box,
                 std::string &payload) {
    KVC_ASSIGN_OR_RETURN(args, kernelArgsFor(kernel, cache));
    KVC_ASSIGN_OR_RETURN(blocks, args.blocks(table));
    const ChunkShape shape = shapeOf(kernel, box.layerBegin, cache);
    std::vector<float> values(shape.numel());
    const int64_t width = shape.width;
    for (int64_t l = 0; l < shape.layers; ++l)
      for (int64_t m = 0; m < 2; ++m)
        for (int64_t t = 0; t < shape.tokens; ++t) {
          const int64_t row = rowOf(args, blocks, kernel, box.layerBegin + l,
                                    box.tokenBegin + t);
          const uint16_t *base = m ? args.values : args.keys;
          for (int64_t o = 0; o < width; ++o)
            values[((l * 2 + m) * shape.tokens + t) * width + o] =
                bf16ToFloat(base[row * width + o]);
        }
    const DType storage = kernel.storage == "f32"   ? DType::F32
                          : kernel.storage == "f16" ? DType::F16
                                                    : DType::BF16;
    KVC_ASSIGN_OR_RETURN(
        encoded, encodeChunk(values.data(), shape, kernel.codec, storage));
    payload = std::move(encoded);
    ++saves;
    return Status::ok();
  }

  std::atomic<int64_t> launches{0}, launchedChunks{0}, uploadedBytes{0},
      projections{0}, saves{0}, saveLaunches{0};
  std::atomic<int64_t> failPrefillAt{-1};
  LayerWritten beforeWritten;

private:
  /// The chunk `kernel` decodes or encodes, from layer `firstLayer` of
  /// `cache`'s model.
  static ChunkShape shapeOf(const BundleKernel &kernel, int64_t firstLayer,
                            const PagedKVCache &cache) {
    ChunkShape shape;
    shape.tokens = kernel.tokens;
    shape.layers = kernel.layers;
    shape.width = kernel.kvHeads * kernel.headDim;
    shape.headDim = kernel.headDim;
    shape.firstLayer = firstLayer;
    shape.modelLayers = cache.config().layers;
    return shape;
  }

  /// The cache row of token `p` of `layer` through the kernel's ABI:
  /// layer * layer_rows + table[p / B] * B + p % B.
  static int64_t rowOf(const KernelCacheArgs &args,
                       const std::vector<int32_t> &blocks,
                       const BundleKernel &kernel, int64_t layer, int64_t p) {
    const int64_t b = kernel.blockSize;
    return layer * args.layerRows + int64_t(blocks[p / b]) * b + p % b;
  }

  /// Layer `l`'s `count` hidden values of an uploaded chunk, as fp32.
  static void hiddenRows(const HostBuffer &buffer, DType dtype, int64_t l,
                         int64_t count, float *out) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = l * count + i;
      if (dtype == DType::F32)
        std::memcpy(&out[i], buffer.words.data() + 2 * at, 4);
      else
        out[i] = dtype == DType::BF16 ? bf16ToFloat(buffer.words[at])
                                      : f16ToFloat(buffer.words[at]);
    }
  }
};

class KernelLaunchTest : public ExecutorTest {
protected:
  void SetUp() override {
    device_ = &kernels_;
    ExecutorTest::SetUp();
  }

  /// Every chunk of the restore decoded on the host, for a reason that
  /// says `why`.
  static void expectDecodedOnTheHost(const StatusOr<RestoreMetrics> &metrics,
                                     const std::string &why) {
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(metrics->kernelChunks, 0);
    ASSERT_FALSE(metrics->kernelsNotLaunched.empty());
    EXPECT_NE(metrics->kernelsNotLaunched.front().find(why), std::string::npos)
        << metrics->kernelsNotLaunched.front();
  }

  HostKernelDevice kernels_;
};

} // namespace kvc::exec_test

#endif // KVC_UNITTESTS_RUNTIME_HOSTKERNELDEVICE_H
