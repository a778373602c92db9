//===- ExecutorTest.cpp - Restores that must equal a full prefill ---------===//

#include "ChunkSteps.h"
#include "ExecutorFixture.h"
#include "ForwardingDevice.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <unistd.h>

using namespace kvc;
using namespace kvc::exec_test;

namespace {

// A Qwen3 with biased projections and per-head q/k norms: every strategy
// restores it, and its K and V biases and K's norms move layer 0's K and V
// (which nothing else before them changes) far from the Llama it was drawn
// from, so that the CUDA backend's test of the same model holds its
// kernels to them.
TEST_F(ExecutorTest, AQwen3WithBiasesRestoresEveryStrategy) {
  useQwen3WithBiases();
  expectEveryStrategyExact();
  const LlamaModel::Cache qwen = reference_;
  useModel(DType::BF16); // The same generated weights, without them.
  double moved = 0, total = 0;
  for (std::size_t i = 0; i < qwen.k[0].size(); ++i) {
    const double k = qwen.k[0][i] - reference_.k[0][i];
    const double v = qwen.v[0][i] - reference_.v[0][i];
    moved += k * k + v * v;
    total += double(qwen.k[0][i]) * qwen.k[0][i] +
             double(qwen.v[0][i]) * qwen.v[0][i];
  }
  EXPECT_GT(std::sqrt(moved / total), 0.1);
}

TEST_F(ExecutorTest, ModelsOfEveryDTypeRestoreExactly) {
  for (DType dtype : {DType::F16, DType::F32}) {
    SCOPED_TRACE(dtypeName(dtype));
    useModel(dtype);
    const int64_t layers = model_->config().numLayers;
    for (const Split &split : {Split{0, layers, 64},             // hidden
                               Split{0, layers, 96, /*slots=*/2}, // staged
                               Split{128, layers / 2, 64}}) {     // joint
      expectExact(split);
      if (dtype == DType::F32) {
        BlockTable table = *cache_->allocate(kTokens);
        ASSERT_TRUE(run(makePlan(split, layers), table).isOk());
        EXPECT_LT(mismatched(table), 0.02);
        cache_->release(table);
      }
    }
  }
}

// A prefill into the paged cache tells each layer, in order, once its K
// and V are there: what a reader told of a layer reads then is what the
// finished prefill holds.
TEST_F(ExecutorTest, APrefillTellsEachLayerOnceItIsWritten) {
  BlockTable table = *cache_->allocate(kTokens);
  const int64_t layers = model_->config().numLayers, kv = model_->kvDim();
  std::vector<int64_t> told;
  std::vector<std::vector<float>> seen(static_cast<size_t>(layers));
  auto read = [&](int64_t layer, std::vector<float> &out) {
    out.resize(size_t(2 * kTokens * kv));
    return device_->readBack(*cache_, table, layer, 0, kTokens, out.data(),
                             out.data() + kTokens * kv);
  };
  ASSERT_TRUE(runner()
                  .prefillInto(*cache_, table, tokens_.data(), 0, kTokens,
                               layers,
                               [&](int64_t layer) {
                                 told.push_back(layer);
                                 EXPECT_TRUE(read(layer, seen[layer]).isOk());
                               })
                  .isOk());
  std::vector<int64_t> inOrder(static_cast<size_t>(layers));
  std::iota(inOrder.begin(), inOrder.end(), 0);
  EXPECT_EQ(told, inOrder);
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<float> after;
    ASSERT_TRUE(read(l, after).isOk());
    EXPECT_TRUE(seen[l] == after) << "layer " << l;
  }
  cache_->release(table);
}

TEST_F(ExecutorTest, EveryStrategyEqualsAFullPrefill) {
  expectEveryStrategyExact();
}

// A server's cache: one tensor per layer interleaving K and V per block
// ([num_blocks, 2, block_size, kv_heads, head_dim], one of vLLM's layouts),
// owned by the caller. Every strategy restores into it as exactly as into
// kvc's own cache, and the caller's memory holds the result.
TEST_F(ExecutorTest, RestoresIntoCallerOwnedMemory) {
  const ModelConfig &config = model_->config();
  PagedCacheConfig shape = cache_->config();
  const int64_t block = shape.blockSize * cache_->kvDim();
  shape.blockStride = 2 * block;
  std::vector<std::vector<uint16_t>> tensors(
      config.numLayers, std::vector<uint16_t>(shape.numBlocks * 2 * block));
  std::vector<PagedLayerMemory> layers;
  for (std::vector<uint16_t> &tensor : tensors)
    layers.push_back({tensor.data(), tensor.data() + block});
  StatusOr<std::unique_ptr<PagedKVCache>> view =
      PagedKVCache::view(shape, layers);
  ASSERT_TRUE(view) << view.status().toString();
  cache_ = std::move(view).value();
  const int64_t n = config.numLayers;
  expectExact({0, 0, 64});       // kv
  expectExact({128, n / 2, 64}); // joint

  // The last layer's K of token 0 sits at the start of the first block of
  // the table, V one block after it.
  BlockTable table = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({0, 0, 64}, n), table).isOk());
  const int64_t kv = cache_->kvDim();
  std::vector<float> k(kv), v(kv);
  ASSERT_TRUE(cache_->read(table, n - 1, 0, 1, k.data(), v.data()).isOk());
  const uint16_t *first = tensors[n - 1].data() + table.blocks[0] * 2 * block;
  for (int64_t i = 0; i < kv; ++i) {
    EXPECT_EQ(bf16ToFloat(first[i]), k[i]);
    EXPECT_EQ(bf16ToFloat(first[block + i]), v[i]);
  }
  EXPECT_NE(k, v);
  cache_.reset(); // Before the memory it views.
}

TEST_F(ExecutorTest, StagingSlotsAreReusedAcrossChunksAndRounds) {
  const int64_t layers = model_->config().numLayers;
  // One slot: every chunk waits for the one before it to be copied out.
  expectExact({0, 0, 64, /*slots=*/1});
  expectExact({0, 2, 64, /*slots=*/2}); // Hidden and KV through 2 slots.
  expectExact({192, layers, 96, /*slots=*/3});

  // The slots hold at most one chunk each, however many chunks pass.
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> metrics = run(makePlan({0, 0, 64, 2}, layers),
                                         table);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  const int64_t chunkFloats = layers * 2 * 64 * model_->kvDim();
  // Per slot: the decoded chunk (fp32) on the host and on the "device",
  // plus its stored objects (raw bf16, whole 64-token objects, headers).
  EXPECT_GT(metrics->stagingBytes, 0);
  EXPECT_LE(metrics->stagingBytes, 2 * (2 * chunkFloats * 4 + chunkFloats * 2 +
                                        4096));
}

/// `plan` loading objects stored with `codec`.
static BundlePlan loading(BundlePlan plan, const CodecSpec &codec) {
  for (BundleTask &task : plan.tasks)
    if (task.steps[0].kind == StepKind::Fetch)
      task.steps[0].codec = codec;
  return plan;
}

/// `plan` (makePlan's: fetch, decompress, copy, scatter a chunk) with each
/// chunk's fetch after the scatter before it; its chunks.
static int64_t oneChunkAtATime(BundlePlan &plan) {
  int64_t chunks = 0;
  for (std::size_t t = 0; t < plan.tasks.size(); t += 4, ++chunks) {
    EXPECT_EQ(plan.tasks[t].steps.front().kind, StepKind::Fetch);
    if (t > 0)
      plan.tasks[t].after.push_back(int64_t(t) - 1);
  }
  return chunks;
}

// Chunks whose plan gave them no staging slot reuse the buffers of the
// chunks before them once those are scattered (a fresh buffer's pages fault
// in on first touch): chunks loaded one after another need one device
// buffer in all, not one each; and they are decoded into the device's host
// memory (pinned, on CUDA), which its uploads read in place, allocated once
// per buffer, not per chunk. So are the plan's slots.
TEST_F(ExecutorTest, ChunksReuseTheBuffersOfThoseBeforeInTheDevicesMemory) {
  for (int64_t slots : {0, 2}) {
    SCOPED_TRACE(slots);
    BundlePlan plan = makePlan({0, 0, 16, slots}, model_->config().numLayers);
    ASSERT_EQ(plan.stagingSlots, slots);
    if (slots == 0) {
      ASSERT_GT(oneChunkAtATime(plan), 10);
    }
    CountingDevice counting;
    BlockTable table = *cache_->allocate(kTokens);
    RestoreTarget target = targetFor(table);
    target.device = &counting;
    StatusOr<RestoreMetrics> metrics = restore(*pools_, plan, target);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    if (slots == 0) {
      EXPECT_EQ(counting.allocations.load(), 1);
    }
    EXPECT_EQ(counting.uploadsFromItsMemory.load(), (kTokens + 15) / 16);
    EXPECT_EQ(counting.otherUploads.load(), 0);
    EXPECT_GE(counting.memory.allocations.load(), 1);
    EXPECT_LE(counting.memory.allocations.load(), std::max<int64_t>(slots, 1));
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
  }
}

// A restore's staging memory is kept for the next: the second restore of a
// process obtains no new decode buffers from its device's memory, and its
// slots read into the fetch buffers the first one's gave back.
TEST_F(ExecutorTest, ASecondRestoreReusesTheFirstsStagingMemory) {
  class KeptDevice final : public ForwardingDevice {
  public:
    HostMemory *hostMemory() override { return &memory; }
    KeptHostMemory memory;
  } device;
  // Objects of half a chunk: each chunk is put together in staging (one
  // that tiles them is written into a CPU cache's rows directly).
  std::unique_ptr<ChunkStore> store = storeIn(CodecSpec(), 32);
  const BundlePlan plan =
      makePlan({0, 0, 64, /*slots=*/2}, model_->config().numLayers);
  for (int round = 0; round < 2; ++round) {
    BlockTable table = *cache_->allocate(kTokens);
    RestoreTarget target = targetFor(table, store.get());
    target.device = &device;
    ASSERT_TRUE(restore(*pools_, plan, target).isOk());
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
    EXPECT_EQ(device.memory.obtained(), 2) << "round " << round;
    EXPECT_GT(device.memory.keptBytes(), 0u);
    EXPECT_GT(exec_detail::keptFetchBytes(), 0u);
  }
}

// A traced restore's trace shows the device's own spans beside the host's
// tasks, a thread per device queue; an untraced one keeps none.
TEST_F(ExecutorTest, ATraceShowsTheDevicesSpans) {
  CountingDevice counting;
  BlockTable table = *cache_->allocate(kTokens);
  // Objects of half a chunk: put together in staging, scattered.
  std::unique_ptr<ChunkStore> store = storeIn(CodecSpec(), 32);
  RestoreTarget target = targetFor(table, store.get());
  target.device = &counting;
  const BundlePlan plan = makePlan({0, 0, 64}, model_->config().numLayers);
  ASSERT_TRUE(restore(*pools_, plan, target).isOk());
  EXPECT_EQ(counting.keptSpans, 0);

  RestoreOptions options;
  options.tracePath = ::testing::TempDir() + "/kvc-device-spans.json";
  std::remove(options.tracePath.c_str());
  ASSERT_TRUE(restore(*pools_, plan, target, options).isOk());
  EXPECT_EQ(counting.keptSpans, 2); // Kept for the run, then no more.
  std::ifstream in(options.tracePath);
  const nlohmann::json trace = nlohmann::json::parse(in);
  int queue = 0;
  for (const nlohmann::json &event : trace)
    if (event["ph"] == "M" && event["name"] == "thread_name" &&
        event["args"]["name"] == "device/0")
      queue = event["tid"];
  ASSERT_NE(queue, 0) << trace.dump();
  std::set<std::string> spans;
  for (const nlohmann::json &event : trace)
    if (event["ph"] == "X" && event["cat"] == "device") {
      EXPECT_EQ(event["tid"], queue);
      EXPECT_GE(event["ts"].get<double>(), 0);
      spans.insert(event["name"].get<std::string>());
    }
  EXPECT_EQ(spans,
            (std::set<std::string>{"scatter 0", "scatter 64", "scatter 128",
                                   "scatter 192", "scatter 256"}));
  cache_->release(table);
}

/// A device whose scatters return before their work is done, as the CUDA
/// device's may: each is held until a later call orders after it (an
/// upload into a buffer, which may be the one it reads; a read or compute
/// over the cache) or until settle. Its buffers outlive their owners while
/// a held scatter reads them, as a GPU's are freed after the work using
/// them.
class DeferringDevice final : public ForwardingDevice {
public:
  class Buffer final : public DeviceBuffer {
  public:
    int64_t bytes() const override { return inner->bytes(); }
    std::shared_ptr<DeviceBuffer> inner{cpuDevice().allocate()};
  };
  static DeviceBuffer &innerOf(const DeviceBuffer &buffer) {
    return *static_cast<const Buffer &>(buffer).inner;
  }

  std::unique_ptr<DeviceBuffer> allocate() override {
    return std::make_unique<Buffer>();
  }
  Status upload(HostWords &host, bool consume, DeviceBuffer &to) override {
    KVC_RETURN_IF_ERROR(flush());
    return ForwardingDevice::upload(host, consume, innerOf(to));
  }
  Status scatter(const DeviceBuffer &kv, const ChunkBox &box,
                 PagedKVCache &cache, const BlockTable &table) override {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.push_back(
        [in = static_cast<const Buffer &>(kv).inner, box, &cache, &table] {
          return cpuDevice().scatter(*in, box, cache, table);
        });
    return Status::ok();
  }
  Status readBack(const PagedKVCache &cache, const BlockTable &table,
                  int64_t layer, int64_t first, int64_t n, float *k,
                  float *v) override {
    KVC_RETURN_IF_ERROR(flush());
    return ForwardingDevice::readBack(cache, table, layer, first, n, k, v);
  }
  StatusOr<double> project(const ModelCompute &model,
                           const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    KVC_RETURN_IF_ERROR(flush());
    return ForwardingDevice::project(model, innerOf(hidden), dtype, box,
                                     innerOf(kv));
  }
  Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                     const BlockTable &table, const int32_t *tokens,
                     int64_t position, int64_t n, int64_t layers,
                     const LayerWritten &written) override {
    KVC_RETURN_IF_ERROR(flush());
    return ForwardingDevice::prefillInto(model, cache, table, tokens, position,
                                         n, layers, written);
  }
  Status settle(const PagedKVCache &) override {
    ++settles;
    return flush();
  }
  std::atomic<int> settles{0};

private:
  Status flush() {
    std::lock_guard<std::mutex> lock(mutex_);
    Status status;
    for (auto &work : held_)
      if (status.isOk())
        status = work();
    held_.clear();
    return status;
  }
  std::mutex mutex_;
  std::vector<std::function<Status()>> held_;
};

// On a device whose calls return before their work is done, a layer
// reported complete is in the cache when the report comes (the executor
// settles the device first), and so is every layer when the restore
// returns; the settles are few: one per completing write, not one per call.
TEST_F(ExecutorTest, ALayerReportedCompleteIsInTheCacheOfADeviceThatRunsAhead) {
  const int64_t layers = model_->config().numLayers, kv = model_->kvDim();
  for (const Split &split : {Split{0, 0, 64, /*slots=*/2}, // KV loads
                             Split{0, layers, 64},         // projections
                             Split{128, 0, 64}}) {         // joint
    SCOPED_TRACE(split.merge * 100 + split.hiddenLayers);
    DeferringDevice device;
    BlockTable table = *cache_->allocate(kTokens);
    RestoreTarget target = targetFor(table);
    target.device = &device;
    LayerProgress progress;
    std::vector<double> errorWhenReported(size_t(layers), 1.0);
    for (int64_t l = 0; l < layers; ++l)
      progress.whenReady(l, [&, l] {
        // Read straight from the host cache, past the device's queue.
        std::vector<float> k(size_t(kTokens * kv)), v(k.size());
        if (!cache_->read(table, l, 0, kTokens, k.data(), v.data()).isOk())
          return;
        double error = 0, largest = 0;
        for (size_t i = 0; i < k.size(); ++i)
          for (auto [got, want] : {std::pair{k[i], reference_.k[l][i]},
                                   std::pair{v[i], reference_.v[l][i]}}) {
            error = std::max(error, double(std::fabs(got - want)));
            largest = std::max(largest, double(std::fabs(want)));
          }
        errorWhenReported[size_t(l)] = error / largest;
      });
    RestoreOptions options;
    options.progress = &progress;
    StatusOr<RestoreMetrics> metrics =
        restore(*pools_, makePlan(split, layers), target, options);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    for (int64_t l = 0; l < layers; ++l)
      EXPECT_LT(errorWhenReported[size_t(l)], 1.0 / 128) << "layer " << l;
    EXPECT_LT(relativeError(table), 1.0 / 128);
    EXPECT_GE(device.settles.load(), 1);
    EXPECT_LE(device.settles.load(), layers + 1);
    cache_->release(table);
  }
}

// whenReady runs its callback once: when the layer completes, when the
// restore ends (on error too), for a layer the restore does not have, and
// for one registered before the restore started; and, when still waiting,
// when the progress goes.
TEST(LayerProgressTest, WhenReadyRunsOnceTheLayerIsWrittenOrTheRestoreEnds) {
  std::vector<int> ran(6, 0);
  auto count = [&](int i) { return [&ran, i] { ++ran[i]; }; };
  {
    LayerProgress progress;
    progress.whenReady(0, count(0)); // Before the restore starts.
    progress.reset(2, 100);
    EXPECT_EQ(ran[0], 0);
    progress.whenReady(1, count(1));
    progress.whenReady(7, count(2)); // No such layer.
    EXPECT_EQ(ran[2], 1);
    progress.add(0, 1, 60);
    EXPECT_EQ(ran[0], 0);
    progress.add(0, 2, 40);
    EXPECT_EQ(ran[0], 1);
    EXPECT_EQ(ran[1], 0); // 40 of its 100 tokens.
    progress.finish(dataLoss("a chunk is corrupt"));
    EXPECT_EQ(ran[1], 1);
    progress.whenReady(1, count(3)); // After the end: at once.
    EXPECT_EQ(ran[3], 1);
    progress.reset(1, 10);
    progress.whenReady(0, count(4));
  }
  EXPECT_EQ(ran[4], 1); // Gone with the progress.
  EXPECT_EQ(ran, (std::vector<int>{1, 1, 1, 1, 1, 0}));
}

// A write counted with a settle completes its layers only once the settle
// has succeeded, and calls it only when it completes one; a failed settle
// is the add's error and leaves the layer incomplete.
TEST(LayerProgressTest, AWriteCompletesALayerOnlyOnceItsDeviceSettled) {
  LayerProgress progress;
  progress.reset(2, 100);
  int settles = 0;
  bool readyDuringSettle = true;
  auto settle = [&] {
    ++settles;
    readyDuringSettle = progress.ready(0);
    return Status::ok();
  };
  ASSERT_TRUE(progress.add(0, 2, 60, settle).isOk());
  EXPECT_EQ(settles, 0);
  EXPECT_TRUE(progress.ready(0, 60)); // Token counts are of writes enqueued.
  ASSERT_TRUE(progress.add(0, 1, 40, settle).isOk());
  EXPECT_EQ(settles, 1);
  EXPECT_FALSE(readyDuringSettle);
  EXPECT_TRUE(progress.ready(0));
  EXPECT_TRUE(progress.completedAt(0).has_value());

  Status failed = progress.add(1, 2, 40, [] { return dataLoss("no device"); });
  EXPECT_EQ(failed.code(), StatusCode::DataLoss);
  EXPECT_FALSE(progress.ready(1));
  progress.finish(failed);
  EXPECT_EQ(progress.wait(1).code(), StatusCode::DataLoss);
}

TEST_F(ExecutorTest, RefillingADeviceBufferEarlyIsAnErrorNotARace) {
  // One slot; the first chunk's scatter made to wait for the second chunk's
  // copy, which so lands in the device buffer the first still holds.
  // Objects of half a chunk, which go through the slot's device buffer.
  std::unique_ptr<ChunkStore> store = storeIn(CodecSpec(), 32);
  BundlePlan plan =
      makePlan({0, 0, 64, /*slots=*/1}, model_->config().numLayers);
  ASSERT_EQ(plan.tasks[3].steps.back().kind, StepKind::Scatter);
  ASSERT_EQ(plan.tasks[6].steps.front().kind, StepKind::TransferToDevice);
  plan.tasks[6].after = {5};
  plan.tasks[3].after = {2, 6};
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> metrics = run(plan, table, store.get());
  ASSERT_FALSE(metrics);
  EXPECT_EQ(metrics.status().code(), StatusCode::Internal);
  EXPECT_NE(metrics.status().message().find("refilled before its chunk was "
                                            "scattered"),
            std::string::npos);
}

TEST_F(ExecutorTest, ReportsMetrics) {
  BlockTable table = *cache_->allocate(kTokens);
  BundlePlan plan = makePlan({128, 2, 64}, model_->config().numLayers);
  // The compiler's predictions: 2 us per compute task, 3 us per fetch and
  // 100 bytes per fetched chunk.
  plan.predictedUs = 1234;
  int64_t computeTasks = 0, fetches = 0;
  for (BundleTask &task : plan.tasks) {
    if (task.resource == Resource::Compute) {
      task.predictedNs = std::make_pair(int64_t(0), int64_t(2000));
      ++computeTasks;
    }
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch) {
        task.predictedNs = std::make_pair(int64_t(500), int64_t(3500));
        step.predictedBytes = 100;
        ++fetches;
      }
  }
  StatusOr<RestoreMetrics> metrics = run(plan, table);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_GT(metrics->makespanSeconds, 0);
  EXPECT_GT(metrics->bytesRead["dram"], 0);
  EXPECT_GT(metrics->flops, 0);
  EXPECT_GT(metrics->busySeconds["compute"], 0);
  EXPECT_GT(metrics->busySeconds["io:dram"], 0);
  ASSERT_TRUE(metrics->predictedSeconds.has_value());
  EXPECT_DOUBLE_EQ(*metrics->predictedSeconds, 1234e-6);
  EXPECT_DOUBLE_EQ(metrics->predictedBusySeconds["compute"],
                   double(computeTasks) * 2e-6);
  EXPECT_DOUBLE_EQ(metrics->predictedBusySeconds["io:dram"],
                   double(fetches) * 3e-6);
  EXPECT_EQ(metrics->predictedBytesRead["dram"], 100 * fetches);
  // Every layer is complete once its last scatter is: at 2 us, predicted;
  // measured, within the restore.
  const size_t layers = size_t(model_->config().numLayers);
  ASSERT_EQ(metrics->predictedLayerReadySeconds.size(), layers);
  for (double seconds : metrics->predictedLayerReadySeconds)
    EXPECT_DOUBLE_EQ(seconds, 2e-6);
  ASSERT_EQ(metrics->layerReadySeconds.size(), layers);
  for (double seconds : metrics->layerReadySeconds) {
    EXPECT_GT(seconds, 0);
    EXPECT_LE(seconds, metrics->makespanSeconds);
  }
  // Without fallbacks the run computes exactly what the plan says.
  EXPECT_TRUE(metrics->fallbacks.empty());
  EXPECT_DOUBLE_EQ(metrics->plannedFlops, metrics->flops);
}

// A raw chunk is read once, straight into the CPU cache's rows, and checked
// there: the host moves each loaded byte once (plus each object's header),
// from the memory and the file tiers, and nothing is left to scatter. An
// int8 chunk's stored bytes are read once and dequantized straight into
// the cache's rows.
TEST_F(ExecutorTest, ARawChunkIsCopiedOnceOnTheHost) {
  const int64_t layers = model_->config().numLayers;
  const int64_t delivered =
      kTokens * layers * 2 * model_->kvDim() * int64_t(sizeof(uint16_t));
  // This process's own: ctest runs the binary under several OpenBLAS
  // kernels side by side.
  const std::string directory =
      ::testing::TempDir() + "/kvc-one-copy-" + std::to_string(::getpid());
  std::filesystem::remove_all(directory);
  for (const std::string &url : {std::string("mem://"), "file://" + directory})
    for (const char *codec : {"raw", "int8"}) {
      SCOPED_TRACE(url + " " + codec);
      tier_ = std::shared_ptr<Tier>(std::move(openTier(url).value()));
      std::unique_ptr<ChunkStore> store = storeIn(*parseCodecSpec(codec));
      int64_t stored = 0, objects = 0;
      for (const ChunkRef &ref : store->refs(tokens_.data(), kTokens, Form::KV,
                                             *parseCodecSpec(codec))) {
        std::string bytes;
        ASSERT_TRUE(tier_->get(ref.name(), bytes).isOk()) << ref.name();
        stored += int64_t(bytes.size());
        ++objects;
      }
      const BundlePlan plan =
          loading(makePlan({0, 0, 64}, layers), *parseCodecSpec(codec));
      BlockTable table = *cache_->allocate(kTokens);
      StatusOr<RestoreMetrics> metrics = run(plan, table, store.get());
      ASSERT_TRUE(metrics) << metrics.status().toString();
      EXPECT_TRUE(metrics->fallbacks.empty());
      const HostTraffic &traffic = metrics->hostTraffic;
      EXPECT_EQ(traffic.delivered, delivered);
      EXPECT_EQ(traffic.read, stored);
      EXPECT_EQ(traffic.copied, 0);
      if (std::string(codec) == "raw") {
        EXPECT_EQ(traffic.decoded, 0);
        EXPECT_EQ(traffic.scattered, 0);
        EXPECT_EQ(stored, delivered + objects * int64_t(kChunkHeaderBytes));
        EXPECT_LT(traffic.perByte(), 1.01);
        EXPECT_LT(relativeError(table), 1.0 / 128);
      } else {
        EXPECT_EQ(traffic.decoded, delivered);
        EXPECT_EQ(traffic.scattered, 0);
        EXPECT_LT(relativeError(table), 1.0 / 32); // int8's error.
        EXPECT_LT(stored, delivered * 3 / 5);
      }
      cache_->release(table);
    }
  std::filesystem::remove_all(directory);
}

// What a restore moves on the host is counted by the plan step that moved
// it (RestoreMetrics::hostTrafficByStep) and by task in its trace (each
// task event's args): raw K and V are read into the cache by the fetch and
// the decompress step finds them there; int8 is read by the fetch and
// decoded into the cache by the decompress step.
TEST_F(ExecutorTest, HostTrafficIsCountedByStepAndInTheTrace) {
  const int64_t layers = model_->config().numLayers;
  const int64_t delivered =
      kTokens * layers * 2 * model_->kvDim() * int64_t(sizeof(uint16_t));
  for (const char *codec : {"raw", "int8"}) {
    SCOPED_TRACE(codec);
    tier_ = std::shared_ptr<Tier>(std::move(openTier("mem://").value()));
    std::unique_ptr<ChunkStore> store = storeIn(*parseCodecSpec(codec));
    const BundlePlan plan =
        loading(makePlan({0, 0, 64}, layers), *parseCodecSpec(codec));
    BlockTable table = *cache_->allocate(kTokens);
    RestoreOptions options;
    options.tracePath = ::testing::TempDir() + "/kvc-traffic-" +
                        std::to_string(::getpid()) + ".json";
    StatusOr<RestoreMetrics> metrics =
        restore(*pools_, plan, targetFor(table, store.get()), options);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    const HostTraffic &total = metrics->hostTraffic;
    const auto &byStep = metrics->hostTrafficByStep;
    ASSERT_EQ(byStep.count("fetch"), 1u);
    ASSERT_EQ(byStep.count("decompress"), 1u);
    const HostTraffic &fetch = byStep.at("fetch"),
                      &decode = byStep.at("decompress");
    EXPECT_EQ(fetch.read, total.read);
    EXPECT_EQ(fetch.delivered + fetch.decoded + fetch.copied, 0);
    EXPECT_EQ(decode.read, 0);
    EXPECT_EQ(decode.delivered, delivered);
    EXPECT_EQ(decode.decoded, std::string(codec) == "raw" ? 0 : delivered);
    HostTraffic sum;
    for (const auto &[step, traffic] : byStep)
      sum += traffic;
    EXPECT_EQ(sum.counters(), total.counters());

    // The trace: the fetches' events hold every byte read, the others
    // every byte delivered.
    std::ifstream in(options.tracePath);
    const nlohmann::json trace = nlohmann::json::parse(in);
    int64_t read = 0, inCache = 0;
    for (const nlohmann::json &event : trace) {
      if (event["ph"] != "X" || event["cat"] == "device")
        continue;
      const std::string name = event["name"];
      const nlohmann::json &args = event["args"];
      if (args.contains("read_bytes")) {
        EXPECT_EQ(name.rfind("fetch", 0), 0u) << name;
        read += args["read_bytes"].get<int64_t>();
      }
      if (args.contains("delivered_bytes"))
        inCache += args["delivered_bytes"].get<int64_t>();
    }
    EXPECT_EQ(read, total.read);
    EXPECT_EQ(inCache, delivered);
    std::remove(options.tracePath.c_str());
    cache_->release(table);
  }
}

// A raw object read in place is checked as one read whole would be: a
// flipped payload byte, a truncated or lengthened object are each refused
// (and the chunk recomputed), with the reason a whole read gives.
TEST_F(ExecutorTest, AnObjectReadInPlaceIsCheckedAsAWholeOne) {
  const int64_t layers = model_->config().numLayers;
  struct Damage {
    const char *what;
    std::function<void(std::string &)> apply;
  };
  for (const Damage &damage :
       {Damage{"checksum mismatch",
               [](std::string &b) { b[b.size() - 3] ^= 0x10; }},
        Damage{"header says", [](std::string &b) { b.resize(b.size() - 2); }},
        Damage{"trailing bytes", [](std::string &b) { b += "xx"; }}}) {
    SCOPED_TRACE(damage.what);
    useModel(DType::BF16);
    std::string name = victim(*store_, tokens_), bytes;
    ASSERT_TRUE(tier_->get(name, bytes).isOk());
    damage.apply(bytes);
    ASSERT_TRUE(tier_->put(name, bytes).isOk());
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<RestoreMetrics> metrics = run(makePlan({0, 0, 64}, layers), table);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    ASSERT_EQ(metrics->fallbacks.size(), 1u);
    EXPECT_NE(metrics->fallbacks[0].find(damage.what), std::string::npos)
        << metrics->fallbacks[0];
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
  }
}

/// The CPU runner of a model, its prefills counted: a server's own runner.
class CountingRunner final : public ModelRunner {
public:
  CountingRunner(Device &device, const ModelCompute &model)
      : ModelRunner(device, model), cpu_(cpuDevice().createRunner(model)) {}
  StatusOr<double> project(const DeviceBuffer &hidden, DType dtype,
                           const ChunkBox &box, DeviceBuffer &kv) override {
    return cpu_->project(hidden, dtype, box, kv);
  }
  Status prefillInto(PagedKVCache &cache, const BlockTable &table,
                     const int32_t *tokens, int64_t position, int64_t n,
                     int64_t layers, const LayerWritten &written) override {
    ++prefills;
    return cpu_->prefillInto(cache, table, tokens, position, n, layers,
                             written);
  }
  Status decode(PagedKVCache &cache, const BlockTable &table, int64_t position,
                const int32_t *tokens, int64_t n, float *logits,
                const LayerGate &attend) override {
    return cpu_->decode(cache, table, position, tokens, n, logits, attend);
  }
  StatusOr<double> timePrefill(const ModelCompute::Cache &context,
                               const std::vector<int32_t> &tokens,
                               int64_t position, int64_t n) override {
    return cpu_->timePrefill(context, tokens, position, n);
  }
  std::atomic<int> prefills{0};

private:
  std::unique_ptr<ModelRunner> cpu_;
};

// A server's own runner of the model (on a GPU, createCudaRunner over the
// weights it holds) computes a restore's chunks in place of one the device
// would make; a runner of another device or model is refused.
TEST_F(ExecutorTest, ARunnerTheServerGivesComputesTheChunks) {
  CountingRunner server(*device_, *model_);
  BlockTable table = *cache_->allocate(kTokens);
  RestoreTarget target = targetFor(table);
  target.runner = &server;
  const BundlePlan cake = makePlan({128, 0, 64}, model_->config().numLayers);
  StatusOr<RestoreMetrics> metrics = restore(*pools_, cake, target);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_GT(server.prefills.load(), 0);
  EXPECT_LT(relativeError(table), 1.0 / 128);

  ForwardingDevice other;
  CountingRunner elsewhere(other, *model_);
  target.runner = &elsewhere;
  EXPECT_EQ(restore(*pools_, cake, target).status().code(),
            StatusCode::InvalidArgument);
  auto another = LlamaModel::load(
      test::generateTestModel("exec-another", 7, 4, 128, DType::F32));
  ASSERT_TRUE(another) << another.status().toString();
  CountingRunner ofAnother(*device_, **another);
  target.runner = &ofAnother;
  EXPECT_EQ(restore(*pools_, cake, target).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(elsewhere.prefills.load() + ofAnother.prefills.load(), 0);
  cache_->release(table);
}

TEST_F(ExecutorTest, DeletedChunkIsRecomputedAndReported) {
  ASSERT_TRUE(tier_->remove(victim(*store_, tokens_)).isOk());
  expectExact({0, 0, 64}, /*expectedFallbacks=*/1);
  // Through one staging slot: the failed chunk gives its slot back.
  expectExact({0, 0, 64, /*slots=*/1}, 1);
}

TEST_F(ExecutorTest, ComputingTheFirstLayersOfLateTokensIsExact) {
  const int64_t layers = model_->config().numLayers;
  // Layer 0 computed for every token, hidden states for the rest.
  expectExact({0, layers, 64, 0, /*computeLayers=*/1});
  // Cake's front, then layer 0 computed and KV for the rest.
  expectExact({128, 0, 64, 0, 1});
  // A KV chunk of a deeper layer lost: its fallback needs layers the plan
  // computed only shallowly, so the prefill starts over at full depth.
  ASSERT_TRUE(tier_->remove(victim(*store_, tokens_)).isOk());
  expectExact({64, 2, 64, 0, 1}, /*expectedFallbacks=*/1);
}

TEST_F(ExecutorTest, CorruptedByteIsRecomputedAndReported) {
  std::string name = victim(*store_, tokens_), bytes;
  ASSERT_TRUE(tier_->get(name, bytes).isOk());
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(tier_->put(name, bytes).isOk());
  expectExact({0, 0, 64}, 1);
}

// Values stored with valid checksums that are NaN or infinite (a faulty
// writer, a model whose weights held NaN) make a corrupt chunk: recomputed
// and reported, in either form, never served.
TEST_F(ExecutorTest, NonFiniteValuesAreRecomputedAndReported) {
  const int64_t layers = model_->config().numLayers;
  for (Form form : {Form::KV, Form::Hidden})
    for (const ChunkRef &ref :
         store_->refs(tokens_.data(), kTokens, form, CodecSpec()))
      if (ref.tokenBegin == 192 && ref.layerBegin == 0) {
        std::vector<float> values(store_->shape(ref).numel());
        ASSERT_TRUE(store_->get(ref, values.data()).isOk()) << ref.name();
        values[3] = std::nanf("");
        values[7] = std::numeric_limits<float>::infinity();
        ASSERT_TRUE(store_->remove(ref).isOk());
        ASSERT_TRUE(store_->put(ref, values.data()).isOk());
      }
  for (Split split : {Split{0, 0, 64}, Split{0, layers, 64}}) {
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<RestoreMetrics> metrics = run(makePlan(split, layers), table);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    ASSERT_FALSE(metrics->fallbacks.empty());
    EXPECT_NE(metrics->fallbacks[0].find("holds 2 non-finite values"),
              std::string::npos)
        << metrics->fallbacks[0];
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
  }
}

// Verification counts non-finite values on either side, and a cache holding
// one is infinitely wrong (a maximum over NaN would drop it).
TEST_F(ExecutorTest, VerificationSeesNonFiniteValues) {
  const int64_t layers = model_->config().numLayers, kv = model_->kvDim();
  BlockTable table = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({kTokens, 0, 64}, layers), table).isOk());
  std::vector<float> k(kv, std::nanf("")), v(kv, 1.0f);
  ASSERT_TRUE(cache_->write(table, 1, 17, 1, k.data(), v.data()).isOk());
  StatusOr<RestoreError> error =
      restoreError(*model_, reference_, kTokens, *cache_, table, *device_);
  ASSERT_TRUE(error) << error.status().toString();
  EXPECT_EQ(error->nonFiniteRestored, kv);
  EXPECT_EQ(error->nonFiniteReference, 0);
  EXPECT_TRUE(std::isinf(error->max));
  EXPECT_TRUE(std::isinf(error->relativeL2));
  ModelCompute::Cache poisoned = reference_;
  poisoned.v[0][5] = std::numeric_limits<float>::infinity();
  error = restoreError(*model_, poisoned, kTokens, *cache_, table, *device_);
  ASSERT_TRUE(error) << error.status().toString();
  EXPECT_EQ(error->nonFiniteReference, 1);
}

TEST_F(ExecutorTest, ChunkOfAnotherModelIsRecomputedAndReported) {
  // Another model's chunk for the same tokens, filed under this model's
  // name for it.
  auto other = LlamaModel::load(test::generateTestModel("exec-other", 8));
  ASSERT_TRUE(other);
  auto otherTier = std::shared_ptr<Tier>(std::move(openTier("mem://").value()));
  StoreLayout layout;
  layout.chunkTokens = 64;
  layout.layerGroup = 2;
  ChunkStore otherStore(otherTier, (*other)->config(), (*other)->fingerprint(),
                        "", layout);
  ASSERT_TRUE(saveContext(**other, otherStore, tokens_, {}).isOk());
  std::string bytes;
  ASSERT_TRUE(otherTier->get(victim(otherStore, tokens_), bytes).isOk());
  ASSERT_TRUE(tier_->put(victim(*store_, tokens_), bytes).isOk());

  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> metrics =
      run(makePlan({0, 0, 64}, model_->config().numLayers), table);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  ASSERT_EQ(metrics->fallbacks.size(), 1u);
  // The plan's chunk holding the bad object is recomputed as a whole.
  EXPECT_NE(metrics->fallbacks[0].find("kv tokens 192 to 256, layers 0 to 4 "
                                       "recomputed: failed_precondition: "),
            std::string::npos)
      << metrics->fallbacks[0];
  EXPECT_NE(metrics->fallbacks[0].find("chunk was saved by model "),
            std::string::npos)
      << metrics->fallbacks[0];
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

/// A tier that cannot be reached, as a store whose server is down.
class DownTier : public Tier {
public:
  const std::string &url() const override { return url_; }
  Status put(const std::string &, std::string_view) override { return down(); }
  Status get(const std::string &, std::string &) override { return down(); }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &) override {
    return std::vector<Status>(names.size(), down());
  }
  StatusOr<bool> exists(const std::string &) override { return down(); }
  Status remove(const std::string &) override { return down(); }
  StatusOr<std::vector<std::string>> list(const std::string &) override {
    return down();
  }

private:
  static Status down() {
    return unavailable("redis://10.0.0.1:6379: connection "
                       "refused");
  }
  std::string url_ = "redis://10.0.0.1:6379";
};

TEST_F(ExecutorTest, UnreachableStoreFallsBackToCompute) {
  tier_ = std::make_shared<DownTier>();
  std::unique_ptr<ChunkStore> down = makeStore(*model_);
  BlockTable table = *cache_->allocate(kTokens);
  BundlePlan plan = makePlan({0, 0, 64}, model_->config().numLayers);
  StatusOr<RestoreMetrics> metrics = run(plan, table, down.get());
  ASSERT_TRUE(metrics) << metrics.status().toString();
  // Every loaded chunk (5 token chunks x 1 KV box) is recomputed, and says
  // why.
  ASSERT_EQ(metrics->fallbacks.size(), 5u);
  EXPECT_NE(metrics->fallbacks[0].find("unavailable: redis://10.0.0.1:6379: "
                                       "connection refused"),
            std::string::npos)
      << metrics->fallbacks[0];
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

/// A tier whose reads of some objects wait until the test opens it: a slow
/// store the test controls.
class GatedTier : public ForwardingTier {
public:
  GatedTier(std::shared_ptr<Tier> inner, std::set<std::string> gated)
      : ForwardingTier(std::move(inner)), gated_(std::move(gated)) {}
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }

  Status get(const std::string &name, std::string &buffer) override {
    if (gated_.count(name)) {
      std::unique_lock<std::mutex> lock(mutex_);
      opened_.wait(lock, [&] { return open_; });
    }
    return inner().get(name, buffer);
  }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    return Tier::getMany(names, buffers); // One get each, each gated.
  }

private:
  std::set<std::string> gated_;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

/// A restore whose layers 0 and 1 come from hidden states while the store
/// holds back every KV object (layers 2 and 3) until `gate_` opens.
class HeldKvTest : public ExecutorTest {
protected:
  void SetUp() override {
    ExecutorTest::SetUp();
    std::set<std::string> kvObjects;
    for (const ChunkRef &ref :
         store_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec()))
      kvObjects.insert(ref.name());
    gate_ = std::make_shared<GatedTier>(tier_, kvObjects);
    tier_ = gate_;
    held_ = makeStore(*model_);
    // An io worker per held KV fetch (5 chunks) and one for the hidden
    // states.
    heldPools_ = std::move(
        ResourcePools::create(
            {{"io:dram", 6}, {"decode", 2}, {"h2d", 1}, {"compute", 1}})
            .value());
    options_.progress = &progress_;
  }

  /// Starts the restore into `table` on a thread of its own.
  std::thread start(const BlockTable &table) {
    return std::thread([this, &table] {
      metrics_ = restore(
          *heldPools_,
          makePlan({0, /*hiddenLayers=*/2, 64}, model_->config().numLayers),
          targetFor(table, held_.get()), options_);
    });
  }

  std::shared_ptr<GatedTier> gate_;
  std::unique_ptr<ChunkStore> held_;
  std::unique_ptr<ResourcePools> heldPools_;
  LayerProgress progress_;
  RestoreOptions options_;
  StatusOr<RestoreMetrics> metrics_ =
      internalError("the restore has not ended");
};

// A server waits for layer i of a restore while later layers still load, to
// overlap the restore with its forward pass: here layers 0 and 1 are
// complete (and exact) while layers 2 and 3 are held back.
TEST_F(HeldKvTest, LayersCompleteWhileLaterLayersStillLoad) {
  const int64_t layers = model_->config().numLayers;
  BlockTable table = *cache_->allocate(kTokens);
  std::thread restoring = start(table);

  Status layer0 = progress_.wait(0, std::chrono::seconds(60));
  if (!layer0.isOk()) { // Fail, and end the restore: not a hang.
    gate_->open();
    restoring.join();
    FAIL() << layer0.toString();
  }
  EXPECT_TRUE(progress_.ready(1));
  EXPECT_FALSE(progress_.ready(layers - 1));
  // Layer 0 is already what a full prefill computes.
  const int64_t kv = model_->kvDim();
  std::vector<float> k(kTokens * kv), v(kTokens * kv);
  EXPECT_TRUE(cache_->read(table, 0, 0, kTokens, k.data(), v.data()).isOk());
  EXPECT_LT(test::relativeMaxError(k, reference_.k[0]), test::kOneBf16Step);

  // The held layers complete only once the store lets their KV go, at
  // least this long after the others: the restore measures when.
  const auto held = std::chrono::milliseconds(50);
  std::this_thread::sleep_for(held);
  gate_->open();
  restoring.join();
  ASSERT_TRUE(metrics_) << metrics_.status().toString();
  EXPECT_TRUE(metrics_->fallbacks.empty());
  EXPECT_TRUE(progress_.wait(layers - 1).isOk());
  ASSERT_EQ(metrics_->layerReadySeconds.size(), size_t(layers));
  EXPECT_GE(metrics_->layerReadySeconds[2] - metrics_->layerReadySeconds[1],
            std::chrono::duration<double>(held).count());
  EXPECT_LE(metrics_->layerReadySeconds[layers - 1], metrics_->makespanSeconds);
  EXPECT_LT(relativeError(table), 1.0 / 128);
  EXPECT_EQ(progress_.wait(layers).code(), StatusCode::InvalidArgument);
}

// A server's forward pass beside the restore (ModelRunner::decode gated on the
// restore's layers) opens each layer in turn and stops at the first one not
// yet written; its logits are those of the same step run after the restore.
TEST_F(HeldKvTest, AForwardPassBesideTheRestoreWaitsForEachLayer) {
  const int64_t layers = model_->config().numLayers, n = 8;
  BlockTable table = *cache_->allocate(kTokens + n);
  std::thread restoring = start(table);
  std::vector<int32_t> next(tokens_.begin(), tokens_.begin() + n);
  std::vector<float> logits(size_t(model_->config().vocabSize));
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int64_t> opened;
  auto attend = [&](int64_t layer) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      opened.push_back(layer);
    }
    changed.notify_all();
    return progress_.wait(layer, std::chrono::seconds(60));
  };
  Status forward(StatusCode::Internal, "the forward pass has not ended");
  ModelRunner &server = runner();
  std::thread forwarding([&] {
    forward = server.decode(*cache_, table, kTokens, next.data(), n,
                            logits.data(), attend);
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    EXPECT_TRUE(changed.wait_for(lock, std::chrono::seconds(60),
                                 [&] { return opened.size() >= 3; }));
    // Layer 2 stays closed while the store holds its KV.
    changed.wait_for(lock, std::chrono::milliseconds(50));
    EXPECT_EQ(opened, (std::vector<int64_t>{0, 1, 2}));
    EXPECT_FALSE(progress_.ready(2));
  }
  gate_->open();
  restoring.join();
  forwarding.join();
  ASSERT_TRUE(metrics_) << metrics_.status().toString();
  ASSERT_TRUE(forward.isOk()) << forward.toString();
  std::vector<int64_t> every(static_cast<size_t>(layers));
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(opened, every);
  std::vector<float> after(logits.size());
  ASSERT_TRUE(
      server.decode(*cache_, table, kTokens, next.data(), n, after.data())
          .isOk());
  EXPECT_EQ(logits, after);
}

// A restore that fails wakes whoever waits for its layers, with its error.
TEST_F(ExecutorTest, WaitingForALayerOfAFailedRestoreReturnsItsError) {
  BlockTable table = *cache_->allocate(kTokens);
  BundlePlan plan = makePlan({0, 0, 64}, model_->config().numLayers);
  plan.tokens.end = kTokens - 1; // Another request's plan.
  LayerProgress progress;
  RestoreOptions options;
  options.progress = &progress;
  ASSERT_FALSE(restore(*pools_, plan, targetFor(table), options));
  Status waited = progress.wait(0);
  EXPECT_EQ(waited.code(), StatusCode::InvalidArgument);
  EXPECT_NE(waited.toString().find("covers tokens"), std::string::npos)
      << waited.toString();
}

TEST_F(ExecutorTest, ConcurrentRestoresAreAllExact) {
  expectConcurrentRestoresExact();
}

TEST_F(ExecutorTest, RejectsPlansForAnotherRequest) {
  BlockTable table = *cache_->allocate(kTokens);
  BundlePlan plan = makePlan({0, 0, 64}, model_->config().numLayers);
  plan.tokens.end = 512;
  StatusOr<RestoreMetrics> metrics = run(plan, table);
  ASSERT_FALSE(metrics);
  EXPECT_EQ(metrics.status().message(),
            "restore: plan test covers tokens 0 to 512, the request has 300");

  // A plan that would leave part of the cache unwritten, or write part of
  // it twice, is refused before it runs: here the last chunk (tokens 256
  // to 300), every step of it, made shorter or moved back.
  auto lastChunk = [&](const std::function<void(BundleRange &)> &edit) {
    BundlePlan edited = makePlan({0, 0, 64}, model_->config().numLayers);
    for (BundleTask &task : edited.tasks)
      for (BundleStep &step : task.steps)
        if (step.tokens.begin == 256)
          edit(step.tokens);
    return edited;
  };
  EXPECT_EQ(run(lastChunk([](BundleRange &r) { r.end -= 4; }), table)
                .status()
                .message(),
            "restore: plan test leaves tokens 296 to 300 of layer 0 unwritten");
  EXPECT_EQ(run(lastChunk([](BundleRange &r) { r.begin -= 8; }), table)
                .status()
                .message(),
            "restore: plan test writes tokens 248 to 256 of layer 0 twice");

  RestoreTarget empty;
  EXPECT_EQ(restore(*pools_, plan, empty).status().message(),
            "restore: model, tokens, cache and block table are required");
}

} // namespace

TEST_F(ExecutorTest, TheResidentPrefixIsNeverWritten) {
  // The server holds tokens [0, 40): inside the first 64-token chunk, which
  // a kv plan loads and writes from token 40 on.
  const ModelConfig &config = model_->config();
  const int64_t kv = cache_->kvDim(), resident = 40;
  BlockTable table = *cache_->allocate(kTokens);
  const std::vector<float> marks(resident * kv, 3.0f);
  for (int64_t l = 0; l < config.numLayers; ++l)
    ASSERT_TRUE(cache_->write(table, l, 0, resident, marks.data(), marks.data())
                    .isOk());
  RestoreOptions options;
  options.resident = resident;
  StatusOr<RestoreMetrics> metrics =
      restore(*pools_, makePlan({0, 0, 64}, config.numLayers),
              targetFor(table), options);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  std::vector<float> k(resident * kv), v(resident * kv);
  for (int64_t l = 0; l < config.numLayers; ++l) {
    ASSERT_TRUE(cache_->read(table, l, 0, resident, k.data(), v.data()).isOk());
    EXPECT_EQ(k, marks) << "layer " << l;
    EXPECT_EQ(v, marks) << "layer " << l;
  }
  // Rows from 40 on are the request's.
  std::vector<float> full(kTokens * kv), fullV(kTokens * kv);
  BlockTable reference = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({0, 0, 64}, config.numLayers), reference).isOk());
  for (int64_t l = 0; l < config.numLayers; ++l) {
    std::vector<float> mine(kTokens * kv), mineV(kTokens * kv);
    ASSERT_TRUE(cache_->read(reference, l, 0, kTokens, full.data(),
                             fullV.data()).isOk());
    ASSERT_TRUE(
        cache_->read(table, l, 0, kTokens, mine.data(), mineV.data()).isOk());
    EXPECT_TRUE(std::equal(mine.begin() + resident * kv, mine.end(),
                           full.begin() + resident * kv))
        << "layer " << l;
  }
  // A plan that computes a chunk across (or above) the resident tokens is
  // refused.
  StatusOr<RestoreMetrics> computing =
      restore(*pools_, makePlan({128, 0, 64}, config.numLayers),
              targetFor(table), options);
  EXPECT_FALSE(computing);
  cache_->release(table);
  cache_->release(reference);
}
