//===- ConnectorBundleTest.cpp - The Connector without the compiler -------===//
//
// host::Connector as a server without the compiler runs it: its plans come
// from a bundle compiled ahead (host::bundleHook over
// KVC_CONNECTOR_PLANS, which the main build compiles). Built without the
// compiler too, so that the sanitizers run it (scripts/sanitizers.sh):
// saves layer by layer, a decided load, a concurrent pair, a cancel; plans
// chosen by the caller (as kvc-run restore runs them), fresh caches per
// run, Cake's walk, stores that must exist.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Connector.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include "TestModel.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <thread>

namespace kvc::host {
namespace {

constexpr int64_t kBlocks = 128;

class ConnectorBundleTest : public ::testing::Test {
protected:
  void SetUp() override {
    const char *plans = std::getenv("KVC_CONNECTOR_PLANS");
#ifdef KVC_CONNECTOR_PLANS_DEFAULT
    if (!plans)
      plans = KVC_CONNECTOR_PLANS_DEFAULT;
#endif
    if (!plans)
      GTEST_SKIP() << "no KVC_CONNECTOR_PLANS (a build with the compiler "
                      "writes unittests/connector-plans.json)";
    StatusOr<PlanBundle> bundle = readPlanBundle(plans);
    ASSERT_TRUE(bundle) << bundle.status().toString();
    bundle_ = std::make_shared<const PlanBundle>(*bundle);
    StatusOr<std::unique_ptr<LlamaModel>> loaded =
        LlamaModel::load(test::generateTestModel("connector-bundle", 7));
    ASSERT_TRUE(loaded) << loaded.status().toString();
    model_ = std::move(*loaded);
    StatusOr<TargetDesc> target =
        loadTargetDesc(KVC_SOURCE_DIR "/targets/cpu-2core.json");
    ASSERT_TRUE(target) << target.status().toString();
    ConnectorOptions options;
    options.model = model_.get();
    options.target = *target;
    options.planner = bundleHook({*bundle});
    options.plans.strategies = {planning::Strategy::Kv};
    options.saveLayout = {128, 1};
    options.stores = {{"mem://", ""}};
    StatusOr<std::unique_ptr<Connector>> connector = Connector::create(options);
    ASSERT_TRUE(connector) << connector.status().toString();
    connector_ = std::move(*connector);
    ASSERT_TRUE(connector_->registerCaches(serverCaches(memory_)).isOk());
    cache_ = registered_;
  }

  /// A paged cache over `memory` (sized here), as a server lays it out.
  std::unique_ptr<PagedKVCache> serverCaches(std::vector<uint16_t> &memory) {
    const ModelConfig &c = model_->config();
    const int64_t perLayer = kBlocks * 16 * c.numKvHeads * c.headDim;
    memory.assign(2 * c.numLayers * perLayer, 0);
    ServerCaches caches;
    caches.numBlocks = kBlocks;
    caches.numKvHeads = c.numKvHeads;
    caches.headDim = c.headDim;
    for (int64_t l = 0; l < c.numLayers; ++l) {
      caches.keys.push_back(memory.data() + 2 * l * perLayer);
      caches.values.push_back(memory.data() + (2 * l + 1) * perLayer);
    }
    StatusOr<std::unique_ptr<PagedKVCache>> view =
        viewServerCaches(caches, c);
    EXPECT_TRUE(view) << view.status().toString();
    registered_ = view ? view->get() : nullptr;
    return view ? std::move(*view) : nullptr;
  }

  /// Saves the KV of `tokens` (prefilled into blocks 0..) through `connector`.
  void saveThrough(Connector &connector, const std::vector<int32_t> &tokens) {
    const int64_t count = (int64_t(tokens.size()) + 15) / 16;
    ASSERT_TRUE(prefill(tokens, 0, blocks(0, count)).isOk());
    for (int64_t l = 0; l < model_->config().numLayers; ++l)
      ASSERT_TRUE(
          connector.saveLayer("saved", tokens, l, blocks(0, count)).isOk());
    ASSERT_TRUE(connector.waitSave("saved"));
  }

  static std::vector<int32_t> request(int64_t n) {
    std::vector<int32_t> tokens(n);
    for (int64_t i = 0; i < n; ++i)
      tokens[i] = int32_t((i * 37 + 11) % 512);
    return tokens;
  }

  static std::vector<int32_t> blocks(int32_t first, int64_t count) {
    std::vector<int32_t> ids(count);
    std::iota(ids.begin(), ids.end(), first);
    return ids;
  }

  Status prefill(const std::vector<int32_t> &tokens, int64_t from,
                 const std::vector<int32_t> &ids) {
    BlockTable table{ids};
    return cpuDevice().createRunner(*model_)->prefillInto(
        *cache_, table, tokens.data() + from, from,
        int64_t(tokens.size()) - from, model_->config().numLayers);
  }

  void expectExact(const std::vector<int32_t> &tokens,
                   const std::vector<int32_t> &ids) {
    BlockTable table{ids};
    StatusOr<RestoreError> error =
        restoreError(*model_, tokens, *cache_, table, cpuDevice());
    ASSERT_TRUE(error) << error.status().toString();
    EXPECT_TRUE(checkVerification(*error, verifyBound({})).isOk());
  }

  std::unique_ptr<LlamaModel> model_;
  std::shared_ptr<const PlanBundle> bundle_;
  std::unique_ptr<Connector> connector_;
  std::vector<uint16_t> memory_;
  PagedKVCache *cache_ = nullptr;
  PagedKVCache *registered_ = nullptr; ///< The last serverCaches made.
};

TEST_F(ConnectorBundleTest, SavesThenLoadsRequestsAtOnceThroughABundle) {
  std::vector<int32_t> tokens(300);
  for (int64_t i = 0; i < 300; ++i)
    tokens[i] = int32_t((i * 37 + 11) % 512);
  ASSERT_TRUE(prefill(tokens, 0, blocks(0, 19)).isOk());
  for (int64_t l = 0; l < model_->config().numLayers; ++l)
    ASSERT_TRUE(connector_->saveLayer("a", tokens, l, blocks(0, 19)).isOk());
  ASSERT_TRUE(connector_->waitSave("a"));

  // Two requests of the saved prefix at once, from two threads; a third
  // started and cancelled.
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const std::string id = "r" + std::to_string(r);
      StatusOr<Decision> decision = connector_->decide(id, tokens, 0);
      if (!decision || decision->loadTokens != 256) {
        results[r] =
            decision ? internalError(decision->why) : decision.status();
        return;
      }
      results[r] = connector_->startLoad(id, blocks(20 + r * 20, 19));
      for (int64_t l = 0; results[r].isOk() && l < 4; ++l)
        results[r] = connector_->waitLayer(id, l);
      if (results[r].isOk())
        results[r] = connector_->waitLoad(id).status();
    });
  ASSERT_TRUE(connector_->decide("c", tokens, 0));
  ASSERT_TRUE(connector_->startLoad("c", blocks(80, 19)).isOk());
  ASSERT_TRUE(connector_->cancel("c").isOk());
  for (std::thread &thread : threads)
    thread.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].isOk()) << results[r].toString();
    ASSERT_TRUE(prefill(tokens, 256, blocks(20 + r * 20, 19)).isOk());
    expectExact(tokens, blocks(20 + r * 20, 19));
  }
  EXPECT_EQ(connector_->plansCompiled(), 1);
  std::vector<std::string> loads;
  for (int i = 0; i < 200 && loads.size() < 3; ++i) {
    Finished done = connector_->finished();
    loads.insert(loads.end(), done.loads.begin(), done.loads.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::sort(loads.begin(), loads.end());
  EXPECT_EQ(loads, (std::vector<std::string>{"c", "r0", "r1"}));
}

TEST_F(ConnectorBundleTest, RunsAChosenPlanIntoAFreshCacheEachRun) {
  const std::vector<int32_t> tokens = request(256);
  saveThrough(*connector_, tokens);
  // Two runs of the plan, each into caches registered for it: the second
  // replaces the first (no load runs) and holds the request exactly.
  for (int run = 0; run < 2; ++run) {
    std::vector<uint16_t> memory;
    ASSERT_TRUE(connector_->registerCaches(serverCaches(memory)).isOk());
    cache_ = registered_;
    StatusOr<Decision> decision =
        connector_->decide("m", tokens, 0, {bundle_, "kv"});
    ASSERT_TRUE(decision) << decision.status().toString();
    EXPECT_EQ(decision->loadTokens, 256);
    EXPECT_EQ(decision->strategy, "kv");
    ASSERT_TRUE(connector_->startLoad("m", blocks(3, 16)).isOk());
    StatusOr<RestoreMetrics> metrics = connector_->waitLoad("m");
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_FALSE(metrics->walk);
    expectExact(tokens, blocks(3, 16));
    ASSERT_TRUE(connector_->cancel("m").isOk());
  }
  // Chosen plans compile nothing.
  EXPECT_EQ(connector_->plansCompiled(), 0);
  // A plan the bundle does not hold, and none at all.
  StatusOr<Decision> missing =
      connector_->decide("m", tokens, 0, {bundle_, "cake"});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), StatusCode::InvalidArgument);
  EXPECT_FALSE(connector_->decide("m", tokens, 0, {nullptr, ""}));
}

TEST_F(ConnectorBundleTest, RunsAChosenPlanAsCakesWalk) {
  const std::vector<int32_t> tokens = request(256);
  saveThrough(*connector_, tokens);
  ASSERT_TRUE(connector_->decide("w", tokens, 0, {bundle_, ""}));
  LoadOptions walk;
  walk.dynamic = true;
  ASSERT_TRUE(connector_->startLoad("w", blocks(40, 16), walk).isOk());
  for (int64_t l = 0; l < model_->config().numLayers; ++l)
    ASSERT_TRUE(connector_->waitLayer("w", l).isOk());
  StatusOr<RestoreMetrics> metrics = connector_->waitLoad("w");
  ASSERT_TRUE(metrics) << metrics.status().toString();
  // A KV plan is Cake's shape with its merge point at token 0.
  ASSERT_TRUE(metrics->walk);
  EXPECT_EQ(metrics->walk->predictedMergeToken, 0);
  EXPECT_EQ(metrics->walk->chunksComputed + metrics->walk->chunksLoaded, 2);
  expectExact(tokens, blocks(40, 16));
}

TEST_F(ConnectorBundleTest, ReplacesCachesOnlyWhileNothingUsesThem) {
  // A throttled store, so that the load runs while the caches are
  // registered again.
  ConnectorOptions options;
  options.model = model_.get();
  options.planner = bundleHook({});
  options.saveLayout = {128, 1};
  options.stores = {{"mem://?gbps=0.02", "slow"}};
  StatusOr<std::unique_ptr<Connector>> connector = Connector::create(options);
  ASSERT_TRUE(connector) << connector.status().toString();
  std::vector<uint16_t> first, second;
  ASSERT_TRUE((*connector)->registerCaches(serverCaches(first)).isOk());
  cache_ = registered_;
  const std::vector<int32_t> tokens = request(256);
  saveThrough(**connector, tokens);
  // Without a target, the Connector runs chosen plans only; the plan's
  // tier "dram" is the one store's.
  StatusOr<Decision> priced = (*connector)->decide("p", tokens, 0);
  ASSERT_FALSE(priced);
  EXPECT_EQ(priced.status().code(), StatusCode::FailedPrecondition);
  ASSERT_TRUE((*connector)->decide("p", tokens, 0, {bundle_, "kv"}));
  ASSERT_TRUE((*connector)->startLoad("p", blocks(20, 16)).isOk());
  Status replaced = (*connector)->registerCaches(serverCaches(second));
  EXPECT_EQ(replaced.code(), StatusCode::FailedPrecondition)
      << replaced.toString();
  ASSERT_TRUE((*connector)->waitLoad("p"));
  expectExact(tokens, blocks(20, 16));
  EXPECT_TRUE((*connector)->registerCaches(serverCaches(second)).isOk());
}

TEST_F(ConnectorBundleTest, AChosenPlanReadsOnlyTiersItsStoresAre) {
  ConnectorOptions options;
  options.model = model_.get();
  options.planner = bundleHook({});
  options.stores = {{"mem://", "a"}, {"mem://", "b"}};
  StatusOr<std::unique_ptr<Connector>> connector = Connector::create(options);
  ASSERT_TRUE(connector) << connector.status().toString();
  StatusOr<Decision> decision =
      (*connector)->decide("t", request(256), 0, {bundle_, "kv"});
  ASSERT_FALSE(decision);
  EXPECT_EQ(decision.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(decision.status().message().find("reads tier dram"),
            std::string::npos)
      << decision.status().toString();
}

TEST_F(ConnectorBundleTest, AReaderRefusesAStoreThatDoesNotExist) {
  const std::string missing =
      "file://" + ::testing::TempDir() + "/kvc-no-such-store";
  ConnectorOptions options;
  options.model = model_.get();
  options.planner = bundleHook({});
  options.stores = {{missing, ""}};
  options.createStores = false;
  StatusOr<std::unique_ptr<Connector>> reader = Connector::create(options);
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.status().code(), StatusCode::NotFound);
}

} // namespace
} // namespace kvc::host
