//===- KernelLaunchTest.cpp - Plans whose chunks generated kernels decode -===//
//
// The executor's side of generated restore kernels, without a GPU: a
// backend that "launches" a kernel by doing what the generated code does
// (KernelJitTest shows it equals decodeChunkToBf16 bit for bit) through the
// kernel's ABI (KernelAbi.h: layer 0's bases, layer_rows, the scaled block
// table), over host memory laid out as the CUDA backend lays out its cache.
// Projections likewise: the stand-in's prologue, GEMM and epilogue compute
// what the generated kernels and the backend's GEMM do, written through the
// epilogue's ABI. What is checked: which chunks reach the device still
// encoded, which chunks the generated projection writes, that the
// ABI addresses every cache layout it accepts correctly, and that every
// other case (a chunk off the store's grid, a cache the kernel cannot
// address, a backend without kernels, a corrupt object) still restores the
// exact cache by the runtime's own code.
//
//===----------------------------------------------------------------------===//

#include "ExecutorFixture.h"
#include "ForwardingBackend.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Exec/KernelAbi.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"
#include "kvc/Runtime/Net/Transfer.h"
#include "kvc/Runtime/Save/SavePlan.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

namespace kvc::exec_test {
namespace {

/// Host memory as a device: buffers of its own, uploads counted.
class HostBuffer final : public DeviceBuffer {
public:
  int64_t bytes() const override { return int64_t(words.size() * 2); }
  std::vector<uint16_t> words;
};

/// The CPU backend's compute, with kernels launched as the generated code
/// computes them and a cache in one allocation, layers evenly apart.
class HostKernelBackend final : public ForwardingBackend {
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

  Status upload(std::vector<uint16_t> &host, bool, DeviceBuffer &to) override {
    static_cast<HostBuffer &>(to).words = host;
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
      return Status(StatusCode::FailedPrecondition, "another hidden size");
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
    backend_ = &kernels_;
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

  HostKernelBackend kernels_;
};

CodecSpec codec(const char *text) { return *parseCodecSpec(text); }

TEST_F(KernelLaunchTest, ChunksReachTheDeviceEncodedAndTheKernelDecodesThem) {
  const int64_t layers = model_->config().numLayers;
  for (const char *text :
       {"int8+zstd", "int4/g32+deflate", "hadamard+int4", "int2/k=token"}) {
    SCOPED_TRACE(text);
    std::unique_ptr<ChunkStore> store = storeIn(codec(text));
    // Chunks of 64 tokens x every layer: two of the store's objects each.
    PlanBundle bundle = *withKernels(makePlan({0, 0, 64}, layers),
                                     model_->config(), codec(text));
    std::vector<float> byKernels, onHost;
    kernels_.uploadedBytes = 0;
    StatusOr<RestoreMetrics> metrics = restoreWith(bundle, *store, &byKernels);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    const int64_t chunks = (kTokens + 63) / 64;
    EXPECT_EQ(metrics->kernelChunks, chunks);
    EXPECT_GE(metrics->kernelLaunches, 1);
    EXPECT_LE(metrics->kernelLaunches, chunks);
    EXPECT_TRUE(metrics->kernelsNotLaunched.empty());
    EXPECT_TRUE(metrics->fallbacks.empty());
    // What crossed to the device is each chunk's payload, not bf16.
    int64_t payloadBytes = 0;
    for (const BundleTask &task : bundle.plans.front().tasks)
      if (!task.entry.empty())
        payloadBytes +=
            (bundle.findKernel(task.entry)->payloadBytes + 1) / 2 * 2;
    EXPECT_EQ(kernels_.uploadedBytes, payloadBytes);
    const int64_t bf16Bytes = 2 * layers * kTokens * model_->kvDim() * 2;
    EXPECT_LT(payloadBytes, bf16Bytes * 3 / 5);

    // The same plan decoded by the runtime's own code: the same cache.
    kernels_.uploadedBytes = 0;
    metrics = restoreWith(bundle, *store, &onHost, /*kernels=*/false);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(metrics->kernelChunks, 0);
    EXPECT_EQ(kernels_.uploadedBytes, bf16Bytes);
    EXPECT_EQ(byKernels, onHost);
  }
}

TEST_F(KernelLaunchTest, ChunksReadyTogetherShareALaunch) {
  // 16-token chunks, each kernel task made to wait for every chunk's
  // upload: they are released together, and each kernel's chunks take one
  // launch (the last chunk's 12 tokens have a kernel of their own).
  const CodecSpec int4 = codec("int4/g16+zstd");
  std::unique_ptr<ChunkStore> store = storeIn(int4, /*chunkTokens=*/16);
  PlanBundle bundle = *withKernels(
      makePlan({0, 0, 16}, model_->config().numLayers), model_->config(), int4);
  BundlePlan &plan = bundle.plans.front();
  std::vector<int64_t> uploads;
  for (const BundleTask &task : plan.tasks)
    if (!task.entry.empty())
      uploads.insert(uploads.end(), task.after.begin(), task.after.end());
  int64_t chunks = 0;
  for (BundleTask &task : plan.tasks)
    if (!task.entry.empty()) {
      task.after = uploads;
      ++chunks;
    }
  ASSERT_GT(chunks, 16);
  std::vector<float> batched, onHost;
  StatusOr<RestoreMetrics> metrics = restoreWith(bundle, *store, &batched);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_EQ(metrics->kernelChunks, chunks);
  EXPECT_EQ(metrics->kernelLaunches, 2);
  EXPECT_EQ(kernels_.launchedChunks, chunks);
  EXPECT_TRUE(metrics->fallbacks.empty());
  ASSERT_TRUE(restoreWith(bundle, *store, &onHost, /*kernels=*/false));
  EXPECT_EQ(batched, onHost);
}

TEST_F(KernelLaunchTest, RawChunksAreScatteredByTheKernel) {
  std::unique_ptr<ChunkStore> store = storeIn(CodecSpec());
  PlanBundle bundle =
      *withKernels(makePlan({128, 0, 64}, model_->config().numLayers),
                   model_->config(), CodecSpec());
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store, nullptr, true, &error);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_EQ(metrics->kernelChunks, 3); // Tokens 128 to 300.
  EXPECT_LT(error, 1.0 / 128);
}

TEST_F(KernelLaunchTest, InterleavedCachesAreAddressedThroughAScaledTable) {
  // One tensor per layer, [blocks][K|V][block], the layers one allocation
  // apart: the kernel sees layer_rows of 2 * blocks * block_size and
  // physical blocks doubled.
  PagedCacheConfig shape = cache_->config();
  const int64_t block = shape.blockSize * cache_->kvDim();
  shape.blockStride = 2 * block;
  const int64_t perLayer = shape.numBlocks * 2 * block;
  std::vector<uint16_t> memory(shape.layers * perLayer);
  std::vector<PagedLayerMemory> layers;
  for (int64_t l = 0; l < shape.layers; ++l)
    layers.push_back(
        {memory.data() + l * perLayer, memory.data() + l * perLayer + block});
  cache_ = std::move(PagedKVCache::view(shape, layers).value());
  StatusOr<KernelCacheArgs> args = kernelCacheArgs(*cache_);
  ASSERT_TRUE(args) << args.status().toString();
  EXPECT_EQ(args->layerRows, 2 * shape.numBlocks * shape.blockSize);
  EXPECT_EQ(args->blockScale, 2);

  const CodecSpec int4 = codec("int4+zstd");
  std::unique_ptr<ChunkStore> store = storeIn(int4);
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, shape.layers), model_->config(), int4);
  std::vector<float> byKernels, onHost;
  StatusOr<RestoreMetrics> metrics = restoreWith(bundle, *store, &byKernels);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_GT(metrics->kernelChunks, 0);
  ASSERT_TRUE(restoreWith(bundle, *store, &onHost, false));
  EXPECT_EQ(byKernels, onHost);
  cache_.reset(); // Before the memory it views.
}

TEST_F(KernelLaunchTest, LayersAllocatedApartAreDecodedOnTheHost) {
  PagedCacheConfig shape = cache_->config();
  const int64_t perLayer = shape.numBlocks * shape.blockSize * cache_->kvDim();
  std::vector<std::vector<uint16_t>> tensors(2 * shape.layers,
                                             std::vector<uint16_t>(perLayer));
  std::vector<PagedLayerMemory> layers;
  for (int64_t l = 0; l < shape.layers; ++l)
    layers.push_back({tensors[2 * l].data(), tensors[2 * l + 1].data()});
  cache_ = std::move(PagedKVCache::view(shape, layers).value());
  EXPECT_EQ(kernelCacheArgs(*cache_).status().code(),
            StatusCode::FailedPrecondition);

  const CodecSpec int8 = codec("int8");
  std::unique_ptr<ChunkStore> store = storeIn(int8);
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, shape.layers), model_->config(), int8);
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store, nullptr, true, &error);
  expectDecodedOnTheHost(metrics, "cannot address");
  EXPECT_LT(error, 1.0 / 16); // int8's error, not garbage.
  cache_.reset();
}

TEST_F(KernelLaunchTest, ChunksOffTheStoresGridAreDecodedOnTheHost) {
  // 96-token chunks over 64-token objects: no chunk's objects tile it.
  const CodecSpec int8 = codec("int8+lz4");
  std::unique_ptr<ChunkStore> store = storeIn(int8);
  PlanBundle bundle = *withKernels(
      makePlan({0, 0, 96}, model_->config().numLayers), model_->config(), int8);
  std::vector<float> mixed, onHost;
  StatusOr<RestoreMetrics> metrics = restoreWith(bundle, *store, &mixed);
  expectDecodedOnTheHost(metrics, "tokens do not match the chunk's");
  // One line per kernel (96 and the last 12 tokens), not per chunk.
  EXPECT_EQ(metrics->kernelsNotLaunched.size(), 2u);
  ASSERT_TRUE(restoreWith(bundle, *store, &onHost, false));
  EXPECT_EQ(mixed, onHost);
}

/// One end of an in-process link: it sends into `out` and receives from
/// `in` (the other end's `out`).
class MemoryLink final : public Link {
public:
  struct Queue {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::string> messages;
    bool closed = false;
  };
  MemoryLink(std::shared_ptr<Queue> in, std::shared_ptr<Queue> out)
      : in_(std::move(in)), out_(std::move(out)) {}

  /// Two ends of one link.
  static std::pair<MemoryLink, MemoryLink> pair() {
    auto a = std::make_shared<Queue>(), b = std::make_shared<Queue>();
    return {MemoryLink(a, b), MemoryLink(b, a)};
  }
  Status send(std::string_view message) override {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->messages.emplace_back(message);
    out_->ready.notify_all();
    return Status::ok();
  }
  StatusOr<std::string> receive(Milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(in_->mutex);
    if (!in_->ready.wait_for(lock, timeout, [&] {
          return !in_->messages.empty() || in_->closed;
        }))
      return Status(StatusCode::Unavailable, "memory link: timed out");
    if (in_->messages.empty())
      return Status(StatusCode::Unavailable, "memory link: the peer hung up");
    std::string message = std::move(in_->messages.front());
    in_->messages.pop_front();
    return message;
  }
  std::string describe() const override { return "memory"; }
  /// Hangs up: the peer's receives fail once it has read what was sent.
  void close() {
    std::lock_guard<std::mutex> lock(out_->mutex);
    out_->closed = true;
    out_->ready.notify_all();
  }

private:
  std::shared_ptr<Queue> in_, out_;
};

// A transfer's receive plan launches the restore kernels its tasks name,
// as a restore's does: each chunk crosses to the device encoded and the
// kernel decodes and scatters it; without the kernel table the runtime
// decodes them. Both caches are the sender's KV within its codec's bound.
TEST_F(KernelLaunchTest, AReceivePlanLaunchesTheKernelsItNames) {
  const int64_t layers = model_->config().numLayers;
  const CodecSpec int8 = codec("int8+zstd");
  // Chunks of 64 tokens x every layer, each one object of the transfer.
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, layers), model_->config(), int8);
  BundlePlan &plan = bundle.plans.front();
  for (BundleTask &task : plan.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch) {
        step.kind = StepKind::Recv;
        step.node = "prefill";
        step.tier.clear();
      }
  ChunkObjects objects(model_->config(), model_->fingerprint(), "",
                       {64, layers});
  for (bool kernels : {true, false}) {
    SCOPED_TRACE(kernels ? "with the kernel table" : "without");
    auto [sending, receiving] = MemoryLink::pair();
    StatusOr<SendStats> sent = Status(StatusCode::Internal, "not sent");
    std::thread sender([&, &sending = sending] {
      SendOptions options;
      options.codec = int8;
      sent = sendContext(*model_, objects, tokens_, sending, options);
      sending.close();
    });
    StatusOr<ReceiveOptions> options =
        receiveOptionsFor(plan, objects, kTokens);
    ASSERT_TRUE(options.isOk()) << options.status().toString();
    if (kernels)
      options->kernels = &bundle.kernels;
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<ReceiveMetrics> metrics =
        receiveContext(receiving, objects, targetFor(table), *options);
    sender.join();
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
    ASSERT_TRUE(metrics.isOk()) << metrics.status().toString();
    ASSERT_TRUE(metrics->planRun.has_value());
    EXPECT_EQ(metrics->received, (kTokens + 63) / 64);
    EXPECT_TRUE(metrics->fallbacks.empty());
    EXPECT_EQ(metrics->planRun->kernelChunks,
              kernels ? (kTokens + 63) / 64 : 0);
    EXPECT_TRUE(metrics->planRun->kernelsNotLaunched.empty());
    EXPECT_LT(relativeError(table), 0.05);
    cache_->release(table);
  }
}

TEST_F(KernelLaunchTest, ACorruptObjectIsRecomputedAsWithoutKernels) {
  const CodecSpec int8 = codec("int8+zstd");
  std::unique_ptr<ChunkStore> store = storeIn(int8);
  std::string victimName;
  for (const ChunkRef &ref :
       store->refs(tokens_.data(), kTokens, Form::KV, int8))
    if (ref.tokenBegin == 128 && ref.layerBegin == 2)
      victimName = ref.name();
  std::string bytes;
  ASSERT_TRUE(tier_->get(victimName, bytes).isOk());
  bytes[bytes.size() / 2] ^= 0x40;
  ASSERT_TRUE(tier_->put(victimName, bytes).isOk());
  PlanBundle bundle = *withKernels(
      makePlan({0, 0, 64}, model_->config().numLayers), model_->config(), int8);
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store, nullptr, true, &error);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_EQ(metrics->fallbacks.size(), 1u);
  EXPECT_EQ(metrics->kernelChunks, (kTokens + 63) / 64 - 1);
  EXPECT_LT(error, 1.0 / 16);
}

TEST_F(KernelLaunchTest, AKernelForAnotherEncodingIsAnError) {
  std::unique_ptr<ChunkStore> store = storeIn(codec("int4"));
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, model_->config().numLayers),
                   model_->config(), codec("int4"));
  for (BundleKernel &kernel : bundle.kernels)
    kernel.codec = codec("int8");
  BlockTable table = *cache_->allocate(kTokens);
  RestoreOptions options;
  options.kernels = &bundle.kernels;
  StatusOr<RestoreMetrics> metrics = restore(
      *pools_, bundle.plans.front(), targetFor(table, store.get()), options);
  ASSERT_FALSE(metrics);
  EXPECT_NE(metrics.status().message().find("decodes int8/g32 over bf16"),
            std::string::npos)
      << metrics.status().message();

  // A task naming a kernel the table lacks is an error too.
  bundle.kernels.clear();
  metrics = restore(*pools_, bundle.plans.front(),
                    targetFor(table, store.get()), options);
  ASSERT_FALSE(metrics);
  EXPECT_NE(metrics.status().message().find("which the kernel table lacks"),
            std::string::npos)
      << metrics.status().message();
  cache_->release(table);
}

TEST_F(KernelLaunchTest, KernelsOfAnotherShapeAreNotLaunched) {
  std::unique_ptr<ChunkStore> store = storeIn(codec("int8"));
  PlanBundle bundle =
      *withKernels(makePlan({0, 0, 64}, model_->config().numLayers),
                   model_->config(), codec("int8"));
  for (BundleKernel &kernel : bundle.kernels)
    kernel.blockSize = 32; // The cache's blocks hold 16 tokens.
  std::vector<float> restored;
  StatusOr<RestoreMetrics> metrics = restoreWith(bundle, *store, &restored);
  expectDecodedOnTheHost(metrics, "in blocks of 32");
}

// HCache's projection through generated kernels: each hidden-state chunk
// normalized by the prologue, projected by the backend's GEMM and written
// into the cache by the epilogue, with no scatter after it; the cache
// within bf16 rounding of the full prefill (the GEMM's input is rounded to
// bf16, as a server's).
TEST_F(KernelLaunchTest, ProjectionsRunTheGeneratedKernels) {
  const int64_t layers = model_->config().numLayers;
  PlanBundle bundle = *withProjectionKernels(makePlan({0, layers, 64}, layers),
                                             model_->config());
  kernels_.projections = 0;
  kernels_.uploadedBytes = 0;
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store_, nullptr, /*kernels=*/true, &error);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  const int64_t chunks = (kTokens + 63) / 64;
  EXPECT_EQ(metrics->kernelChunks, chunks);
  EXPECT_EQ(kernels_.projections, chunks);
  EXPECT_TRUE(metrics->kernelsNotLaunched.empty());
  // The hidden states crossed to the device, every layer's.
  EXPECT_EQ(kernels_.uploadedBytes,
            layers * kTokens * model_->config().hiddenSize * 2);
  EXPECT_LT(error, 1.0 / 64);
}

// Projection kernels the backend cannot launch (here: a prologue for
// another hidden size) leave the projection to the backend's own code: the
// restore is the same as without kernels, and says why.
TEST_F(KernelLaunchTest, ProjectionsTheBackendCannotLaunchRunItsOwn) {
  const int64_t layers = model_->config().numLayers;
  PlanBundle bundle = *withProjectionKernels(makePlan({0, layers, 64}, layers),
                                             model_->config());
  for (BundleKernel &kernel : bundle.kernels)
    if (kernel.kind == BundleKernel::Kind::RmsNorm)
      kernel.hidden = 64;
  kernels_.projections = 0;
  std::vector<float> withKernels, without;
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store_, &withKernels, /*kernels=*/true, &error);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_EQ(metrics->kernelChunks, 0);
  EXPECT_EQ(kernels_.projections, 0);
  // One line per kernel: the chunks of 64 tokens' and the last one's.
  ASSERT_EQ(metrics->kernelsNotLaunched.size(), 2u);
  for (const std::string &why : metrics->kernelsNotLaunched)
    EXPECT_NE(why.find("another hidden size"), std::string::npos) << why;
  ASSERT_TRUE(restoreWith(bundle, *store_, &without, /*kernels=*/false));
  EXPECT_EQ(withKernels, without);
  EXPECT_LT(error, 1.0 / 64);
}

TEST_F(KernelLaunchTest, AProjectionsPrologueMustFitTheStore) {
  const int64_t layers = model_->config().numLayers;
  PlanBundle bundle = *withProjectionKernels(makePlan({0, layers, 64}, layers),
                                             model_->config());
  BlockTable table = *cache_->allocate(kTokens);
  RestoreOptions options;
  options.kernels = &bundle.kernels;
  for (BundleKernel &kernel : bundle.kernels)
    if (kernel.kind == BundleKernel::Kind::RmsNorm)
      kernel.storage = "f32"; // The model stores bf16.
  StatusOr<RestoreMetrics> metrics =
      restore(*pools_, bundle.plans.front(), targetFor(table), options);
  ASSERT_FALSE(metrics);
  EXPECT_NE(
      metrics.status().message().find("normalizes hidden states stored as f32"),
      std::string::npos)
      << metrics.status().message();

  // A prologue the table lacks is an error too.
  bundle.kernels.erase(
      std::remove_if(bundle.kernels.begin(), bundle.kernels.end(),
                     [](const BundleKernel &kernel) {
                       return kernel.kind == BundleKernel::Kind::RmsNorm;
                     }),
      bundle.kernels.end());
  metrics = restore(*pools_, bundle.plans.front(), targetFor(table), options);
  ASSERT_FALSE(metrics);
  EXPECT_NE(metrics.status().message().find("which the kernel table lacks"),
            std::string::npos)
      << metrics.status().message();
  cache_->release(table);
}

// A save plan whose gathers name generated save kernels, over a cache the
// backend launches them on: every object is encoded where the cache is
// and only its lossless stage on the host, and the store holds the same
// bytes as a save without kernels.
TEST_F(KernelLaunchTest, SaveKernelsEncodeWhereTheCacheIs) {
  BlockTable table = prefilledTable();
  for (const char *text :
       {"raw", "int8+zstd", "hadamard+int4", "int2/k=token"}) {
    kernels_.saves = 0;
    kernels_.saveLaunches = 0;
    expectSaveKernelsStoreAsTheHost(table, codec(text));
    const int64_t objects = int64_t(
        store_->refs(tokens_.data(), kTokens, Form::KV, codec(text)).size());
    EXPECT_EQ(kernels_.saves, objects);
    // The gathers have no dependencies: released together, the objects of
    // each kernel (a 64-token one, and one for the last 44 tokens) share a
    // launch.
    EXPECT_EQ(kernels_.saveLaunches, 2);
  }
  cache_->release(table);
}

// During a prefill a batch of gathers launches for the objects already in
// the cache and waits only for the next one missing: objects of tokens
// [0, 128) go in one launch while the prefill has written 128 tokens, the
// last one in another once it has written it.
TEST_F(KernelLaunchTest, SaveBatchesLaunchWhatThePrefillHasWritten) {
  BlockTable table = prefilledTable();
  const int64_t layers = model_->config().numLayers;
  std::vector<ChunkRef> refs;
  for (const ChunkRef &ref :
       store_->refs(tokens_.data(), kTokens, Form::KV, codec("int8")))
    if (ref.layerBegin == 0 && ref.tokenEnd - ref.tokenBegin == 64)
      refs.push_back(ref);
  ASSERT_GE(refs.size(), 3u);
  refs.resize(3); // Tokens [0, 192) of the first layer group.
  BundleStep gather = step("gather", "kv", 0, 64, 0, refs[0].layerEnd);
  BundleKernel kernel =
      kernelOver(BundleKernel::Kind::Save, gather, model_->config());
  kernel.codec = codec("int8");
  LayerProgress filling;
  filling.reset(layers, kTokens);
  filling.add(0, layers, 128);
  PagedCacheSource source(kernels_, *cache_, table, &filling);
  ASSERT_TRUE(source.canGatherPayload(kernel).isOk());
  kernels_.saveLaunches = 0;
  std::vector<std::string> payloads;
  StatusOr<int64_t> launches =
      Status(StatusCode::Internal, "the gather has not ended");
  std::thread saver([&] {
    launches = source.gatherPayloads(kernel, *store_, refs, payloads);
  });
  for (int i = 0; i < 10000 && kernels_.saveLaunches == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(kernels_.saveLaunches, 1); // The third object is not there.
  filling.add(0, layers, kTokens - 128);
  saver.join();
  ASSERT_TRUE(launches) << launches.status().toString();
  EXPECT_EQ(*launches, 2);
  EXPECT_EQ(kernels_.saveLaunches, 2);
  ASSERT_EQ(payloads.size(), refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    std::string alone;
    ASSERT_TRUE(kernels_
                    .saveOne(kernel, *cache_, table,
                             {refs[i].tokenBegin, refs[i].tokenEnd,
                              refs[i].layerBegin, refs[i].layerEnd},
                             alone)
                    .isOk());
    EXPECT_EQ(payloads[i], alone) << "object " << i;
  }
  cache_->release(table);
}

// A save kernel of another block size is not launched (the host encodes
// its objects, and the save says why); one of another encoding is an
// error.
TEST_F(KernelLaunchTest, SaveKernelsThatDoNotFitTheSave) {
  BlockTable table = prefilledTable();
  ChunkStore store = storeOn(std::shared_ptr<Tier>(*openTier("mem://")));
  StatusOr<PlanBundle> bundle = savePlanWithKernels(store, codec("int8"));
  ASSERT_TRUE(bundle) << bundle.status().toString();
  for (BundleKernel &kernel : bundle->kernels)
    kernel.blockSize = 32;
  StatusOr<SaveMetrics> saved =
      saveWithKernels(table, store, *bundle, /*launch=*/true);
  ASSERT_TRUE(saved) << saved.status().toString();
  EXPECT_EQ(saved->kernelChunks, 0);
  EXPECT_GT(saved->written, 0);
  ASSERT_FALSE(saved->kernelsNotLaunched.empty());
  EXPECT_NE(saved->kernelsNotLaunched.front().find("in blocks of 32"),
            std::string::npos)
      << saved->kernelsNotLaunched.front();

  bundle = savePlanWithKernels(store, codec("int8"));
  ASSERT_TRUE(bundle) << bundle.status().toString();
  for (BundleKernel &kernel : bundle->kernels)
    kernel.codec = codec("int4");
  saved = saveWithKernels(table, store, *bundle, /*launch=*/true);
  ASSERT_FALSE(saved);
  EXPECT_NE(saved.status().message().find("layers as int4/g32 over bf16"),
            std::string::npos)
      << saved.status().message();
  cache_->release(table);
}

// The kernels kvc-opt generated for this model: their specializations,
// payload sizes and codecs fit the executor's chunks of every composition.
TEST_F(KernelLaunchTest, TheCompilersKernelsFitTheExecutor) {
#ifndef KVC_EXEC_KERNELS
  GTEST_SKIP() << "built without the compiler: no generated kernels";
#else
  StatusOr<PlanBundle> generated = readPlanBundle(KVC_EXEC_KERNELS);
  ASSERT_TRUE(generated) << generated.status().toString();
  expectGeneratedKernelsDecodeAsTheHost(generated->kernels);
  expectGeneratedProjectionsExact(generated->kernels);
  expectGeneratedSavesAsTheHost(generated->kernels);
#endif
}

// The plans kvc-opt's pipelines compile for this model with gpu-chip
// (Inputs/exec-restores.mlir, exec-saves.mlir) launch their kernels.
TEST_F(KernelLaunchTest, ThePipelinesPlansLaunchTheirKernels) {
#if !defined(KVC_EXEC_RESTORES) || !defined(KVC_EXEC_SAVES)
  GTEST_SKIP() << "built without the compiler: no compiled plans";
#else
  expectCompiledPlansLaunchTheirKernels(KVC_EXEC_RESTORES, KVC_EXEC_SAVES);
#endif
}

// The CPU backend decodes every chunk on its decode lanes, as CPU targets
// price it: a bundle's kernels change nothing there.
class CpuKernelTest : public ExecutorTest {};

TEST_F(CpuKernelTest, TheCpuBackendDecodesEveryChunkOnTheHost) {
  const CodecSpec int8 = codec("int8+zstd");
  std::unique_ptr<ChunkStore> store = storeIn(int8);
  PlanBundle bundle = *withKernels(
      makePlan({0, 0, 64}, model_->config().numLayers), model_->config(), int8);
  double error = 1;
  StatusOr<RestoreMetrics> metrics =
      restoreWith(bundle, *store, nullptr, true, &error);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_EQ(metrics->kernelChunks, 0);
  EXPECT_TRUE(metrics->kernelsNotLaunched.empty());
  EXPECT_LT(error, 1.0 / 16);
}

} // namespace
} // namespace kvc::exec_test
