//===- DynamicCakeTest.cpp - Cake's walk at run time ----------------------===//

#include "ExecutorFixture.h"
#include "ForwardingDevice.h"

#include "kvc/Runtime/Exec/DynamicCake.h"

#include <chrono>
#include <thread>

using namespace kvc;
using namespace kvc::exec_test;

namespace {

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
  StatusOr<RestoreMetrics> runCake(ChunkStore &store, BlockTable &table) {
    DynamicCakeOptions options;
    options.predictedMergeToken = 128;
    return restoreDynamicCake(*pools_, targetFor(table, &store), options);
  }

  /// Tokens [0, mergeToken) were computed, a chunk at a time from the front,
  /// and the rest loaded: the merge point is where the computed chunks end,
  /// and the bytes read are exactly the objects of the loaded ones.
  void expectMetAtTheMergePoint(const RestoreMetrics &result) {
    EXPECT_EQ(result.walk->mergeToken,
              std::min(result.walk->chunksComputed * 64, kTokens));
    int64_t loaded = 0;
    for (const ChunkRef &ref :
         store_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec())) {
      std::string object;
      ASSERT_TRUE(tier_->get(ref.name(), object).isOk()) << ref.name();
      if (ref.tokenBegin >= result.walk->mergeToken)
        loaded += int64_t(object.size());
    }
    auto read = result.bytesRead.find("dram");
    EXPECT_EQ(read == result.bytesRead.end() ? 0 : read->second, loaded);
  }
};

TEST_F(DynamicCakeTest, SidesMeetAndTheCacheIsExact) {
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> result = runCake(*store_, table);
  ASSERT_TRUE(result) << result.status().toString();
  // 300 tokens in 64-token store chunks: 5 chunks, each computed or loaded.
  EXPECT_EQ(result->walk->chunksComputed + result->walk->chunksLoaded, 5);
  EXPECT_TRUE(result->fallbacks.empty());
  EXPECT_EQ(result->walk->predictedMergeToken, 128);
  expectMetAtTheMergePoint(*result);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

/// The CPU backend, each prefill step `delay` late, as a busy device.
class SlowComputeBackend final : public ForwardingDevice {
public:
  Status prefillInto(const ModelCompute &model, PagedKVCache &cache,
                     const BlockTable &table, const int32_t *tokens,
                     int64_t position, int64_t n, int64_t layers,
                     const LayerWritten &written) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    return ForwardingDevice::prefillInto(model, cache, table, tokens, position,
                                         n, layers, written);
  }
};

class SlowComputeCakeTest : public DynamicCakeTest {
protected:
  void SetUp() override {
    device_ = &slow_;
    DynamicCakeTest::SetUp();
  }
  SlowComputeBackend slow_;
};

// Compute slower than the store: the loaders, claiming from the back while
// the front computes, take most chunks, and the merge point moves forward
// from the compiler's 128 to where the computed chunks end.
TEST_F(SlowComputeCakeTest, ASlowComputeLeavesChunksToTheLoaders) {
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> result = runCake(*store_, table);
  ASSERT_TRUE(result) << result.status().toString();
  EXPECT_EQ(result->walk->chunksComputed + result->walk->chunksLoaded, 5);
  EXPECT_GE(result->walk->chunksLoaded, 3);
  EXPECT_LE(result->walk->mergeToken, 128);
  expectMetAtTheMergePoint(*result);
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
  EXPECT_EQ(cake->codec.str(), "raw");
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
  EXPECT_EQ(
      dynamicCakeOptions(makePlan({0, 0, 64}, layers))->predictedMergeToken,
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
  // Every read takes a second: each loading lane gets through the chunk it
  // claimed first while compute takes the rest (three chunks of a small
  // model: milliseconds, a loaded host's hundreds of them included).
  tier_ = std::make_shared<SlowTier>(tier_, std::chrono::milliseconds(1000));
  std::unique_ptr<ChunkStore> slow = makeStore(*model_);
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> result = runCake(*slow, table);
  ASSERT_TRUE(result) << result.status().toString();
  EXPECT_LE(result->walk->chunksLoaded, 2); // One per io lane at most.
  EXPECT_GE(result->walk->mergeToken, 192);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

TEST_F(DynamicCakeTest, UnloadableChunksAreRecomputed) {
  // Every KV object gone: the loaders hand every chunk they claim back.
  for (const ChunkRef &ref :
       store_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec()))
    ASSERT_TRUE(tier_->remove(ref.name()).isOk());
  BlockTable table = *cache_->allocate(kTokens);
  StatusOr<RestoreMetrics> result = runCake(*store_, table);
  ASSERT_TRUE(result) << result.status().toString();
  EXPECT_EQ(result->walk->chunksLoaded, 0);
  EXPECT_EQ(int64_t(result->fallbacks.size()),
            5 - result->walk->chunksComputed);
  EXPECT_LT(relativeError(table), 1.0 / 128);
}

} // namespace
