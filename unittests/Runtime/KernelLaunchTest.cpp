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

#include "HostKernelDevice.h"
#include "StoreObjects.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"
#include "kvc/Runtime/Save/SavePlan.h"

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

namespace kvc::exec_test {
namespace {

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

    // The same plan decoded by the runtime's own code: the same cache. This
    // device's cache is host memory, so the runtime decodes straight into
    // its rows: nothing is uploaded or scattered.
    kernels_.uploadedBytes = 0;
    metrics = restoreWith(bundle, *store, &onHost, /*kernels=*/false);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(metrics->kernelChunks, 0);
    EXPECT_EQ(kernels_.uploadedBytes, 0);
    EXPECT_EQ(metrics->hostTraffic.decoded, bf16Bytes);
    EXPECT_EQ(metrics->hostTraffic.scattered, 0);
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
  // Read in place into the memory the upload reads, and checked there: the
  // kernel's payload is the raw chunk, so nothing is copied on the host.
  EXPECT_GT(metrics->hostTraffic.read, 0);
  EXPECT_EQ(metrics->hostTraffic.copied, 0);
  EXPECT_EQ(metrics->hostTraffic.decoded, 0);
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
  StatusOr<int64_t> launches = internalError("the gather has not ended");
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

// A prefill node's save of KV with the bundle's kernel table, on a backend
// that launches kernels, prefills into a cache of the backend's and has the
// save kernels encode every object there as each prefill step writes it;
// the store then holds what the host's encoder stores from the prefill's
// hand-over, byte for byte. Without the table, or on a backend that
// launches none, the prefill hands the objects over to the host's encoder.
TEST_F(KernelLaunchTest, SavesBesideAPrefillEncodeInItsCache) {
  for (const char *text : {"int8", "hadamard+int4+zstd"}) {
    SCOPED_TRACE(text);
    StatusOr<PlanBundle> bundle = savePlanWithKernels(*store_, codec(text));
    ASSERT_TRUE(bundle) << bundle.status().toString();
    const int64_t objects = int64_t(
        store_->refs(tokens_.data(), kTokens, Form::KV, codec(text)).size());
    struct Run {
      const char *name;
      Device *device;
      const std::vector<BundleKernel> *kernels;
    };
    std::map<std::string, std::shared_ptr<Tier>> tiers;
    for (const Run &run : {Run{"device", &kernels_, &bundle->kernels},
                           Run{"cpu", &cpuDevice(), &bundle->kernels},
                           Run{"hand-over", &kernels_, nullptr}}) {
      SCOPED_TRACE(run.name);
      tiers[run.name] = std::shared_ptr<Tier>(*openTier("mem://"));
      ChunkStore store = storeOn(tiers[run.name]);
      kernels_.saves = 0;
      SaveRunOptions options;
      options.kernels = run.kernels;
      StatusOr<SaveMetrics> saved = saveDuringPrefill(
          *run.device, *model_, tokens_, bundle->plans.front(),
          {{"disk", &store}}, {}, options);
      ASSERT_TRUE(saved) << saved.status().toString();
      EXPECT_EQ(saved->written, objects);
      EXPECT_GT(saved->prefillSeconds, 0);
      const bool device = run.device == &kernels_ && run.kernels;
      EXPECT_EQ(saved->kernelChunks, device ? objects : 0);
      EXPECT_EQ(kernels_.saves, device ? objects : 0);
      EXPECT_EQ(saved->kernelsNotLaunched.empty(), device || !run.kernels);
      if (!saved->kernelsNotLaunched.empty()) {
        EXPECT_NE(saved->kernelsNotLaunched.front().find("on the host"),
                  std::string::npos)
            << saved->kernelsNotLaunched.front();
      }
    }
    std::vector<std::string> names = test::chunkObjects(*tiers["hand-over"]);
    ASSERT_EQ(int64_t(names.size()), objects);
    for (const char *name : {"device", "cpu"}) {
      EXPECT_EQ(test::chunkObjects(*tiers[name]), names) << name;
      for (const std::string &object : names) {
        std::string ours, hosts;
        ASSERT_TRUE(tiers[name]->get(object, ours).isOk()) << object;
        ASSERT_TRUE(tiers["hand-over"]->get(object, hosts).isOk()) << object;
        EXPECT_EQ(ours, hosts) << name << ": " << object;
      }
    }
  }
}

// Beside a prefill of the whole request in one step, the save kernels
// encode the first layers' objects while the prefill computes the later
// ones: the backend tells the save each layer as it writes it. (The
// prefill waits, before telling it the last layer, for a save to launch.)
TEST_F(KernelLaunchTest, ASaveBesideAOneStepPrefillFollowsItsLayers) {
  StatusOr<PlanBundle> bundle = savePlanWithKernels(*store_, codec("int8"));
  ASSERT_TRUE(bundle) << bundle.status().toString();
  ChunkStore store = storeOn(std::shared_ptr<Tier>(*openTier("mem://")));
  const int64_t last = model_->config().numLayers - 1;
  ASSERT_GT(last, store.layout().layerGroup - 1);
  int64_t launchedBeforeTheLastLayer = 0;
  kernels_.saveLaunches = 0;
  kernels_.beforeWritten = [&](int64_t layer) {
    if (layer != last)
      return;
    for (int i = 0; i < 10000 && kernels_.saveLaunches == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    launchedBeforeTheLastLayer = kernels_.saveLaunches;
  };
  SaveOptions stream;
  stream.prefillTokens = (kTokens + 63) / 64 * 64;
  SaveRunOptions options;
  options.kernels = &bundle->kernels;
  StatusOr<SaveMetrics> saved =
      saveDuringPrefill(kernels_, *model_, tokens_, bundle->plans.front(),
                        {{"disk", &store}}, stream, options);
  kernels_.beforeWritten = nullptr;
  ASSERT_TRUE(saved) << saved.status().toString();
  EXPECT_GT(launchedBeforeTheLastLayer, 0);
  EXPECT_EQ(saved->kernelChunks, saved->written);
}

// A kernel table without save kernels (a plan compiled without gpu-chip)
// leaves a save beside a prefill to the prefill's host hand-over.
TEST_F(KernelLaunchTest, ASaveWithoutSaveKernelsTakesTheHandOver) {
  ChunkStore store = storeOn(std::shared_ptr<Tier>(*openTier("mem://")));
  const BundlePlan plan =
      savePlanFor(store, kTokens, {Form::KV}, codec("int8"), "disk");
  const std::vector<BundleKernel> none;
  int64_t layersTold = 0;
  kernels_.beforeWritten = [&](int64_t) { ++layersTold; };
  SaveRunOptions options;
  options.kernels = &none;
  StatusOr<SaveMetrics> saved = saveDuringPrefill(
      kernels_, *model_, tokens_, plan, {{"disk", &store}}, {}, options);
  kernels_.beforeWritten = nullptr;
  ASSERT_TRUE(saved) << saved.status().toString();
  EXPECT_GT(saved->written, 0);
  EXPECT_EQ(saved->kernelChunks, 0);
  EXPECT_EQ(layersTold, 0); // No prefill into the backend's cache.
}

// A prefill that fails beside a save into the backend's cache ends the
// save with its error, and the store keeps nothing of it.
TEST_F(KernelLaunchTest, AFailedPrefillEndsASaveInItsCache) {
  StatusOr<PlanBundle> bundle = savePlanWithKernels(*store_, codec("int8"));
  ASSERT_TRUE(bundle) << bundle.status().toString();
  std::shared_ptr<Tier> tier(*openTier("mem://"));
  ChunkStore store = storeOn(tier);
  kernels_.failPrefillAt = 128;
  SaveRunOptions options;
  options.kernels = &bundle->kernels;
  StatusOr<SaveMetrics> saved =
      saveDuringPrefill(kernels_, *model_, tokens_, bundle->plans.front(),
                        {{"disk", &store}}, {}, options);
  kernels_.failPrefillAt = -1;
  ASSERT_FALSE(saved);
  EXPECT_NE(saved.status().message().find("prefill failed at 128"),
            std::string::npos)
      << saved.status().toString();
  EXPECT_TRUE(test::chunkObjects(*tier).empty());
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
