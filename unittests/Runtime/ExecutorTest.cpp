//===- ExecutorTest.cpp - Restores that must equal a full prefill ---------===//

#include "kvc/Runtime/Exec/DynamicCake.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Exec/Executor.h"

#include "kvc/Runtime/Save/Saver.h"
#include "TestModel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

using namespace kvc;

namespace {

constexpr int64_t kTokens = 300;

/// How a test plan restores the request: compute tokens [0, merge), load
/// the rest; loads read hidden states for layers [0, hiddenLayers) and KV
/// for the others (HCache's split); chunks of `chunk` tokens.
struct Split {
  int64_t merge = 0;
  int64_t hiddenLayers = 0;
  int64_t chunk = 64;
  /// Staging slots for the loads (0: none); a fetch reusing a slot waits
  /// for the copy of the chunk that used it before, as kvc-schedule orders.
  int64_t slots = 0;
  /// Tokens [merge, end) compute layers [0, computeLayers) instead of
  /// loading them (HCache's recompute complement); loads start above.
  int64_t computeLayers = 0;
};

BundleStep step(const char *op, const char *form, int64_t t0, int64_t t1,
                int64_t l0, int64_t l1, const char *tier = "") {
  BundleStep s;
  s.kind = *parseStepKind(op);
  s.form = *parseForm(form);
  s.tokens = {t0, t1};
  s.layers = {l0, l1};
  s.tier = tier;
  return s;
}

/// A scheduled plan as kvc-schedule shapes it: per loaded chunk, fetch on
/// alternating io lanes -> decompress -> copy -> (project +) scatter; per
/// computed chunk, one compute task. A fetch into a slot waits for the copy
/// of the slot's previous chunk, a copy for its scatter.
BundlePlan makePlan(const Split &split, int64_t layers) {
  BundlePlan plan;
  plan.name = "test";
  plan.tokens = {0, kTokens};
  plan.layers = {0, layers};
  auto add = [&](Resource resource, int64_t lane, std::vector<BundleStep> steps,
                 std::vector<int64_t> after) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    task.resource = resource;
    task.lane = lane;
    task.after = after;
    task.inputs = after;
    task.steps = std::move(steps);
    plan.tasks.push_back(std::move(task));
    return plan.tasks.back().id;
  };
  int64_t lane = 0, fetches = 0;
  plan.stagingSlots = split.slots;
  std::vector<int64_t> lastCopy(split.slots, -1), lastScatter(split.slots, -1);
  for (int64_t t0 = 0; t0 < kTokens; t0 += split.chunk) {
    int64_t t1 = std::min(kTokens, t0 + split.chunk);
    if (t1 <= split.merge) {
      add(Resource::Compute, 0,
          {step("chunk_compute", "kv", t0, t1, 0, layers),
           step("scatter", "kv", t0, t1, 0, layers)},
          {});
      continue;
    }
    t0 = std::max(t0, split.merge);
    const int64_t low = split.computeLayers;
    if (low > 0)
      add(Resource::Compute, 0,
          {step("chunk_compute", "kv", t0, t1, 0, low),
           step("scatter", "kv", t0, t1, 0, low)},
          {});
    for (bool hidden : {true, false}) {
      int64_t split_ = std::max(low, split.hiddenLayers);
      int64_t l0 = hidden ? low : split_;
      int64_t l1 = hidden ? split_ : layers;
      if (l0 == l1)
        continue;
      const char *form = hidden ? "hidden" : "kv";
      int64_t slot = split.slots ? fetches++ % split.slots : -1;
      std::vector<int64_t> wait;
      if (slot >= 0 && lastCopy[slot] >= 0)
        wait.push_back(lastCopy[slot]);
      int64_t f = add(Resource::IO, lane++ % 2,
                      {step("fetch", form, t0, t1, l0, l1, "dram")}, wait);
      plan.tasks[f].inputs.clear();
      if (slot >= 0)
        plan.tasks[f].slot = slot;
      int64_t d = add(Resource::Decode, 0,
                      {step("decompress", form, t0, t1, l0, l1)}, {f});
      std::vector<int64_t> copyAfter = {d};
      if (slot >= 0 && lastScatter[slot] >= 0)
        copyAfter.push_back(lastScatter[slot]);
      int64_t c =
          add(Resource::H2D, 0,
              {step("transfer_to_device", form, t0, t1, l0, l1)}, copyAfter);
      plan.tasks[c].inputs = {d};
      if (slot >= 0)
        lastCopy[slot] = c;
      std::vector<BundleStep> last;
      if (hidden)
        last.push_back(step("project", "hidden", t0, t1, l0, l1));
      last.push_back(step("scatter", "kv", t0, t1, l0, l1));
      int64_t sc = add(Resource::Compute, 0, std::move(last), {c});
      if (slot >= 0)
        lastScatter[slot] = sc;
    }
  }
  return plan;
}

class ExecutorTest : public ::testing::Test {
protected:
  void SetUp() override {
    useModel(DType::BF16);
    PagedCacheConfig config;
    config.layers = model_->config().numLayers;
    config.numKvHeads = model_->config().numKvHeads;
    config.headDim = model_->config().headDim;
    config.numBlocks = 8 * ((kTokens + 15) / 16);
    cache_ = std::move(PagedKVCache::create(config).value());
    pools_ = std::move(ResourcePools::create({{"io:dram", 2},
                                              {"decode", 2},
                                              {"h2d", 1},
                                              {"compute", 1}})
                           .value());
  }

  /// Makes the test's model a fresh one in `dtype`, with its context saved
  /// to a new store and its full prefill as the reference.
  void useModel(DType dtype) {
    auto model = LlamaModel::load(test::generateTestModel(
        std::string("exec-") + dtypeName(dtype), 7, 4, 128, dtype));
    ASSERT_TRUE(model) << model.status().toString();
    model_ = std::move(model).value();
    tokens_.resize(kTokens);
    for (int64_t i = 0; i < kTokens; ++i)
      tokens_[i] = int32_t((i * 37 + 11) % model_->config().vocabSize);
    tier_ = std::shared_ptr<Tier>(std::move(openTier("mem://").value()));
    store_ = makeStore(*model_);
    ASSERT_TRUE(saveContext(*model_, *store_, tokens_, {}).isOk());
    reference_ = model_->newCache();
    ASSERT_TRUE(
        model_->prefill(reference_, tokens_.data(), kTokens).isOk());
  }

  std::unique_ptr<ChunkStore> makeStore(const LlamaModel &model) {
    StoreLayout layout;
    layout.chunkTokens = 64;
    layout.layerGroup = 2;
    return std::make_unique<ChunkStore>(tier_, model.config(),
                                        model.fingerprint(), "", layout);
  }

  /// The request restored into `table` of the test's cache from `store`
  /// (the test's by default) as tier "dram".
  RestoreTarget targetFor(const BlockTable &table,
                          ChunkStore *store = nullptr) {
    RestoreTarget target;
    target.model = model_.get();
    target.stores["dram"] = store ? store : store_.get();
    target.tokens = &tokens_;
    target.cache = cache_.get();
    target.table = &table;
    return target;
  }

  StatusOr<RestoreMetrics> run(const BundlePlan &plan, BlockTable &table,
                               ChunkStore *store = nullptr) {
    EXPECT_TRUE(validatePlanBundle(PlanBundle{1, "", {plan}}).isOk());
    return restore(*pools_, plan, targetFor(table, store));
  }

  /// Largest error of the restored cache against the full prefill, relative
  /// to the largest |K| or |V| of the reference.
  double relativeError(const BlockTable &table) {
    StatusOr<RestoreError> error =
        restoreError(*model_, reference_, kTokens, *cache_, table);
    EXPECT_TRUE(error) << error.status().toString();
    return error ? error->max : 1.0;
  }

  /// Fraction of the restored values that differ from the full prefill
  /// rounded to bf16: a handful where chunked and full prefills round apart,
  /// many where a restore path rounds anything on the way.
  double mismatched(const BlockTable &table) {
    const int64_t kv = model_->kvDim();
    std::vector<float> k(kTokens * kv), v(kTokens * kv);
    int64_t differ = 0, total = 0;
    for (int64_t l = 0; l < model_->config().numLayers; ++l) {
      EXPECT_TRUE(cache_->read(table, l, 0, kTokens, k.data(), v.data()).isOk());
      for (int64_t i = 0; i < kTokens * kv; ++i) {
        differ += k[i] != bf16ToFloat(floatToBf16(reference_.k[l][i]));
        differ += v[i] != bf16ToFloat(floatToBf16(reference_.v[l][i]));
        total += 2;
      }
    }
    return double(differ) / double(total);
  }

  /// A restore with `split` is exact: within bf16 rounding (2^-8 relative)
  /// of the full prefill.
  void expectExact(const Split &split, int64_t expectedFallbacks = 0) {
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<RestoreMetrics> metrics =
        run(makePlan(split, model_->config().numLayers), table);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(int64_t(metrics->fallbacks.size()), expectedFallbacks);
    // Computed chunks attend over the paged cache; only recomputing a
    // fallback needs an exact context of its own.
    if (expectedFallbacks == 0)
      EXPECT_EQ(metrics->exactContextBytes, 0);
    else
      EXPECT_GT(metrics->exactContextBytes, 0);
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
  }

  std::unique_ptr<LlamaModel> model_;
  std::vector<int32_t> tokens_;
  std::shared_ptr<Tier> tier_;
  std::unique_ptr<ChunkStore> store_;
  LlamaModel::Cache reference_;
  std::unique_ptr<PagedKVCache> cache_;
  std::unique_ptr<ResourcePools> pools_;
};

// Chunks are held in bf16 once decoded, hidden states in the model's own
// dtype: models stored in f16 and f32 restore as exactly as bf16 ones. An
// f32 model's hidden states are stored exactly, so K and V projected from
// them round to the bf16 values of a full prefill but for the few that the
// BLAS kernel's order of summation (CPU-dependent: up to 0.3% on AMD EPYC)
// puts on the other side of a rounding boundary; rounding the hidden states
// to bf16 on the way would change a third of the values.
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

TEST_F(ExecutorTest, EveryStrategyEqualsAFullPrefill) {
  const int64_t layers = model_->config().numLayers;
  expectExact({/*merge=*/kTokens, 0, 64});         // compute
  expectExact({0, 0, 64});                         // kv
  expectExact({0, layers, 64});                    // hidden
  expectExact({128, 0, 64});                       // cake
  expectExact({0, layers / 2, 64});                // hcache
  expectExact({128, layers / 2, 64});              // joint
  expectExact({96, 1, 96});                        // chunks off the store grid
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

TEST_F(ExecutorTest, RefillingADeviceBufferEarlyIsAnErrorNotARace) {
  // One slot; the first chunk's scatter made to wait for the second chunk's
  // copy, which so lands in the device buffer the first still holds.
  BundlePlan plan = makePlan({0, 0, 64, /*slots=*/1},
                             model_->config().numLayers);
  ASSERT_EQ(plan.tasks[3].steps.back().kind, StepKind::Scatter);
  ASSERT_EQ(plan.tasks[6].steps.front().kind, StepKind::TransferToDevice);
  plan.tasks[6].after = {5};
  plan.tasks[3].after = {2, 6};
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> metrics = run(plan, table);
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
  // Without fallbacks the run computes exactly what the plan says.
  EXPECT_TRUE(metrics->fallbacks.empty());
  EXPECT_DOUBLE_EQ(metrics->plannedFlops, metrics->flops);
}

/// The object name of the stored KV chunk holding token 200, layers 2-3.
std::string victim(ChunkStore &store, const std::vector<int32_t> &tokens) {
  for (const ChunkRef &ref :
       store.refs(tokens.data(), int64_t(tokens.size()), Form::KV))
    if (ref.tokenBegin <= 200 && 200 < ref.tokenEnd && ref.layerBegin == 2)
      return ref.name();
  ADD_FAILURE() << "no such chunk";
  return "";
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
    return Status(StatusCode::Unavailable, "redis://10.0.0.1:6379: connection "
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

// A server waits for layer i of a restore while later layers still load, to
// overlap the restore with its forward pass: here layers 0 and 1 come from
// hidden states and are complete (and exact) while every KV object of
// layers 2 and 3 is held back by the store.
TEST_F(ExecutorTest, LayersCompleteWhileLaterLayersStillLoad) {
  const int64_t layers = model_->config().numLayers;
  std::set<std::string> kvObjects;
  for (const ChunkRef &ref : store_->refs(tokens_.data(), kTokens, Form::KV))
    kvObjects.insert(ref.name());
  auto gate = std::make_shared<GatedTier>(tier_, kvObjects);
  tier_ = gate;
  std::unique_ptr<ChunkStore> gated = makeStore(*model_);
  BlockTable table = *cache_->allocate(kTokens);
  RestoreTarget target = targetFor(table, gated.get());
  LayerProgress progress;
  RestoreOptions options;
  options.progress = &progress;
  // An io worker per held KV fetch (5 chunks) and one for the hidden states.
  auto pools = ResourcePools::create(
      {{"io:dram", 6}, {"decode", 2}, {"h2d", 1}, {"compute", 1}});
  ASSERT_TRUE(pools);
  StatusOr<RestoreMetrics> metrics = Status::ok();
  std::thread restoring([&] {
    metrics = restore(**pools, makePlan({0, /*hiddenLayers=*/2, 64}, layers),
                      target, options);
  });

  Status layer0 = progress.wait(0, std::chrono::seconds(60));
  if (!layer0.isOk()) { // Fail, and end the restore: not a hang.
    gate->open();
    restoring.join();
    FAIL() << layer0.toString();
  }
  EXPECT_TRUE(progress.ready(1));
  EXPECT_FALSE(progress.ready(layers - 1));
  // Layer 0 is already what a full prefill computes.
  const int64_t kv = model_->kvDim();
  std::vector<float> k(kTokens * kv), v(kTokens * kv);
  EXPECT_TRUE(cache_->read(table, 0, 0, kTokens, k.data(), v.data()).isOk());
  double maxError = 0, maxValue = 0;
  for (int64_t i = 0; i < kTokens * kv; ++i) {
    maxError = std::max(maxError, double(std::abs(k[i] - reference_.k[0][i])));
    maxValue = std::max(maxValue, double(std::abs(reference_.k[0][i])));
  }
  EXPECT_LT(maxError / maxValue, 1.0 / 128);

  gate->open();
  restoring.join();
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_TRUE(metrics->fallbacks.empty());
  EXPECT_TRUE(progress.wait(layers - 1).isOk());
  EXPECT_LT(relativeError(table), 1.0 / 128);
  EXPECT_EQ(progress.wait(layers).code(), StatusCode::InvalidArgument);
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
  const int64_t layers = model_->config().numLayers;
  std::vector<Split> splits = {{kTokens, 0, 64}, {0, 0, 64},
                               {0, layers, 64},  {128, 0, 64},
                               {0, 2, 64},       {128, 2, 64},
                               {96, 1, 96},      {64, 3, 32}};
  std::vector<BlockTable> tables;
  for (std::size_t i = 0; i < splits.size(); ++i)
    tables.push_back(*cache_->allocate(kTokens));
  std::vector<Status> results(splits.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < splits.size(); ++i)
    threads.emplace_back([&, i] {
      StatusOr<RestoreMetrics> metrics =
          run(makePlan(splits[i], layers), tables[i]);
      results[i] = metrics.status();
    });
  for (std::thread &t : threads)
    t.join();
  for (std::size_t i = 0; i < splits.size(); ++i) {
    EXPECT_TRUE(results[i].isOk()) << i << ": " << results[i].toString();
    EXPECT_LT(relativeError(tables[i]), 1.0 / 128) << "restore " << i;
  }
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
  // it twice, is refused before it runs.
  BundlePlan gappy = makePlan({0, 0, 64}, model_->config().numLayers);
  gappy.tasks.back().steps.back().tokens.end -= 4; // Last scatter: 256..296.
  EXPECT_EQ(run(gappy, table).status().message(),
            "restore: plan test leaves tokens 296 to 300 of layer 0 unwritten");
  BundlePlan twice = makePlan({0, 0, 64}, model_->config().numLayers);
  twice.tasks.back().steps.back().tokens.begin -= 8;
  EXPECT_EQ(run(twice, table).status().message(),
            "restore: plan test writes tokens 248 to 256 of layer 0 twice");

  RestoreTarget empty;
  EXPECT_EQ(restore(*pools_, plan, empty).status().message(),
            "restore: model, tokens, cache and block table are required");
}

//===----------------------------------------------------------------------===//
// Dynamic Cake
//===----------------------------------------------------------------------===//

/// A tier that answers every read `delay` late, as a congested store does.
class SlowTier : public ForwardingTier {
public:
  SlowTier(std::shared_ptr<Tier> inner, std::chrono::milliseconds delay)
      : ForwardingTier(std::move(inner)), delay_(delay) {}
  Status get(const std::string &name, std::string &buffer) override {
    std::this_thread::sleep_for(delay_);
    return inner().get(name, buffer);
  }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    std::this_thread::sleep_for(delay_);
    return inner().getMany(names, buffers);
  }

private:
  std::chrono::milliseconds delay_;
};

class DynamicCakeTest : public ExecutorTest {
protected:
  StatusOr<DynamicCakeResult> runCake(ChunkStore &store, BlockTable &table) {
    DynamicCakeOptions options;
    options.predictedMergeToken = 128;
    return restoreDynamicCake(*pools_, targetFor(table, &store), options);
  }
};

TEST_F(DynamicCakeTest, SidesMeetAndTheCacheIsExact) {
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<DynamicCakeResult> result = runCake(*store_, table);
  ASSERT_TRUE(result) << result.status().toString();
  // 300 tokens in 64-token store chunks: 5 chunks, each computed or loaded.
  EXPECT_EQ(result->chunksComputed + result->chunksLoaded, 5);
  EXPECT_GE(result->mergeToken, 0);
  EXPECT_LE(result->mergeToken, kTokens);
  EXPECT_TRUE(result->metrics.fallbacks.empty());
  EXPECT_EQ(result->predictedMergeToken, 128);
  EXPECT_GT(result->metrics.bytesRead["dram"] + result->chunksComputed, 0);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

// A compiled plan runs dynamically when it has Cake's shape: the plan's
// merge point becomes the prediction, its tier the loads' tier and its
// codec the only one they accept.
TEST_F(DynamicCakeTest, CompiledCakePlansConfigureTheWalk) {
  const int64_t layers = model_->config().numLayers;
  BundlePlan plan = makePlan({/*merge=*/128, 0, 64}, layers);
  StatusOr<DynamicCakeOptions> cake = dynamicCakeOptions(plan);
  ASSERT_TRUE(cake) << cake.status().toString();
  EXPECT_EQ(cake->tier, "dram");
  EXPECT_EQ(cake->predictedMergeToken, 128);
  ASSERT_TRUE(cake->codec);
  EXPECT_EQ(cake->codec->str(), "raw");
  // Loads of two codecs have no single walk.
  for (BundleTask &task : plan.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch && step.tokens.begin >= 192)
        step.codec = *parseCodecSpec("int8");
  StatusOr<DynamicCakeOptions> mixed = dynamicCakeOptions(plan);
  ASSERT_FALSE(mixed);
  EXPECT_NE(mixed.status().message().find("it loads codecs raw and int8/g32"),
            std::string::npos)
      << mixed.status().message();
  EXPECT_EQ(dynamicCakeOptions(makePlan({0, 0, 64}, layers))
                ->predictedMergeToken,
            0); // KV-only: Cake with nothing computed.
  auto refusal = [&](const Split &split) {
    StatusOr<DynamicCakeOptions> options =
        dynamicCakeOptions(makePlan(split, layers));
    return options ? std::string() : options.status().message();
  };
  EXPECT_NE(refusal({kTokens, 0, 64}).find("it loads nothing"),
            std::string::npos);
  EXPECT_NE(refusal({128, layers / 2, 64}).find("it loads hidden states"),
            std::string::npos);
  EXPECT_NE(refusal({128, 0, 64, 0, /*computeLayers=*/1})
                .find("it computes layers 0 to 1 only"),
            std::string::npos);
}

TEST_F(DynamicCakeTest, ASlowStoreMovesTheMergePointBack) {
  // Every read takes 200 ms: each loading lane gets through the chunk it
  // claimed first while compute takes the rest.
  tier_ = std::make_shared<SlowTier>(tier_, std::chrono::milliseconds(200));
  std::unique_ptr<ChunkStore> slow = makeStore(*model_);
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<DynamicCakeResult> result = runCake(*slow, table);
  ASSERT_TRUE(result) << result.status().toString();
  EXPECT_LE(result->chunksLoaded, 2); // One per io lane at most.
  EXPECT_GE(result->mergeToken, 192);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

TEST_F(DynamicCakeTest, UnloadableChunksAreRecomputed) {
  // Every KV object gone: the loaders hand every chunk they claim back.
  for (const ChunkRef &ref : store_->refs(tokens_.data(), kTokens, Form::KV))
    ASSERT_TRUE(tier_->remove(ref.name()).isOk());
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<DynamicCakeResult> result = runCake(*store_, table);
  ASSERT_TRUE(result) << result.status().toString();
  EXPECT_EQ(result->chunksLoaded, 0);
  EXPECT_EQ(int64_t(result->metrics.fallbacks.size()),
            5 - result->chunksComputed);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

} // namespace
