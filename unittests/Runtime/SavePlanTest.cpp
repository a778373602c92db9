//===- SavePlanTest.cpp - Save plans run over a paged cache ---------------===//

#include "ExecutorFixture.h"
#include "StoreObjects.h"

#include "kvc/Runtime/Save/SavePlan.h"

#include <atomic>
#include <chrono>
#include <thread>

using namespace kvc;
using namespace kvc::exec_test;

namespace {

/// Picks int8+zstd for objects of even layers, raw for the others.
class Picks : public CodecChooser {
public:
  static CodecSpec codecOf(const ChunkRef &ref) {
    return ref.layerBegin % 2 == 0 ? *parseCodecSpec("int8+zstd") : CodecSpec();
  }
  CodecSpec choose(const ChunkObjects &, const ChunkRef &ref,
                   const float *) override {
    ++chosen;
    return codecOf(ref);
  }
  void sent(const CodecSpec &, size_t, size_t, double, double) override {}
  std::atomic<int64_t> chosen{0};
};

class SavePlanTest : public ExecutorTest {
protected:
  void SetUp() override {
    ExecutorTest::SetUp();
    table_ = *cache_->allocate(kTokens);
    disk_ = memTier();
    saved_ = std::make_unique<ChunkStore>(storeOn(disk_));
  }

  static std::shared_ptr<Tier> memTier(const std::string &url = "mem://") {
    return std::shared_ptr<Tier>(std::move(openTier(url).value()));
  }

  void TearDown() override { cache_->release(table_); }

  /// Prefills the request into the test's table.
  void prefill() {
    ASSERT_TRUE(runner()
                    .prefill(tokens_, *cache_, table_)
                    ->compute({0, kTokens, 0, model_->config().numLayers})
                    .isOk());
  }

  SaveTarget target(const LayerProgress *filling = nullptr) {
    source_ =
        std::make_unique<PagedCacheSource>(*device_, *cache_, table_, filling);
    SaveTarget t;
    t.source = source_.get();
    t.stores["disk"] = saved_.get();
    t.tokens = &tokens_;
    return t;
  }

  StatusOr<SaveMetrics> runSave(const BundlePlan &plan,
                                const LayerProgress *filling = nullptr,
                                const SaveRunOptions &options = {}) {
    auto pools = device_->createPools(planResources(plan));
    if (!pools.isOk())
      return pools.status();
    return save(**pools, plan, target(filling), options);
  }

  BundlePlan plan(const CodecSpec &codec = CodecSpec()) {
    return savePlanFor(*saved_, kTokens, {Form::KV}, codec, "disk");
  }

  /// Every stored raw object holds exactly what the cache holds.
  void expectStoredAsCached() {
    const int64_t kv = model_->kvDim();
    for (const ChunkRef &ref :
         saved_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec())) {
      std::vector<float> stored(saved_->shape(ref).numel());
      ASSERT_TRUE(saved_->get(ref, stored.data()).isOk()) << ref.name();
      const int64_t rows = ref.tokenEnd - ref.tokenBegin;
      std::vector<float> k(rows * kv), v(rows * kv);
      for (int64_t l = ref.layerBegin; l < ref.layerEnd; ++l) {
        ASSERT_TRUE(device_
                        ->readBack(*cache_, table_, l, ref.tokenBegin, rows,
                                   k.data(), v.data())
                        .isOk());
        const float *at = stored.data() + (l - ref.layerBegin) * 2 * rows * kv;
        EXPECT_TRUE(std::equal(k.begin(), k.end(), at)) << ref.name();
        EXPECT_TRUE(std::equal(v.begin(), v.end(), at + rows * kv))
            << ref.name();
      }
    }
  }

  BlockTable table_;
  std::unique_ptr<PagedCacheSource> source_;
  std::shared_ptr<Tier> disk_;
  std::unique_ptr<ChunkStore> saved_;
};

// A save plan over a prefilled cache stores every object as the cache holds
// it, tells when its snapshots are done, and skips what is stored on a
// second run; a lossy one stores its own encoding, within its bound.
TEST_F(SavePlanTest, StoresWhatTheCacheHolds) {
  prefill();
  std::atomic<int> snapshots{0};
  SaveRunOptions options;
  options.snapshotted = [&] { ++snapshots; };
  StatusOr<SaveMetrics> first = runSave(plan(), nullptr, options);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  const int64_t objects = int64_t(
      saved_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec()).size());
  EXPECT_EQ(first->written, objects);
  EXPECT_EQ(snapshots.load(), 1);
  EXPECT_LE(first->snapshotSeconds, first->makespanSeconds);
  EXPECT_GT(first->bytesWritten["disk"], 0);
  expectStoredAsCached();

  StatusOr<SaveMetrics> again = runSave(plan());
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->written, 0);
  EXPECT_EQ(again->skipped, objects);

  CodecSpec int8 = *parseCodecSpec("int8+zstd");
  StatusOr<SaveMetrics> lossy = runSave(plan(int8));
  ASSERT_TRUE(lossy.isOk()) << lossy.status().toString();
  EXPECT_EQ(lossy->written, objects);
  // 8 bits and a 16-bit scale per 32 values, against 16 bits.
  EXPECT_LT(lossy->bytesWritten["disk"], first->bytesWritten["disk"] * 3 / 5);
  BlockTable restored = *cache_->allocate(kTokens);
  BundlePlan load = makePlan({0, 0, 64}, model_->config().numLayers);
  for (BundleTask &task : load.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Fetch)
        step.codec = int8;
  ASSERT_TRUE(run(load, restored, saved_.get()).isOk());
  EXPECT_LT(relativeError(restored), 0.05);
  cache_->release(restored);
}

// A save beside the prefill that fills the cache: each gather waits until
// its layers hold its tokens, so what is stored is what the prefill wrote.
TEST_F(SavePlanTest, SavesACacheWhileAPrefillFillsIt) {
  const int64_t layers = model_->config().numLayers;
  LayerProgress filling;
  filling.reset(layers, kTokens);
  StatusOr<SaveMetrics> saved = invalidArgument("not run");
  std::thread saver([&] { saved = runSave(plan(), &filling); });
  std::unique_ptr<PrefillSession> session =
      runner().prefill(tokens_, *cache_, table_);
  for (int64_t t = 0; t < kTokens; t += 64) {
    const int64_t end = std::min(kTokens, t + 64);
    ASSERT_TRUE(session->compute({t, end, 0, layers}).isOk());
    filling.add(0, layers, end - t);
  }
  filling.finish(Status::ok());
  saver.join();
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  expectStoredAsCached();
}

// A save whose prefill fails part-way fails with its error and takes back
// the objects it had written.
TEST_F(SavePlanTest, AFailedSaveLeavesNothingBehind) {
  const int64_t layers = model_->config().numLayers;
  LayerProgress filling;
  filling.reset(layers, kTokens);
  StatusOr<SaveMetrics> saved = invalidArgument("not run");
  std::thread saver([&] { saved = runSave(plan(), &filling); });
  ASSERT_TRUE(runner()
                  .prefill(tokens_, *cache_, table_)
                  ->compute({0, 64, 0, layers})
                  .isOk());
  filling.add(0, layers, 64);
  // The first chunk's objects reach the store before the prefill dies.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (test::chunkObjects(*disk_).size() < 2 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(test::chunkObjects(*disk_).size(), 2u);
  filling.finish(unavailable("the prefill died"));
  saver.join();
  ASSERT_FALSE(saved.isOk());
  EXPECT_NE(saved.status().message().find("the prefill died"),
            std::string::npos)
      << saved.status().toString();
  EXPECT_TRUE(test::chunkObjects(*disk_).empty());
}

// A plan of both forms run beside the prefill that hands them over stores
// what the two-stage saver stores, object for object, whether its gathers
// keep up or the hand-over holds them back to a buffer of one object.
TEST_F(SavePlanTest, SavesWhatAPrefillHandsOver) {
  std::shared_ptr<Tier> reference = memTier();
  ChunkStore expected = storeOn(reference);
  const CodecSpec int8 = *parseCodecSpec("int8");
  SaveOptions twoStage;
  twoStage.codec = int8;
  ASSERT_TRUE(saveContext(*model_, expected, tokens_, twoStage).isOk());
  BundlePlan both =
      savePlanFor(*saved_, kTokens, {Form::KV, Form::Hidden}, int8, "disk");
  for (size_t buffer : {size_t(256) << 20, size_t(1)}) {
    std::shared_ptr<Tier> disk = memTier();
    ChunkStore store = storeOn(disk);
    SaveOptions stream;
    stream.bufferBytes = buffer;
    StatusOr<SaveMetrics> saved = saveDuringPrefill(
        *device_, *model_, tokens_, both, {{"disk", &store}}, stream);
    ASSERT_TRUE(saved.isOk()) << saved.status().toString();
    std::vector<std::string> names = test::chunkObjects(*reference);
    EXPECT_EQ(saved->written, int64_t(names.size()));
    EXPECT_EQ(test::chunkObjects(*disk), names);
    for (const std::string &name : names) {
      std::string want, got;
      ASSERT_TRUE(reference->get(name, want).isOk());
      ASSERT_TRUE(disk->get(name, got).isOk());
      EXPECT_EQ(got, want) << name;
    }
  }
}

// A save beside a prefill whose store fails ends with the store's error
// and leaves nothing behind, its hand-over holding one object at a time.
TEST_F(SavePlanTest, AFailedStoreEndsASaveDuringPrefill) {
  std::shared_ptr<Tier> tiny = memTier("mem://?capacity_mb=0.00001"); // 10 B.
  ChunkStore store = storeOn(tiny);
  SaveOptions stream;
  stream.bufferBytes = 1;
  StatusOr<SaveMetrics> saved = saveDuringPrefill(
      *device_, *model_, tokens_, plan(), {{"disk", &store}}, stream);
  ASSERT_FALSE(saved.isOk());
  EXPECT_NE(saved.status().message().find("exceeds the tier's capacity"),
            std::string::npos)
      << saved.status().toString();
  EXPECT_TRUE(test::chunkObjects(*tiny).empty());
}

// Plans the executor cannot run as a save are refused before anything is
// read or written, with what is wrong.
TEST_F(SavePlanTest, RefusesWhatItCannotSave) {
  prefill();
  auto refusal = [&](const BundlePlan &p) {
    StatusOr<SaveMetrics> refused = runSave(p);
    EXPECT_FALSE(refused.isOk());
    EXPECT_TRUE(test::chunkObjects(*disk_).empty());
    return refused.status().message();
  };
  EXPECT_EQ(refusal(savePlanFor(*saved_, kTokens, {Form::Hidden}, CodecSpec(),
                                "disk")),
            "save: plan save saves hidden, which a paged cache does not hold "
            "(a prefill's hand-over does: saveDuringPrefill)");
  EXPECT_EQ(
      refusal(savePlanFor(*saved_, kTokens, {Form::KV}, CodecSpec(), "ssd")),
      "save: no store for tier \"ssd\"");
  BundlePlan shorter =
      savePlanFor(*saved_, 128, {Form::KV}, CodecSpec(), "disk");
  EXPECT_EQ(refusal(shorter), "plan save covers tokens 0 to 128 of layers 0 "
                              "to 4, the request 300 tokens of 4 layers");
  BundlePlan restores = plan();
  restores.tasks[0].steps[0].kind = StepKind::Scatter;
  EXPECT_EQ(refusal(restores), "plan save has a scatter; it is no save plan");
  BundlePlan sends = plan();
  for (BundleStep &step : sends.tasks.back().steps)
    if (step.kind == StepKind::Store) {
      step.kind = StepKind::Send;
      step.node = "decode";
    }
  EXPECT_EQ(refusal(sends), "save: plan save stores to \"disk\" and sends to "
                            "\"decode\"; a save writes one");
  for (BundleTask &task : sends.tasks)
    for (BundleStep &step : task.steps)
      if (step.kind == StepKind::Store) {
        step.kind = StepKind::Send;
        step.node = "decode";
      }
  EXPECT_EQ(refusal(sends), "save: plan save sends to \"decode\", and the "
                            "save has no sender");
  // A save kernel encodes as it was generated: no chooser picks for it.
  BundlePlan kernelled = plan();
  kernelled.tasks[0].entry = "kvc_save_raw_bf16_t64_l1";
  const std::vector<BundleKernel> none;
  Picks picks;
  SaveRunOptions choosing;
  choosing.kernels = &none;
  choosing.chooser = &picks;
  StatusOr<SaveMetrics> refused = runSave(kernelled, nullptr, choosing);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().message(),
            "save: plan save's task 0 names a save kernel, which encodes as "
            "it was generated; the save's codec chooser cannot choose for it");
}

// A chooser picks each object's codec as it is encoded, over the plan's
// (a compress on every object's lanes, also under a raw default): the
// store holds each object in the codec it was given, and the chooser heard
// nothing of sends (a store has none).
TEST_F(SavePlanTest, AChooserPicksEachObjectsCodec) {
  prefill();
  SavePlanShape shape;
  shape.lanes = 2;
  shape.encodeOnLanes = true;
  Picks picks;
  SaveRunOptions options;
  options.chooser = &picks;
  StatusOr<SaveMetrics> saved = runSave(
      savePlanFor(*saved_, kTokens, {Form::KV}, CodecSpec(), "disk", shape),
      nullptr, options);
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  const std::vector<ChunkRef> refs =
      saved_->refs(tokens_.data(), kTokens, Form::KV, CodecSpec());
  EXPECT_EQ(saved->written, int64_t(refs.size()));
  EXPECT_EQ(picks.chosen.load(), int64_t(refs.size()));
  for (const ChunkRef &ref : refs) {
    StatusOr<std::vector<CodecSpec>> held = saved_->encodings(ref);
    ASSERT_TRUE(held.isOk()) << held.status().toString();
    EXPECT_EQ(*held, std::vector<CodecSpec>{Picks::codecOf(ref)}) << ref.name();
  }
}

} // namespace
