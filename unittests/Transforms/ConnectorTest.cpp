//===- ConnectorTest.cpp - The one object a server calls ------------------===//
//
// A server in miniature around host::Connector, planning with the compiler
// in-process: it prefills and saves a request layer by layer, then serves
// later requests that share a prefix, whole or in part, loading what the
// Connector decides into blocks of its own cache and prefilling the rest
// itself; every cache is held against a full prefill.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Connector.h"
#include "kvc/Host/CompilerHook.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Testing/RedisCluster.h"

#include "../Runtime/ForwardingDevice.h"
#include "../Runtime/TestModel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <set>
#include <thread>
#include <unistd.h>

namespace kvc::host {
namespace {

constexpr int64_t kBlocks = 256; ///< 4096 tokens of 16-token blocks.

class ConnectorTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    StatusOr<std::unique_ptr<LlamaModel>> loaded =
        LlamaModel::load(test::generateTestModel("connector", 5));
    ASSERT_TRUE(loaded) << loaded.status().toString();
    model_ = std::move(*loaded).release();
  }
  static void TearDownTestSuite() { delete model_; }

  void SetUp() override {
    StatusOr<TargetDesc> target =
        loadTargetDesc(KVC_SOURCE_DIR "/targets/cpu-2core.json");
    ASSERT_TRUE(target) << target.status().toString();
    options_.model = model_;
    options_.target = *target;
    options_.planner = compilerPlanHook();
    options_.saveLayout = {128, 1};
    options_.stores = {{freshStore(), ""}};
    const ModelConfig &c = model_->config();
    memory_.assign(2 * c.numLayers * kBlocks * 16 * c.numKvHeads * c.headDim,
                   0);
  }

  /// A file:// store of its own (created by the Connector's first save).
  static std::string freshStore() {
    static int count = 0;
    return "file://" + test::tempPath("connector-store-" +
                                      std::to_string(count++));
  }

  /// The server's caches: per layer a K and a V tensor of kBlocks blocks.
  ServerCaches caches() {
    const ModelConfig &c = model_->config();
    ServerCaches out;
    out.numBlocks = kBlocks;
    out.numKvHeads = c.numKvHeads;
    out.headDim = c.headDim;
    const int64_t perLayer = kBlocks * 16 * c.numKvHeads * c.headDim;
    for (int64_t l = 0; l < c.numLayers; ++l) {
      out.keys.push_back(memory_.data() + 2 * l * perLayer);
      out.values.push_back(memory_.data() + (2 * l + 1) * perLayer);
    }
    return out;
  }

  std::unique_ptr<Connector> connect() {
    StatusOr<std::unique_ptr<Connector>> connector = Connector::create(options_);
    EXPECT_TRUE(connector) << connector.status().toString();
    if (!connector)
      return nullptr;
    StatusOr<std::unique_ptr<PagedKVCache>> view =
        viewServerCaches(caches(), model_->config());
    EXPECT_TRUE(view) << view.status().toString();
    view_ = view->get();
    Status registered = (*connector)->registerCaches(std::move(*view));
    EXPECT_TRUE(registered.isOk()) << registered.toString();
    return std::move(*connector);
  }

  /// Blocks [first, first + count).
  static std::vector<int32_t> blocks(int32_t first, int64_t count) {
    std::vector<int32_t> ids(count);
    std::iota(ids.begin(), ids.end(), first);
    return ids;
  }

  static std::vector<int32_t> prompt(int64_t n, int32_t seed) {
    std::vector<int32_t> tokens(n);
    for (int64_t i = 0; i < n; ++i)
      tokens[i] = int32_t((i * 131 + seed * 17 + 7) % 512);
    return tokens;
  }

  /// The server's own prefill of tokens [from, n) into `ids`, attending
  /// over the cache's tokens before them (a chunked prefill).
  void prefill(const std::vector<int32_t> &tokens, int64_t from,
               const std::vector<int32_t> &ids) {
    BlockTable table{ids};
    Status status = cpuDevice().createRunner(*model_)->prefillInto(
        *view_, table, tokens.data() + from, from,
        int64_t(tokens.size()) - from, model_->config().numLayers);
    ASSERT_TRUE(status.isOk()) << status.toString();
  }

  /// Prefills `tokens` into `ids` and saves them through `connector`, layer
  /// by layer.
  void prefillAndSave(Connector &connector, const std::string &id,
                      const std::vector<int32_t> &tokens,
                      const std::vector<int32_t> &ids) {
    prefill(tokens, 0, ids);
    for (int64_t l = 0; l < model_->config().numLayers; ++l)
      ASSERT_TRUE(connector.saveLayer(id, tokens, l, ids).isOk());
    StatusOr<SaveMetrics> saved = connector.waitSave(id);
    ASSERT_TRUE(saved) << saved.status().toString();
  }

  /// A Connector on a store that holds `tokens`, saved in `saved` by a
  /// writer of its own (prefilled into blocks 0..); the reader would save
  /// in 128x1, and its caches are zeroed.
  std::unique_ptr<Connector>
  readerOfStoreSavedIn(StoreLayout saved, const std::vector<int32_t> &tokens) {
    ConnectorOptions reading = options_;
    options_.saveLayout = saved;
    options_.createStores = true;
    auto writer = connect();
    if (!writer)
      return nullptr;
    prefillAndSave(*writer, "saved", tokens,
                   blocks(0, (int64_t(tokens.size()) + 15) / 16));
    options_ = reading;
    options_.saveLayout = {128, 1};
    std::fill(memory_.begin(), memory_.end(), 0);
    return connect();
  }

  /// planRequest's plans of `strategies` for every token of `tokens`
  /// (kernels for no GPU).
  static StatusOr<PlanBundle>
  planWhole(Connector &reader, const std::vector<int32_t> &tokens,
            std::vector<planning::Strategy> strategies) {
    host::PlanOptions plans;
    plans.strategies = std::move(strategies);
    plans.gpuChip = "none";
    return reader.planRequest(tokens, plans);
  }

  /// The cache's rows of `tokens` in `ids` against a full prefill.
  void expectExact(const std::vector<int32_t> &tokens,
                   const std::vector<int32_t> &ids) {
    BlockTable table{ids};
    StatusOr<RestoreError> error =
        restoreError(*model_, tokens, *view_, table, cpuDevice());
    ASSERT_TRUE(error) << error.status().toString();
    Status checked = checkVerification(*error, verifyBound({}));
    EXPECT_TRUE(checked.isOk()) << checked.toString();
  }

  static LlamaModel *model_;
  ConnectorOptions options_;
  std::vector<uint16_t> memory_;
  PagedKVCache *view_ = nullptr;
};

LlamaModel *ConnectorTest::model_ = nullptr;

TEST_F(ConnectorTest, APartialPrefixIsLoadedInPartAndComputedInPart) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> saved = prompt(512, 1);
  prefillAndSave(*connector, "a", saved, blocks(0, 32));

  // Request b: a's 512 tokens, then 200 of its own.
  std::vector<int32_t> tokens = saved;
  for (int32_t t : prompt(200, 2))
    tokens.push_back(t);
  StatusOr<Lookup> found = connector->lookup(tokens);
  ASSERT_TRUE(found) << found.status().toString();
  EXPECT_EQ(found->tokens, 512);
  // The index knows what this process saved, not whether another saved
  // more: the store is asked, then (for a while) no more.
  EXPECT_FALSE(found->fromIndex);
  found = connector->lookup(tokens);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tokens, 512);
  EXPECT_TRUE(found->fromIndex);
  std::vector<int32_t> whole(saved.begin(), saved.begin() + 384);
  found = connector->lookup(whole);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tokens, 384);
  EXPECT_TRUE(found->fromIndex); // Every whole chunk of it.

  StatusOr<Decision> decision = connector->decide("b", tokens, 0);
  ASSERT_TRUE(decision) << decision.status().toString();
  ASSERT_TRUE(decision->loads()) << decision->why;
  EXPECT_EQ(decision->loadTokens, 512) << decision->why;
  EXPECT_LT(decision->predictedSeconds, decision->recomputeSeconds);
  EXPECT_NE(decision->why.find("restores 512 of 712 tokens"), std::string::npos)
      << decision->why;

  const std::vector<int32_t> ids = blocks(100, 45);
  ASSERT_TRUE(connector->startLoad("b", ids).isOk());
  for (int64_t l = 0; l < model_->config().numLayers; ++l)
    ASSERT_TRUE(connector->waitLayer("b", l).isOk());
  StatusOr<RestoreMetrics> metrics = connector->waitLoad("b");
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_TRUE(metrics->fallbacks.empty());
  ASSERT_EQ(metrics->bytesRead.size(), 1u);
  EXPECT_GT(metrics->bytesRead.begin()->second, 0);
  StatusOr<std::vector<int32_t>> failed = connector->failedBlocks("b");
  ASSERT_TRUE(failed);
  EXPECT_TRUE(failed->empty());
  Finished done = connector->finished();
  EXPECT_EQ(done.loads, std::vector<std::string>{"b"});

  prefill(tokens, 512, ids); // The server's share.
  expectExact(tokens, ids);
}

// A damaged chunk is recomputed (by kvc or left to the server), its object
// removed from the store; saved again, the chunk is whole and loads.
TEST_F(ConnectorTest, ACorruptChunkIsLeftToTheServerOrRecomputed) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "kvc recomputes" : "the server recomputes");
    options_.recomputeFailures = recompute;
    options_.stores = {{freshStore(), ""}};
    std::fill(memory_.begin(), memory_.end(), 0);
    auto connector = connect();
    ASSERT_TRUE(connector);
    const std::vector<int32_t> tokens = prompt(400, 3);
    prefillAndSave(*connector, "a", tokens, blocks(0, 25));

    // Layer 2 of the second chunk (tokens 128 to 256) damaged in the
    // store: a byte of its payload flipped, its header whole (a save that
    // finds it still sees it stored).
    StatusOr<std::unique_ptr<ChunkStore>> store = openStore(
        {options_.stores[0].url, {128, 1}, "", TierAccess::Existing}, *model_);
    ASSERT_TRUE(store) << store.status().toString();
    std::string damaged, bytes;
    for (const ChunkRef &ref :
         (*store)->refs(tokens.data(), 384, Form::KV, CodecSpec()))
      if (ref.tokenBegin == 128 && ref.layerBegin == 2) {
        damaged = ref.name();
        ASSERT_TRUE((*store)->tier().get(damaged, bytes).isOk());
        bytes[bytes.size() - 100] ^= 0x5a;
        ASSERT_TRUE((*store)->tier().put(damaged, bytes).isOk());
      }

    StatusOr<Decision> decision = connector->decide("b", tokens, 0);
    ASSERT_TRUE(decision) << decision.status().toString();
    ASSERT_EQ(decision->loadTokens, 384) << decision->why;
    const std::vector<int32_t> ids = blocks(100, 25);
    ASSERT_TRUE(connector->startLoad("b", ids).isOk());
    StatusOr<RestoreMetrics> metrics = connector->waitLoad("b");
    ASSERT_TRUE(metrics) << metrics.status().toString();
    ASSERT_EQ(metrics->fallbacks.size(), 1u);
    ASSERT_EQ(metrics->fallbackTokens.size(), 1u);
    EXPECT_EQ(metrics->fallbackTokens[0].begin, 128);
    // The damaged object is gone from the store, so that the next save of
    // its chunk writes it instead of finding it stored.
    EXPECT_NE(metrics->fallbacks[0].find("removed from the store"),
              std::string::npos)
        << metrics->fallbacks[0];
    EXPECT_FALSE(*(*store)->tier().exists(damaged));
    StatusOr<std::vector<int32_t>> failed = connector->failedBlocks("b");
    ASSERT_TRUE(failed);
    if (recompute) {
      EXPECT_TRUE(failed->empty());
      prefill(tokens, 384, ids);
    } else {
      // Blocks 8 to 15 of the table hold tokens 128 to 256, not loaded in
      // layer 2 (they may hold what the damaged object wrote as it was read
      // in place: the server recomputes them).
      EXPECT_EQ(*failed, blocks(108, 8));
      prefill(tokens, 128, ids); // The server recomputes from there.
    }
    expectExact(tokens, ids);

    // Saved again, the chunk is whole and loads.
    prefillAndSave(*connector, "c", tokens, blocks(0, 25));
    EXPECT_TRUE(*(*store)->tier().exists(damaged));
    StatusOr<Decision> again = connector->decide("d", tokens, 0);
    ASSERT_TRUE(again && again->loads());
    ASSERT_TRUE(connector->startLoad("d", ids).isOk());
    metrics = connector->waitLoad("d");
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_TRUE(metrics->fallbacks.empty());
  }
}

// A load that finds a chunk's object gone makes the index forget the
// chunk: the next decision asks the store, which holds the prefix before
// it, and loads that, with nothing to recompute.
TEST_F(ConnectorTest, AChunkFoundGoneIsForgottenByTheIndex) {
  options_.stores = {{freshStore(), ""}};
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(400, 6);
  prefillAndSave(*connector, "a", tokens, blocks(0, 25));
  StatusOr<std::unique_ptr<ChunkStore>> store = openStore(
      {options_.stores[0].url, {128, 1}, "", TierAccess::Existing}, *model_);
  ASSERT_TRUE(store) << store.status().toString();
  for (const ChunkRef &ref :
       (*store)->refs(tokens.data(), 384, Form::KV, CodecSpec()))
    if (ref.tokenBegin == 256 && ref.layerBegin == 1) {
      ASSERT_TRUE((*store)->tier().remove(ref.name()).isOk());
    }
  const std::vector<int32_t> ids = blocks(100, 25);
  for (const std::string id : {"b", "c"}) {
    SCOPED_TRACE(id);
    StatusOr<Lookup> lookup = connector->lookup(tokens);
    ASSERT_TRUE(lookup) << lookup.status().toString();
    StatusOr<Decision> decision = connector->decide(id, tokens, 0);
    ASSERT_TRUE(decision && decision->loads());
    ASSERT_TRUE(connector->startLoad(id, ids).isOk());
    StatusOr<RestoreMetrics> metrics = connector->waitLoad(id);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    if (id == "b") { // The index held all three chunks.
      EXPECT_TRUE(lookup->fromIndex);
      EXPECT_EQ(decision->loadTokens, 384) << decision->why;
      ASSERT_EQ(metrics->fallbackFaults.size(), 1u);
      EXPECT_EQ(metrics->fallbackFaults[0], ChunkFault::Missing);
    } else { // The store asked: the two chunks before the one gone.
      EXPECT_FALSE(lookup->fromIndex);
      EXPECT_EQ(decision->loadTokens, 256) << decision->why;
      EXPECT_TRUE(metrics->fallbacks.empty());
    }
    prefill(tokens, decision->loadTokens, ids);
    expectExact(tokens, ids);
  }
}

// A Redis Cluster of masters without replicas that loses one, serving the
// others' slots. Killed before the request: a decision asks the masters
// that answer and prices the chunks on the dead one as unreadable (a load
// past the first of them recomputes them), so it loads the chunks before
// it, reading nothing from the dead master, and the server computes the
// rest. Killed while it loads: the load loads what the live masters hold
// and recomputes what the dead one held. The cache is exact either way.
TEST_F(ConnectorTest, AClusterMasterGoneIsRecomputedAndTheRestLoaded) {
  for (bool during : {false, true}) {
    SCOPED_TRACE(during ? "killed during the load" : "killed before");
    test::RedisCluster cluster(
        test::tempPath("connector-cluster-" + std::to_string(getpid())), 3,
        /*replicas=*/0, /*fullCoverage=*/false);
    if (!cluster.ready())
      GTEST_SKIP() << "no redis cluster (redis-server and redis-cli needed)";
    options_.stores = {{cluster.url("?timeout_ms=500"), ""}};
    options_.createStores = true;
    // An object a chunk, all layers: a third of them on each master.
    options_.saveLayout = {128, model_->config().numLayers};
    std::fill(memory_.begin(), memory_.end(), 0);
    auto writer = connect();
    ASSERT_TRUE(writer);
    const std::vector<int32_t> tokens = prompt(1024, 5);
    prefillAndSave(*writer, "a", tokens, blocks(0, 64));
    writer.reset();
    std::fill(memory_.begin(), memory_.end(), 0);
    // The master of each chunk's object; the victim one that does not hold
    // the first, so that something before its chunks loads.
    StatusOr<std::unique_ptr<ChunkStore>> store = openStore(
        {options_.stores[0].url, options_.saveLayout, "", TierAccess::Existing},
        *model_);
    ASSERT_TRUE(store) << store.status().toString();
    std::vector<int> masterOf;
    for (const ChunkRef &ref :
         (*store)->refs(tokens.data(), 1024, Form::KV, CodecSpec()))
      masterOf.push_back(cluster.masterOf(
          std::stoi(cluster.cli(0, "CLUSTER KEYSLOT " + ref.name()))));
    store->reset();
    int victim = -1;
    for (int master : cluster.masters())
      if (master != masterOf[0])
        victim = master;
    ASSERT_GE(victim, 0);
    const int64_t firstOnVictim =
        128 * (std::find(masterOf.begin(), masterOf.end(), victim) -
               masterOf.begin());
    if (!during)
      cluster.kill(victim);

    // Read slowly enough when killed during the load that it is under way.
    if (during)
      options_.stores = {{cluster.url("?timeout_ms=500&gbps=0.002"), ""}};
    auto connector = connect(); // Knows nothing yet: asks the store.
    ASSERT_TRUE(connector);
    // Its own decision; on the slow link, which it would leave to the
    // server, the KV plan of every token.
    StatusOr<Decision> decision = internalError("undecided");
    if (during) {
      StatusOr<PlanBundle> planned =
          planWhole(*connector, tokens, {planning::Strategy::Kv});
      ASSERT_TRUE(planned) << planned.status().toString();
      decision = connector->decide(
          "b", tokens, 0,
          {std::make_shared<const PlanBundle>(std::move(*planned)), ""});
    } else {
      decision = connector->decide("b", tokens, 0);
    }
    ASSERT_TRUE(decision) << decision.status().toString();
    ASSERT_TRUE(decision->loads()) << decision->why;
    // Whole chunks (the Connector leaves the server its last token); killed
    // before, those before the dead master's first.
    EXPECT_EQ(decision->loadTokens,
              during ? 1024 : std::min<int64_t>(firstOnVictim, 896))
        << decision->why;
    const std::vector<int32_t> ids = blocks(100, 64);
    ASSERT_TRUE(connector->startLoad("b", ids).isOk());
    if (during) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      cluster.kill(victim);
    }
    StatusOr<RestoreMetrics> metrics = connector->waitLoad("b");
    ASSERT_TRUE(metrics) << metrics.status().toString();
    // Killed during the load, some chunks recomputed, the rest loaded from
    // the live masters; before, nothing asked of the dead one.
    EXPECT_EQ(metrics->fallbacks.empty(), !during);
    std::set<int64_t> recomputed;
    for (const BundleRange &range : metrics->fallbackTokens)
      recomputed.insert(range.begin);
    EXPECT_LT(recomputed.size(), 7u);
    ASSERT_EQ(metrics->bytesRead.size(), 1u);
    EXPECT_GT(metrics->bytesRead.begin()->second, 0);
    StatusOr<std::vector<int32_t>> failed = connector->failedBlocks("b");
    ASSERT_TRUE(failed);
    EXPECT_TRUE(failed->empty());
    if (decision->loadTokens < 1024)
      prefill(tokens, decision->loadTokens, ids);
    expectExact(tokens, ids);
  }
}

TEST_F(ConnectorTest, ASlowStoreIsNotLoadedFrom) {
  const std::string url = options_.stores[0].url;
  auto writer = connect();
  ASSERT_TRUE(writer);
  const std::vector<int32_t> tokens = prompt(700, 4);
  prefillAndSave(*writer, "a", tokens, blocks(0, 44));

  // The same store read at 1 kB/s.
  options_.stores = {{url + "?gbps=0.000008", ""}};
  auto slow = Connector::create(options_);
  ASSERT_TRUE(slow) << slow.status().toString();
  StatusOr<Decision> decision = (*slow)->decide("b", tokens, 0);
  ASSERT_TRUE(decision) << decision.status().toString();
  EXPECT_FALSE(decision->loads()) << decision->why;
  EXPECT_EQ(decision->loadTokens, 0);
  EXPECT_NE(decision->why.find("not faster than"), std::string::npos)
      << decision->why;
  EXPECT_EQ((*slow)->startLoad("b", blocks(100, 44)).code(),
            StatusCode::FailedPrecondition);

  // Unless told to load whatever it costs.
  options_.policy = LoadPolicy::Always;
  auto always = Connector::create(options_);
  ASSERT_TRUE(always) << always.status().toString();
  StatusOr<Decision> forced = (*always)->decide("b", tokens, 0);
  ASSERT_TRUE(forced) << forced.status().toString();
  EXPECT_TRUE(forced->loads()) << forced->why;
  EXPECT_GT(forced->predictedSeconds, forced->recomputeSeconds);
  EXPECT_NE(forced->why.find("loaded all the same (LoadPolicy::Always)"),
            std::string::npos)
      << forced->why;

  // And at the target's own rate: loaded, unless told never to.
  StatusOr<Decision> fast = writer->decide("b", tokens, 0);
  ASSERT_TRUE(fast) << fast.status().toString();
  EXPECT_TRUE(fast->loads()) << fast->why;
  EXPECT_EQ(fast->loadTokens, 640);
  EXPECT_EQ(fast->why.find("all the same"), std::string::npos) << fast->why;
  options_.stores = {{url, ""}};
  options_.policy = LoadPolicy::Never;
  auto never = Connector::create(options_);
  ASSERT_TRUE(never) << never.status().toString();
  StatusOr<Decision> refused = (*never)->decide("b", tokens, 0);
  ASSERT_TRUE(refused) << refused.status().toString();
  EXPECT_FALSE(refused->loads()) << refused->why;
}

TEST_F(ConnectorTest, AServersMeasuredRecomputeIsWhatLoadsAreWeighedAgainst) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(700, 7);
  prefillAndSave(*connector, "a", tokens, blocks(0, 44));
  StatusOr<Decision> priced = connector->decide("b", tokens, 0);
  ASSERT_TRUE(priced) << priced.status().toString();
  ASSERT_TRUE(priced->loads()) << priced->why;
  // A server that recomputes in a tenth of the best load's time: nothing
  // loads, and the decision says against what.
  const double fast = priced->predictedSeconds / 10;
  StatusOr<Decision> declined = connector->decide("b", tokens, 0, fast);
  ASSERT_TRUE(declined) << declined.status().toString();
  EXPECT_FALSE(declined->loads()) << declined->why;
  EXPECT_EQ(declined->recomputeSeconds, fast);
  EXPECT_EQ(declined->store, -1);
  // One that recomputes slowly: loaded.
  StatusOr<Decision> loaded =
      connector->decide("b", tokens, 0, priced->predictedSeconds * 10);
  ASSERT_TRUE(loaded) << loaded.status().toString();
  EXPECT_TRUE(loaded->loads()) << loaded->why;
  EXPECT_EQ(loaded->store, 0);
  EXPECT_EQ(loaded->layout.chunkTokens, 128);
}

TEST_F(ConnectorTest, AShorterPrefixIsLoadedWhereTheLinkIsSlow) {
  const std::string url = options_.stores[0].url;
  auto writer = connect();
  ASSERT_TRUE(writer);
  const std::vector<int32_t> tokens = prompt(1100, 8);
  prefillAndSave(*writer, "a", tokens, blocks(0, 69));
  // Loads only (kv): at the target's own link all 1024 stored tokens load;
  // behind a link where loading them all takes longer than recomputing,
  // a shorter prefix, whose load the server's pass over the rest hides,
  // is the earliest first token.
  options_.plans.strategies = {planning::Strategy::Kv};
  auto fast = connect();
  ASSERT_TRUE(fast);
  StatusOr<Decision> all = fast->decide("b", tokens, 0);
  ASSERT_TRUE(all) << all.status().toString();
  EXPECT_EQ(all->loadTokens, 1024) << all->why;
  double slowest = 0;
  for (const char *gbps : {"1", "0.5", "0.3", "0.2", "0.1"}) {
    options_.stores = {{url + "?gbps=" + gbps, ""}};
    auto slow = Connector::create(options_);
    ASSERT_TRUE(slow) << slow.status().toString();
    StatusOr<Decision> some = (*slow)->decide("b", tokens, 0);
    ASSERT_TRUE(some) << some.status().toString();
    EXPECT_LE(some->predictedSeconds, some->recomputeSeconds) << some->why;
    if (some->loads() && some->loadTokens < 1024) {
      EXPECT_EQ(some->loadTokens % 128, 0);
      slowest = std::max(slowest, some->recomputeSeconds);
    }
  }
  EXPECT_GT(slowest, 0) << "no link made a shorter prefix the best load";
}

TEST_F(ConnectorTest, ADecisionRunsAsItStandsInAnotherConnector) {
  auto scheduler = connect();
  ASSERT_TRUE(scheduler);
  const std::vector<int32_t> tokens = prompt(700, 9);
  // The store holds the first 256 tokens when the scheduler decides.
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + 300);
  prefillAndSave(*scheduler, "head", head, blocks(0, 19));
  StatusOr<Decision> decided = scheduler->decide("b", tokens, 0);
  ASSERT_TRUE(decided) << decided.status().toString();
  ASSERT_EQ(decided->loadTokens, 256) << decided->why;
  // Then all of it; the worker runs the decision it was given, 256 tokens.
  prefillAndSave(*scheduler, "whole", tokens, blocks(20, 44));
  auto worker = connect();
  ASSERT_TRUE(worker);
  std::fill(memory_.begin(), memory_.end(), 0);
  Decided as{decided->loadTokens, decided->strategy, decided->store,
             decided->layout};
  StatusOr<Decision> ran = worker->decide("b", tokens, 0, as);
  ASSERT_TRUE(ran) << ran.status().toString();
  EXPECT_EQ(ran->loadTokens, 256);
  EXPECT_EQ(ran->strategy, decided->strategy);
  ASSERT_TRUE(worker->startLoad("b", blocks(100, 44)).isOk());
  ASSERT_TRUE(worker->waitLoad("b"));
  // Tokens past 256 untouched: the server computes them.
  const ModelConfig &c = model_->config();
  const int64_t row = c.numKvHeads * c.headDim;
  const uint16_t *block17 = memory_.data() + (100 + 16) * 16 * row;
  EXPECT_TRUE(std::all_of(block17, block17 + 16 * row,
                          [](uint16_t v) { return v == 0; }));
  prefill(tokens, 256, blocks(100, 44));
  expectExact(tokens, blocks(100, 44));

  // A holding that no longer covers it, and decisions it cannot run.
  Decided beyond = as;
  beyond.loadTokens = 768;
  EXPECT_EQ(worker->decide("c", tokens, 0, beyond).status().code(),
            StatusCode::InvalidArgument); // past the request's tokens
  options_.stores = {{freshStore(), ""}};
  auto empty = connect();
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->decide("c", tokens, 0, as).status().code(),
            StatusCode::NotFound);
  Decided unknown = as;
  unknown.strategy = "teleport";
  EXPECT_EQ(worker->decide("c", tokens, 0, unknown).status().code(),
            StatusCode::InvalidArgument);
  unknown = as;
  unknown.store = 3;
  EXPECT_EQ(worker->decide("c", tokens, 0, unknown).status().code(),
            StatusCode::InvalidArgument);
}

TEST_F(ConnectorTest, DecisionsOfOneShapeCompileOnce) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> first = prompt(300, 5), second = prompt(300, 6);
  prefillAndSave(*connector, "a", first, blocks(0, 19));
  prefillAndSave(*connector, "b", second, blocks(20, 19));
  // Two requests of one shape: 256 tokens stored, 44 (and 50) their own.
  std::vector<int32_t> c = first, d = second;
  c.resize(300);
  d.push_back(1);
  ASSERT_TRUE(connector->decide("c", c, 0));
  EXPECT_EQ(connector->plansCompiled(), 1);
  StatusOr<Decision> again = connector->decide("d", d, 0);
  ASSERT_TRUE(again) << again.status().toString();
  EXPECT_EQ(again->loadTokens, 256);
  EXPECT_EQ(connector->plansCompiled(), 1);
  EXPECT_EQ(connector->planCacheHits(), 1);
  ASSERT_TRUE(connector->startLoad("d", blocks(40, 19)).isOk());
  ASSERT_TRUE(connector->waitLoad("d"));
  prefill(d, 256, blocks(40, 19));
  expectExact(d, blocks(40, 19));
}

TEST_F(ConnectorTest, ACompilingPlanHoldsUpNoOtherRequest) {
  // The first plan's compile waits until the test lets it go (20 s at
  // most): meanwhile other requests are looked up and decided.
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first{true}, timedOut{false};
  PlanHook compile = compilerPlanHook();
  options_.planner = [&, compile](
                         const ModelCompute &model, const TargetDesc &target,
                         const planning::Request &request,
                         const PlanOptions &options, const PricedPlan *chosen) {
    if (first.exchange(false)) {
      entered.set_value();
      if (released.wait_for(std::chrono::seconds(20)) !=
          std::future_status::ready)
        timedOut = true;
    }
    return compile(model, target, request, options, chosen);
  };
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> stored = prompt(300, 5);
  prefillAndSave(*connector, "a", stored, blocks(0, 19));
  std::thread cold([&] {
    StatusOr<Decision> decided = connector->decide("c", stored, 0);
    ASSERT_TRUE(decided) << decided.status().toString();
    EXPECT_EQ(decided->loadTokens, 256);
  });
  entered.get_future().wait();
  StatusOr<Lookup> found = connector->lookup(stored);
  ASSERT_TRUE(found) << found.status().toString();
  EXPECT_EQ(found->tokens, 256);
  StatusOr<Decision> miss = connector->decide("e", prompt(100, 9), 0);
  ASSERT_TRUE(miss) << miss.status().toString();
  EXPECT_EQ(miss->loadTokens, 0);
  EXPECT_FALSE(timedOut) << "the lookup waited for another request's compile";
  release.set_value();
  cold.join();
  EXPECT_FALSE(timedOut);
  EXPECT_EQ(connector->plansCompiled(), 1);
}

// decide prices every candidate with the planner and hands the plan it
// keeps to the compiler, which lowers it as chosen: the compile searches
// for nothing, and the load it compiled restores the cache exactly.
// The compiled plans kept are the shapes decided last: with room for one,
// a shape decided again after another is compiled again; with room for two,
// it is found.
TEST_F(ConnectorTest, ThePlanCacheKeepsTheShapesDecidedLast) {
  options_.policy = LoadPolicy::Always;
  const std::vector<int32_t> stored = prompt(300, 5);
  std::vector<int32_t> longer = stored;
  longer.insert(longer.end(), 100, 3); // The server's pass: 192 tokens.
  for (std::size_t entries : {1, 2}) {
    SCOPED_TRACE(entries);
    options_.planCacheEntries = entries;
    auto connector = connect();
    ASSERT_TRUE(connector);
    prefillAndSave(*connector, "a", stored, blocks(0, 19));
    for (const char *id : {"b", "c", "d"}) {
      StatusOr<Decision> decision =
          connector->decide(id, *id == 'c' ? longer : stored, 0);
      ASSERT_TRUE(decision && decision->loads()) << id;
    }
    EXPECT_EQ(connector->plansCompiled(), entries == 1 ? 3 : 2);
    EXPECT_EQ(connector->planCacheHits(), entries == 1 ? 0 : 1);
  }
}

TEST_F(ConnectorTest, ADecisionCompilesThePlanItPricedWithoutSearchingAgain) {
  PlanHook compile = compilerPlanHook();
  int64_t calls = 0, priced = 0, searchedInCompile = 0;
  options_.planner =
      [&, compile](const ModelCompute &model, const TargetDesc &target,
                   const planning::Request &request, const PlanOptions &options,
                   const PricedPlan *chosen) {
        ++calls;
        priced += chosen != nullptr;
        const int64_t before = planning::Planner::plansMade();
        StatusOr<PlanBundle> bundle =
            compile(model, target, request, options, chosen);
        searchedInCompile += planning::Planner::plansMade() - before;
        return bundle;
      };
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(300, 5);
  prefillAndSave(*connector, "a", tokens, blocks(0, 19));
  StatusOr<Decision> decision = connector->decide("b", tokens, 0);
  ASSERT_TRUE(decision && decision->loads()) << decision.status().toString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(priced, 1);
  EXPECT_EQ(searchedInCompile, 0);
  ASSERT_TRUE(connector->startLoad("b", blocks(50, 19)).isOk());
  ASSERT_TRUE(connector->waitLoad("b"));
  prefill(tokens, decision->loadTokens, blocks(50, 19));
  expectExact(tokens, blocks(50, 19));
}

TEST_F(ConnectorTest, AStoreSavedInAnotherLayoutIsRead) {
  // A reader that would save otherwise finds what the store records.
  const std::vector<int32_t> tokens = prompt(300, 7);
  auto reader = readerOfStoreSavedIn({64, 2}, tokens);
  ASSERT_TRUE(reader);
  StatusOr<Lookup> found = reader->lookup(tokens);
  ASSERT_TRUE(found) << found.status().toString();
  EXPECT_FALSE(found->fromIndex);
  EXPECT_EQ(found->tokens, 256);
  StatusOr<Decision> decision = reader->decide("b", tokens, 0);
  ASSERT_TRUE(decision && decision->loads());
  EXPECT_EQ(decision->loadTokens, 256) << decision->why;
  ASSERT_TRUE(reader->startLoad("b", blocks(50, 19)).isOk());
  ASSERT_TRUE(reader->waitLoad("b"));
  prefill(tokens, 256, blocks(50, 19));
  expectExact(tokens, blocks(50, 19));
  // What it saw, it remembers.
  StatusOr<Lookup> again = reader->lookup(tokens);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->fromIndex);
  EXPECT_EQ(again->tokens, 256);
}

TEST_F(ConnectorTest, ARequestPlannedWholeRunsEveryStrategyByName) {
  // Saved in another layout than the reader's: planRequest plans in the
  // layout that holds the request, as kvc-run restore --strategy does.
  const std::vector<int32_t> tokens = prompt(256, 9);
  options_.createStores = false; // The reader's; the writer creates it.
  auto reader = readerOfStoreSavedIn({64, 2}, tokens);
  ASSERT_TRUE(reader);
  StatusOr<PlanBundle> planned =
      planWhole(*reader, tokens,
                {planning::Strategy::Compute, planning::Strategy::Kv,
                 planning::Strategy::Cake});
  ASSERT_TRUE(planned) << planned.status().toString();
  auto bundle = std::make_shared<const PlanBundle>(std::move(*planned));
  ASSERT_EQ(bundle->plans.size(), 3u);
  for (const BundlePlan &plan : bundle->plans) {
    SCOPED_TRACE(plan.name);
    // Every token, in the store's 64-token chunks (none left to a server).
    EXPECT_EQ(plan.tokens.end, 256);
    for (const BundleTask &task : plan.tasks)
      for (const BundleStep &step : task.steps) {
        if (step.kind == StepKind::Fetch) {
          EXPECT_EQ((step.tokens.end - step.tokens.begin) % 64, 0);
        }
      }
    std::fill(memory_.begin(), memory_.end(), 0);
    StatusOr<Decision> decision =
        reader->decide(plan.name, tokens, 0, {bundle, plan.name});
    ASSERT_TRUE(decision) << decision.status().toString();
    EXPECT_EQ(decision->loadTokens, 256);
    ASSERT_TRUE(reader->startLoad(plan.name, blocks(20, 16)).isOk());
    StatusOr<RestoreMetrics> metrics = reader->waitLoad(plan.name);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_TRUE(metrics->fallbacks.empty());
    expectExact(tokens, blocks(20, 16));
  }
  // Nothing was compiled into the plan cache, which priced decisions use.
  EXPECT_EQ(reader->plansCompiled(), 0);
}

TEST_F(ConnectorTest, ABundleOfAnotherModelIsNeverRun) {
  const std::vector<int32_t> tokens = prompt(256, 9);
  options_.createStores = false; // The reader's; the writer creates it.
  auto reader = readerOfStoreSavedIn({64, 2}, tokens);
  ASSERT_TRUE(reader);
  StatusOr<PlanBundle> planned =
      planWhole(*reader, tokens, {planning::Strategy::Kv});
  ASSERT_TRUE(planned) << planned.status().toString();
  PlanBundle other = *planned;
  other.modelFingerprint = "0123456789abcdef-another-model";
  // Chosen by the caller.
  StatusOr<Decision> chosen = reader->decide(
      "chosen", tokens, 0, {std::make_shared<const PlanBundle>(other), ""});
  ASSERT_FALSE(chosen);
  EXPECT_EQ(chosen.status().code(), StatusCode::FailedPrecondition);
  EXPECT_NE(chosen.status().message().find("compiled for model 0123456789abcdef"),
            std::string::npos)
      << chosen.status().toString();
  // Looked up by a server's planner over bundles compiled ahead.
  planning::Request request;
  request.tokens = 256;
  host::PlanOptions plans;
  plans.strategies = {planning::Strategy::Kv};
  EXPECT_EQ(
      bundleHook({other})(*model_, options_.target, request, plans, nullptr)
          .status()
          .code(),
      StatusCode::FailedPrecondition);
  EXPECT_TRUE(bundleHook({other, *planned})(*model_, options_.target, request,
                                            plans, nullptr));
  // The same bundle, this model's: it runs.
  StatusOr<Decision> ours = reader->decide(
      "ours", tokens, 0,
      {std::make_shared<const PlanBundle>(std::move(*planned)), ""});
  ASSERT_TRUE(ours) << ours.status().toString();
}

TEST_F(ConnectorTest, TokensOnTheDeviceAreNotWritten) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(600, 8);
  prefillAndSave(*connector, "a", tokens, blocks(0, 38));
  // Request b shares a's first 128 tokens' blocks (the server's own prefix
  // hit); kvc must load from token 128 on.
  std::vector<int32_t> ids = blocks(0, 8);
  for (int32_t b : blocks(100, 30))
    ids.push_back(b);
  // Mark the shared blocks (layer 0's K): a write into them would show.
  const ModelConfig &c = model_->config();
  const int64_t block = 16 * c.numKvHeads * c.headDim;
  std::vector<uint16_t> before(memory_.begin(), memory_.begin() + 8 * block);
  std::fill(memory_.begin(), memory_.begin() + 8 * block, 0x7fc1);
  StatusOr<Decision> decision = connector->decide("b", tokens, 128);
  ASSERT_TRUE(decision) << decision.status().toString();
  ASSERT_TRUE(decision->loads()) << decision->why;
  EXPECT_EQ(decision->loadTokens, 512);
  EXPECT_TRUE(decision->strategy == "kv" || decision->strategy == "hidden")
      << decision->strategy;
  ASSERT_TRUE(connector->startLoad("b", ids).isOk());
  StatusOr<RestoreMetrics> metrics = connector->waitLoad("b");
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_TRUE(std::all_of(memory_.begin(), memory_.begin() + 8 * block,
                          [](uint16_t v) { return v == 0x7fc1; }));
  std::copy(before.begin(), before.end(), memory_.begin());
  prefill(tokens, 512, ids);
  expectExact(tokens, ids);
}

TEST_F(ConnectorTest, APrefixHitOffTheChunkGridIsLoadedPastIt) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(600, 8);
  prefillAndSave(*connector, "a", tokens, blocks(0, 38));
  // The server holds 112 tokens (7 of its 16-token blocks, shared with a),
  // inside the store's first 128-token chunk; a chunk across them, the
  // second one, damaged in the store (recomputed from token 128 on).
  StatusOr<std::unique_ptr<ChunkStore>> store = openStore(
      {options_.stores[0].url, {128, 1}, "", TierAccess::Existing}, *model_);
  ASSERT_TRUE(store) << store.status().toString();
  for (const ChunkRef &ref :
       (*store)->refs(tokens.data(), 512, Form::KV, CodecSpec()))
    if (ref.tokenBegin == 0 && ref.layerBegin == 1) {
      ASSERT_TRUE((*store)->tier().put(ref.name(), "not a chunk").isOk());
    }
  std::vector<int32_t> ids = blocks(0, 7);
  for (int32_t b : blocks(100, 31))
    ids.push_back(b);
  const ModelConfig &c = model_->config();
  const int64_t block = 16 * c.numKvHeads * c.headDim,
                layer = 2 * kBlocks * block;
  // Mark the shared blocks in layers 0 and 1: a write into them would show.
  std::vector<uint16_t> before(memory_.begin(), memory_.begin() + 2 * layer);
  for (int64_t l = 0; l < 2; ++l)
    std::fill(memory_.begin() + l * layer,
              memory_.begin() + l * layer + 7 * block, 0x7fc1);
  StatusOr<Decision> decision = connector->decide("b", tokens, 112);
  ASSERT_TRUE(decision) << decision.status().toString();
  ASSERT_TRUE(decision->loads()) << decision->why;
  EXPECT_EQ(decision->loadTokens, 512);
  EXPECT_EQ(decision->strategy, "kv");
  ASSERT_TRUE(connector->startLoad("b", ids).isOk());
  StatusOr<RestoreMetrics> metrics = connector->waitLoad("b");
  ASSERT_TRUE(metrics) << metrics.status().toString();
  ASSERT_EQ(metrics->fallbackTokens.size(), 1u);
  EXPECT_EQ(metrics->fallbackTokens[0].begin, 112);
  for (int64_t l = 0; l < 2; ++l)
    EXPECT_TRUE(std::all_of(memory_.begin() + l * layer,
                            memory_.begin() + l * layer + 7 * block,
                            [](uint16_t v) { return v == 0x7fc1; }))
        << "layer " << l;
  for (int64_t l = 0; l < 2; ++l)
    std::copy(before.begin() + l * layer, before.begin() + l * layer + 7 * block,
              memory_.begin() + l * layer);
  prefill(tokens, 512, ids);
  expectExact(tokens, ids);
}

TEST_F(ConnectorTest, EveryServerCacheLayoutIsWritten) {
  auto writer = connect();
  ASSERT_TRUE(writer);
  const std::vector<int32_t> tokens = prompt(300, 9);
  prefillAndSave(*writer, "a", tokens, blocks(0, 19));
  const ModelConfig &c = model_->config();
  const int64_t block = 16 * c.numKvHeads * c.headDim;
  for (CacheLayout layout : {CacheLayout::KeysFirst, CacheLayout::BlocksFirst}) {
    // One tensor per layer, [2][blocks] or [blocks][2], then a full
    // prefill through a Separate view of the same memory must agree.
    std::vector<uint16_t> memory(2 * c.numLayers * kBlocks * block, 0);
    ServerCaches caches;
    caches.layout = layout;
    caches.numBlocks = kBlocks;
    caches.numKvHeads = c.numKvHeads;
    caches.headDim = c.headDim;
    for (int64_t l = 0; l < c.numLayers; ++l)
      caches.keys.push_back(memory.data() + 2 * l * kBlocks * block);
    auto reader = Connector::create(options_);
    ASSERT_TRUE(reader);
    StatusOr<std::unique_ptr<PagedKVCache>> view =
        viewServerCaches(caches, c);
    ASSERT_TRUE(view) << view.status().toString();
    PagedKVCache *cache = view->get();
    ASSERT_TRUE((*reader)->registerCaches(std::move(*view)).isOk());
    StatusOr<Decision> decision = (*reader)->decide("b", tokens, 0);
    ASSERT_TRUE(decision && decision->loads());
    const std::vector<int32_t> ids = blocks(7, 19);
    ASSERT_TRUE((*reader)->startLoad("b", ids).isOk());
    ASSERT_TRUE((*reader)->waitLoad("b"));
    BlockTable table{ids};
    ASSERT_TRUE(cpuDevice()
                    .createRunner(*model_)
                    ->prefillInto(*cache, table, tokens.data() + 256, 256, 44,
                                  c.numLayers)
                    .isOk());
    StatusOr<RestoreError> error =
        restoreError(*model_, tokens, *cache, table, cpuDevice());
    ASSERT_TRUE(error);
    EXPECT_TRUE(checkVerification(*error, verifyBound({})).isOk());
    // The values are where the layout puts them: layer 0's K of the first
    // loaded block is in the first half (KeysFirst) or the block's first
    // half (BlocksFirst), and nonzero.
    const uint16_t *k = memory.data() +
                        (layout == CacheLayout::KeysFirst ? 7 * block
                                                          : 7 * 2 * block);
    EXPECT_TRUE(std::any_of(k, k + block, [](uint16_t v) { return v != 0; }));
  }
}

TEST_F(ConnectorTest, AnF16ServerCacheIsLoadedAndPrefilled) {
  auto writer = connect();
  ASSERT_TRUE(writer);
  const std::vector<int32_t> tokens = prompt(300, 13);
  prefillAndSave(*writer, "a", tokens, blocks(0, 19));
  // A server of f16 caches: the stored bf16 KV is loaded into them, the
  // server's prefill of the rest attends over them, and the whole equals a
  // full prefill within f16's and bf16's rounding.
  std::vector<uint16_t> memory(memory_.size(), 0);
  ServerCaches f16 = caches();
  f16.dtype = DType::F16;
  for (std::size_t l = 0; l < f16.keys.size(); ++l) {
    f16.keys[l] = memory.data() + (static_cast<uint16_t *>(f16.keys[l]) -
                                   memory_.data());
    f16.values[l] = memory.data() + (static_cast<uint16_t *>(f16.values[l]) -
                                     memory_.data());
  }
  auto reader = Connector::create(options_);
  ASSERT_TRUE(reader) << reader.status().toString();
  StatusOr<std::unique_ptr<PagedKVCache>> view =
      viewServerCaches(f16, model_->config());
  ASSERT_TRUE(view) << view.status().toString();
  EXPECT_EQ((*view)->config().dtype, DType::F16);
  PagedKVCache *cache = view->get();
  ASSERT_TRUE((*reader)->registerCaches(std::move(*view)).isOk());
  StatusOr<Decision> decision = (*reader)->decide("b", tokens, 0);
  ASSERT_TRUE(decision && decision->loads());
  const std::vector<int32_t> ids = blocks(30, 19);
  ASSERT_TRUE((*reader)->startLoad("b", ids).isOk());
  StatusOr<RestoreMetrics> metrics = (*reader)->waitLoad("b");
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_TRUE(metrics->fallbacks.empty());
  BlockTable table{ids};
  ASSERT_TRUE(cpuDevice()
                  .createRunner(*model_)
                  ->prefillInto(*cache, table, tokens.data() + 256, 256, 44,
                                model_->config().numLayers)
                  .isOk());
  StatusOr<RestoreError> error =
      restoreError(*model_, tokens, *cache, table, cpuDevice());
  ASSERT_TRUE(error) << error.status().toString();
  EXPECT_TRUE(checkVerification(*error, verifyBound({})).isOk())
      << error->max << " " << error->relativeL2;
  // The bits are f16's: the first loaded K of layer 0 converts back to the
  // bf16 cache's value.
  const ModelConfig &c = model_->config();
  const int64_t block = 16 * c.numKvHeads * c.headDim;
  const uint16_t loaded = memory[30 * block], saved = memory_[0];
  EXPECT_EQ(f16ToFloat(loaded), bf16ToFloat(saved));
  EXPECT_NE(loaded, saved);
}

TEST_F(ConnectorTest, BadInputIsRefused) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(300, 10);
  prefillAndSave(*connector, "a", tokens, blocks(0, 19));
  EXPECT_EQ(connector->startLoad("nobody", blocks(0, 19)).code(),
            StatusCode::NotFound);
  EXPECT_EQ(connector->waitLayer("nobody", 0).code(), StatusCode::NotFound);
  EXPECT_EQ(connector->cancel("nobody").code(), StatusCode::NotFound);
  EXPECT_EQ(connector->decide("b", tokens, 301).status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(connector->decide("b", {}, 0).status().code(),
            StatusCode::InvalidArgument);
  ASSERT_TRUE(connector->decide("b", tokens, 0));
  std::vector<int32_t> out = blocks(kBlocks - 5, 16);
  EXPECT_EQ(connector->startLoad("b", out).code(), StatusCode::InvalidArgument);
  std::vector<int32_t> twice = blocks(20, 16);
  twice[3] = twice[2];
  EXPECT_EQ(connector->startLoad("b", twice).code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(connector->startLoad("b", blocks(20, 3)).code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(connector->waitLayer("b", 0).code(),
            StatusCode::FailedPrecondition); // Not started.
  ASSERT_TRUE(connector->startLoad("b", blocks(20, 16)).isOk());
  EXPECT_EQ(connector->startLoad("b", blocks(40, 16)).code(),
            StatusCode::FailedPrecondition);
  EXPECT_EQ(connector->waitLayer("b", 99).code(), StatusCode::InvalidArgument);
  ASSERT_TRUE(connector->waitLoad("b"));
  // A save that waits for layers it was not given says so.
  ASSERT_TRUE(connector->saveLayer("c", tokens, 0, blocks(0, 19)).isOk());
  EXPECT_EQ(connector->waitSave("c").status().code(),
            StatusCode::FailedPrecondition);
  EXPECT_EQ(connector->saveLayer("c", tokens, 9, blocks(0, 19)).code(),
            StatusCode::InvalidArgument);
  ASSERT_TRUE(connector->cancel("c").isOk());
  // Caches that do not fit the model.
  ServerCaches wrong = caches();
  wrong.headDim *= 2;
  EXPECT_EQ(viewServerCaches(wrong, model_->config()).status().code(),
            StatusCode::InvalidArgument);
  wrong = caches();
  wrong.keys.pop_back();
  EXPECT_EQ(viewServerCaches(wrong, model_->config()).status().code(),
            StatusCode::InvalidArgument);
  wrong = caches();
  wrong.dtype = DType::F32;
  EXPECT_EQ(viewServerCaches(wrong, model_->config()).status().code(),
            StatusCode::Unimplemented);
  // Caches registered again replace the first once nothing uses them (the
  // cancelled save has ended once finished() lists it).
  bool ended = false;
  for (int i = 0; i < 400 && !ended; ++i) {
    Finished done = connector->finished();
    ended = std::count(done.saves.begin(), done.saves.end(), "c") > 0;
    if (!ended)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(ended);
  StatusOr<std::unique_ptr<PagedKVCache>> again =
      viewServerCaches(caches(), model_->config());
  ASSERT_TRUE(again);
  EXPECT_TRUE(connector->registerCaches(std::move(*again)).isOk());
  ConnectorOptions none = options_;
  none.planner = nullptr;
  EXPECT_EQ(Connector::create(none).status().code(),
            StatusCode::InvalidArgument);
}

TEST_F(ConnectorTest, ACancelledRequestIsForgottenAndFinishes) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(1200, 11);
  prefillAndSave(*connector, "a", tokens, blocks(0, 75));
  StatusOr<Decision> decision = connector->decide("b", tokens, 0);
  ASSERT_TRUE(decision && decision->loads());
  ASSERT_TRUE(connector->startLoad("b", blocks(100, 75)).isOk());
  ASSERT_TRUE(connector->cancel("b").isOk());
  EXPECT_EQ(connector->waitLayer("b", 0).code(), StatusCode::NotFound);
  // A save stopped half way leaves nothing behind.
  ASSERT_TRUE(connector->saveLayer("c", prompt(300, 12), 0, blocks(0, 19))
                  .isOk());
  ASSERT_TRUE(connector->cancel("c").isOk());
  std::vector<std::string> loads, saves;
  for (int i = 0; i < 500 && (loads.empty() || saves.empty()); ++i) {
    Finished done = connector->finished();
    loads.insert(loads.end(), done.loads.begin(), done.loads.end());
    saves.insert(saves.end(), done.saves.begin(), done.saves.end());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(loads, std::vector<std::string>{"b"});
  EXPECT_EQ(saves, std::vector<std::string>{"c"});
  StatusOr<Lookup> found = connector->lookup(prompt(300, 12));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tokens, 0);
}

// A layer wait on the server's stream does not block the caller where the
// device makes stream waits: the device gets a signal per wait, which the
// load raises once the layer is written, or when the load ends (cancelled
// too): no stream is left waiting.
TEST_F(ConnectorTest, LayerWaitsOnAStreamAreRaisedOnceWrittenOrEnded) {
  struct StreamDevice final : ForwardingDevice {
    struct Signal final : StreamSignal {
      explicit Signal(std::atomic<int> &raised) : raised(raised) {}
      ~Signal() override { raise(); }
      void raise() override {
        if (!done.exchange(true))
          ++raised;
      }
      std::atomic<int> &raised;
      std::atomic<bool> done{false};
    };
    StatusOr<std::shared_ptr<StreamSignal>> streamWait(void *stream) override {
      if (stream != &serverStream)
        return invalidArgument("not the server's stream");
      ++waits;
      return std::shared_ptr<StreamSignal>(std::make_shared<Signal>(raised));
    }
    int serverStream = 0;
    std::atomic<int> waits{0}, raised{0};
  } device;
  options_.device = &device;
  auto connector = connect();
  ASSERT_TRUE(connector);
  const int64_t layers = model_->config().numLayers;
  const std::vector<int32_t> tokens = prompt(1200, 13);
  prefillAndSave(*connector, "a", tokens, blocks(0, 75));

  for (const char *id : {"b", "c"}) {
    SCOPED_TRACE(id);
    StatusOr<Decision> decision = connector->decide(id, tokens, 0);
    ASSERT_TRUE(decision && decision->loads());
    const std::vector<int32_t> ids = blocks(100, 75);
    ASSERT_TRUE(connector->startLoad(id, ids).isOk());
    for (int64_t l = 0; l < layers; ++l)
      ASSERT_TRUE(connector->waitLayerOn(id, l, &device.serverStream).isOk());
    if (std::string(id) == "b") {
      ASSERT_TRUE(connector->waitLoad(id).isOk());
      EXPECT_EQ(device.raised.load(), layers);
      prefill(tokens, decision->loadTokens, ids); // The server's share.
      expectExact(tokens, ids);
    } else {
      ASSERT_TRUE(connector->cancel(id).isOk());
      for (int i = 0; i < 500 && device.raised.load() < 2 * layers; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_EQ(device.raised.load(), 2 * layers);
    }
  }
  EXPECT_EQ(device.waits.load(), 2 * layers);
}

TEST_F(ConnectorTest, RequestsFromManyThreadsAreEachExact) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  // Four stored prefixes; four threads each serve one request over one of
  // them, in its own blocks, while a fifth saves another request.
  std::vector<std::vector<int32_t>> stored;
  for (int r = 0; r < 4; ++r) {
    stored.push_back(prompt(384, 20 + r));
    prefillAndSave(*connector, "saved" + std::to_string(r), stored[r],
                   blocks(r * 30, 24));
  }
  std::vector<std::vector<int32_t>> requests = stored;
  for (auto &tokens : requests)
    for (int32_t t : prompt(40, 30))
      tokens.push_back(t);
  std::vector<Status> results(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      const std::string id = "r" + std::to_string(r);
      StatusOr<Decision> decision = connector->decide(id, requests[r], 0);
      if (!decision || !decision->loads()) {
        results[r] =
            decision ? internalError(decision->why) : decision.status();
        return;
      }
      Status started = connector->startLoad(id, blocks(130 + r * 27, 27));
      for (int64_t l = 0; started.isOk() && l < model_->config().numLayers;
           ++l)
        started = connector->waitLayer(id, l);
      results[r] = started.isOk() ? connector->waitLoad(id).status() : started;
    });
  std::thread saver([&] {
    const std::vector<int32_t> other = prompt(300, 40);
    for (int64_t l = 0; l < model_->config().numLayers; ++l)
      (void)connector->saveLayer("other", other, l, blocks(240, 16));
    (void)connector->lookup(other);
    (void)connector->finished();
  });
  for (std::thread &thread : threads)
    thread.join();
  saver.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(results[r].isOk()) << r << ": " << results[r].toString();
    prefill(requests[r], 384, blocks(130 + r * 27, 27));
    expectExact(requests[r], blocks(130 + r * 27, 27));
  }
  ASSERT_TRUE(connector->cancel("other").isOk());
}

TEST_F(ConnectorTest, ALookupRacingASaveSeesOnlyWholeChunks) {
  auto connector = connect();
  ASSERT_TRUE(connector);
  const std::vector<int32_t> tokens = prompt(512, 50);
  const std::vector<int32_t> ids = blocks(0, 32);
  prefill(tokens, 0, ids);
  // Layers handed over one by one while another thread looks the request
  // up: a chunk is found only once every layer of it is stored, and what is
  // found never shrinks.
  std::atomic<bool> done{false};
  std::vector<int64_t> seen;
  std::thread looker([&] {
    while (!done) {
      StatusOr<Lookup> found = connector->lookup(tokens);
      ASSERT_TRUE(found) << found.status().toString();
      if (seen.empty() || seen.back() != found->tokens)
        seen.push_back(found->tokens);
    }
  });
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    ASSERT_TRUE(connector->saveLayer("a", tokens, l, ids).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(connector->waitSave("a"));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  done = true;
  looker.join();
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  for (int64_t tokensFound : seen)
    EXPECT_EQ(tokensFound % 128, 0) << tokensFound;
  StatusOr<Lookup> found = connector->lookup(tokens);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->tokens, 512);
}

} // namespace
} // namespace kvc::host
