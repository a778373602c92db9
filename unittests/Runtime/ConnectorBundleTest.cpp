//===- ConnectorBundleTest.cpp - The Connector without the compiler -------===//
//
// host::Connector as a server without the compiler runs it: its plans come
// from a bundle compiled ahead (host::bundleHook over
// KVC_CONNECTOR_PLANS, which the main build compiles). Built without the
// compiler too, so that the sanitizers run it (scripts/sanitizers.sh):
// saves layer by layer, a decided load, a concurrent pair, a cancel.
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
    const ModelConfig &c = model_->config();
    const int64_t perLayer = kBlocks * 16 * c.numKvHeads * c.headDim;
    memory_.assign(2 * c.numLayers * perLayer, 0);
    ServerCaches caches;
    caches.numBlocks = kBlocks;
    caches.numKvHeads = c.numKvHeads;
    caches.headDim = c.headDim;
    for (int64_t l = 0; l < c.numLayers; ++l) {
      caches.keys.push_back(memory_.data() + 2 * l * perLayer);
      caches.values.push_back(memory_.data() + (2 * l + 1) * perLayer);
    }
    StatusOr<std::unique_ptr<PagedKVCache>> view =
        viewServerCaches(caches, c);
    ASSERT_TRUE(view) << view.status().toString();
    cache_ = view->get();
    ASSERT_TRUE(connector_->registerCaches(std::move(*view)).isOk());
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
  std::unique_ptr<Connector> connector_;
  std::vector<uint16_t> memory_;
  PagedKVCache *cache_ = nullptr;
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
        results[r] = decision ? Status(StatusCode::Internal, decision->why)
                              : decision.status();
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

} // namespace
} // namespace kvc::host
