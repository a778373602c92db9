//===- PrefillStreamTest.cpp - A request's prefill on a backend -----------===//
//
// Saves and verification prefill on the backend they are given
// (ModelRunner::streamPrefill): a backend that counts its streams shows which
// prefill ran where, and the default stream is the model's own prefill.
//
//===----------------------------------------------------------------------===//

#include "ExecutorFixture.h"
#include "ForwardingDevice.h"
#include "Tolerance.h"

namespace kvc::exec_test {
namespace {

class PrefillStreamTest : public ExecutorTest {
protected:
  void SetUp() override {
    device_ = &counting_;
    ExecutorTest::SetUp();
  }
  CountingDevice counting_;
};

TEST_F(PrefillStreamTest, TheFullPrefillIsTheModelsOwn) {
  StatusOr<ModelCompute::Cache> full = fullPrefill(runner(), tokens_);
  ASSERT_TRUE(full) << full.status().toString();
  EXPECT_EQ(counting_.streams.load(), 1);
  EXPECT_EQ(full->tokens, kTokens);
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    EXPECT_EQ(full->k[l], reference_.k[l]) << "layer " << l;
    EXPECT_EQ(full->v[l], reference_.v[l]) << "layer " << l;
  }
}

// Spans of the stream follow each other: each layer shows its span's rows
// at its position, in layer order, and the stream holds no more than the
// request.
TEST_F(PrefillStreamTest, SpansShowEveryLayerInOrder) {
  StatusOr<std::unique_ptr<PrefillStream>> stream =
      runner().streamPrefill(kTokens);
  ASSERT_TRUE(stream) << stream.status().toString();
  const int64_t kv = model_->kvDim(), split = 100;
  for (auto [first, n] :
       {std::pair<int64_t, int64_t>{0, split}, {split, kTokens - split}}) {
    std::vector<int64_t> layers;
    Status shown =
        (*stream)->next(tokens_.data() + first, n, [&](const LayerSnapshot &s) {
          layers.push_back(s.layer);
          EXPECT_EQ(s.position, first);
          EXPECT_EQ(s.tokens, n);
          ASSERT_NE(s.hidden, nullptr);
          // K after RoPE, as the full prefill's, within bf16 rounding of
          // a prefill in other spans (relative to the span's largest |K|).
          EXPECT_LE(test::relativeMaxError(
                        s.k, reference_.k[s.layer].data() + first * kv,
                        size_t(n * kv)),
                    test::kOneBf16Step)
              << "layer " << s.layer;
        });
    ASSERT_TRUE(shown.isOk()) << shown.toString();
    EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2, 3}));
  }
  Status past = (*stream)->next(tokens_.data(), 1, {});
  EXPECT_EQ(past.code(), StatusCode::InvalidArgument);
  EXPECT_NE(past.message().find("exceed the request's"), std::string::npos)
      << past.message();
}

// A backend that cannot open a save's prefill stream (a device out of
// memory) ends the save with its error before any writer starts; a save
// asking for more writers than any machine needs is refused.
TEST_F(PrefillStreamTest, ASaveWhoseStreamCannotOpenEndsWithItsError) {
  std::unique_ptr<ChunkStore> store = makeStore(*model_);
  SaveOptions options;
  options.device = &counting_;
  counting_.refusal = unavailable("no device memory");
  StatusOr<SaveStats> saved = saveContext(*model_, *store, tokens_, options);
  counting_.refusal = Status::ok();
  ASSERT_FALSE(saved);
  EXPECT_EQ(saved.status().message(), "no device memory");
  options.writers = 100000;
  saved = saveContext(*model_, *store, tokens_, options);
  ASSERT_FALSE(saved);
  EXPECT_EQ(saved.status().message(),
            "stream: the writers: 100000 workers (expected 1 to 1024)");
}

// A save and the verification of a restore prefill on the backend they
// were given, and save what the CPU's prefill saves.
TEST_F(PrefillStreamTest, SavesAndVerificationPrefillOnTheirBackend) {
  std::unique_ptr<ChunkStore> store = makeStore(*model_);
  SaveOptions options;
  options.device = &counting_;
  StatusOr<SaveStats> saved = saveContext(*model_, *store, tokens_, options);
  ASSERT_TRUE(saved) << saved.status().toString();
  EXPECT_EQ(counting_.streams.load(), 1);
  EXPECT_GT(forEachObjectAsSaved(*store,
                                 [](const ChunkRef &ref,
                                    const std::vector<float> &ours,
                                    const std::vector<float> &cpus) {
                                   EXPECT_EQ(ours, cpus) << ref.name();
                                 }),
            0);

  // A joint restore (computed front, hidden states projected, KV loaded)
  // verified against the backend's full prefill: the reference's error.
  const int64_t layers = model_->config().numLayers;
  BlockTable table = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan(Split{128, layers / 2, 64}, layers), table).isOk());
  StatusOr<RestoreError> error =
      restoreError(*model_, tokens_, *cache_, table, counting_);
  ASSERT_TRUE(error) << error.status().toString();
  EXPECT_EQ(counting_.streams.load(), 2);
  EXPECT_GT(error->max, 0.0); // The projected layers round apart.
  EXPECT_EQ(error->max, relativeError(table));
}

} // namespace
} // namespace kvc::exec_test
