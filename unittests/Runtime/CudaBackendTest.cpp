//===- CudaBackendTest.cpp - Restores into GPU memory ---------------------===//
//
// The executor's restores (ExecutorFixture.h) on the CUDA backend: every
// strategy, the fallbacks and concurrent restores must equal a full CPU
// prefill within bf16 rounding, as they do on the CPU backend. The backend
// computes in fp32 GEMMs here (the CPU model's arithmetic); one test runs
// the bf16 GEMMs a server would and bounds how far they drift. Saves and
// verification prefill on the GPU as well (streamPrefill), and the tiled
// tensor-core attention is held against the fp32 kernel directly.
//
// Exits 77 (reported skipped) where no GPU is usable; listing the tests
// needs none.
//
//===----------------------------------------------------------------------===//

#include "ExecutorFixture.h"

#include "Kernels.h"
#include "kvc/Runtime/Cuda/CudaDevice.h"
#include "kvc/Runtime/Device/Registry.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>

using namespace kvc;
using namespace kvc::exec_test;

namespace {

std::unique_ptr<Device> gpu;

class CudaBackendTest : public ExecutorTest {
protected:
  void SetUp() override {
    device_ = gpu.get();
    ExecutorTest::SetUp();
  }

  /// Reads the bundle kvc-opt generated for the fixture's model
  /// ($KVC_EXEC_KERNELS, else the build's) into `generated_`; skips the
  /// test where neither names one. The caller returns when the test is
  /// skipped or has failed.
  void readGeneratedKernels() {
    std::string path;
    if (const char *given = std::getenv("KVC_EXEC_KERNELS"))
      path = given;
#ifdef KVC_EXEC_KERNELS
    else
      path = KVC_EXEC_KERNELS;
#endif
    if (path.empty())
      GTEST_SKIP() << "no generated kernels (set KVC_EXEC_KERNELS)";
    StatusOr<PlanBundle> bundle = readPlanBundle(path);
    ASSERT_TRUE(bundle) << bundle.status().toString();
    generated_ = std::move(*bundle);
  }

  std::optional<PlanBundle> generated_;

  /// Moves the test onto a backend of bf16 GEMMs (a server's precision,
  /// which the generated projection kernels need) with a cache of its own.
  void useBf16Gemms() {
    CudaDeviceOptions options;
    options.gemm = CudaDeviceOptions::Gemm::BF16;
    StatusOr<std::unique_ptr<Device>> backend = createCudaDevice(options);
    ASSERT_TRUE(backend) << backend.status().toString();
    bf16_ = std::move(*backend);
    device_ = bf16_.get();
    cache_ = std::move(device_->createCache(cache_->config()).value());
  }

  // The cache goes before the backend that made it.
  void TearDown() override { cache_.reset(); }

  std::unique_ptr<Device> bf16_;

  /// Tokens [0, n) of `layer` from `cache` through `backend`.
  std::pair<std::vector<float>, std::vector<float>>
  rows(Device &backend, const PagedKVCache &cache, const BlockTable &table,
       int64_t layer, int64_t n) {
    std::vector<float> k(n * model_->kvDim()), v(n * model_->kvDim());
    Status status =
        backend.readBack(cache, table, layer, 0, n, k.data(), v.data());
    EXPECT_TRUE(status.isOk()) << status.toString();
    return {k, v};
  }
};

TEST_F(CudaBackendTest, EveryStrategyEqualsAFullPrefill) {
  expectEveryStrategyExact();
  const int64_t layers = model_->config().numLayers;
  expectExact({0, layers, 96, /*slots=*/2}); // staged
  expectExact({0, layers, 64, 0, /*computeLayers=*/1});
}

// Calls return once their work is enqueued, ordered on the GPU by events:
// chunks through one staging slot (each upload after the scatter of the
// chunk before it in the same buffer, on another stream) and through one
// projection buffer stay exact, and a layer reported complete is in device
// memory when the report comes: read then by a copy that no stream of the
// backend's orders (the legacy stream does not wait for non-blocking
// ones), it holds what the finished restore holds.
TEST_F(CudaBackendTest, CallsOrderedByEventsRestoreExactlyAndSettleLayers) {
  const int64_t layers = model_->config().numLayers;
  expectExact({0, 0, 16, /*slots=*/1});
  expectExact({0, layers, 16, /*slots=*/1});
  expectExact({96, 0, 16, /*slots=*/1});

  BlockTable table = *cache_->allocate(kTokens);
  const size_t layerBytes =
      size_t(cache_->config().numBlocks * cache_->blockStride()) *
      sizeof(uint16_t);
  std::vector<std::vector<uint16_t>> seen(static_cast<size_t>(layers));
  LayerProgress progress;
  for (int64_t l = 0; l < layers; ++l)
    progress.whenReady(l, [&, l] {
      seen[size_t(l)].resize(layerBytes / 2);
      EXPECT_EQ(cudaMemcpy(seen[size_t(l)].data(), cache_->keyCache(l),
                           layerBytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
    });
  RestoreOptions options;
  options.progress = &progress;
  StatusOr<RestoreMetrics> metrics =
      restore(*pools_, makePlan({0, 0, 16, /*slots=*/2}, layers),
              targetFor(table), options);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<uint16_t> final(layerBytes / 2);
    ASSERT_EQ(cudaMemcpy(final.data(), cache_->keyCache(l), layerBytes,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(seen[size_t(l)] == final) << "layer " << l;
  }
  EXPECT_LT(relativeError(table), 1.0 / 128);
  cache_->release(table);
}

// The backend a server or kvc-run opens by name: the registry keeps it for
// the process. The check is also the process's exit after the restore
// (ctest runs each test alone): a backend destroyed among the statics
// after those its device memory frees through crashed kvc-run at exit.
TEST_F(CudaBackendTest, TheRegistrysBackendRestoresAndLetsTheProcessExit) {
  StatusOr<Device *> opened = openDevice("cuda", {0, "f32"});
  ASSERT_TRUE(opened) << opened.status().toString();
  device_ = *opened;
  cache_ = std::move(device_->createCache(cache_->config()).value());
  expectExact({0, model_->config().numLayers, 64});
}

TEST_F(CudaBackendTest, ModelsOfEveryDTypeRestoreExactly) {
  for (DType dtype : {DType::F16, DType::F32}) {
    SCOPED_TRACE(dtypeName(dtype));
    useModel(dtype);
    const int64_t layers = model_->config().numLayers;
    expectExact({0, layers, 64});
    expectExact({128, layers / 2, 64});
  }
}

// A Qwen3 with biased projections and per-head q/k norms on the GPU:
// every strategy within bf16 rounding of the CPU model's prefill (the
// forward, the projection and the generated projections add the biases and
// norm the heads before RoPE).
TEST_F(CudaBackendTest, AQwen3WithBiasesRestoresEveryStrategy) {
  useQwen3WithBiases();
  expectEveryStrategyExact();
  useBf16Gemms();
  expectExact({0, model_->config().numLayers, 64}); // hidden, bf16 GEMMs
}

TEST_F(CudaBackendTest, LostAndCorruptChunksAreRecomputedExactly) {
  ASSERT_TRUE(tier_->remove(victim(*store_, tokens_)).isOk());
  expectExact({0, 0, 64}, /*expectedFallbacks=*/1);
  expectExact({0, 0, 64, /*slots=*/1}, 1);
  expectExact({64, 2, 64, 0, /*computeLayers=*/1}, 1);

  useModel(DType::BF16);
  std::string name = victim(*store_, tokens_), bytes;
  ASSERT_TRUE(tier_->get(name, bytes).isOk());
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(tier_->put(name, bytes).isOk());
  expectExact({0, 0, 64}, 1);
}

// The compiler's restore kernels (the PTX of a bundle kvc-opt generated for
// this model: $KVC_EXEC_KERNELS, else the build's) launched by the
// executor: every chunk decoded on the GPU, the cache bit for bit the one
// the host's decode and the backend's scatter make.
TEST_F(CudaBackendTest, GeneratedKernelsDecodeAsTheHostDoes) {
  readGeneratedKernels();
  if (IsSkipped() || HasFatalFailure())
    return;
  expectGeneratedKernelsDecodeAsTheHost(generated_->kernels);
}

// The compiler's projection kernels (the same bundle's): the RMSNorm
// prologue, the backend's bf16 GEMM and the RoPE/scatter epilogue write
// every hidden chunk's K and V into the cache. They need bf16 GEMMs: on
// the fp32 backend the executor says why it runs its own projection.
TEST_F(CudaBackendTest, GeneratedProjectionsWriteTheCache) {
  readGeneratedKernels();
  if (IsSkipped() || HasFatalFailure())
    return;
  const int64_t layers = model_->config().numLayers;
  StatusOr<PlanBundle> bundle =
      withProjectionKernels(makePlan({0, layers, 64}, layers), model_->config(),
                            &generated_->kernels);
  ASSERT_TRUE(bundle) << bundle.status().toString();
  StatusOr<RestoreMetrics> fp32 = restoreWith(*bundle, *store_);
  ASSERT_TRUE(fp32) << fp32.status().toString();
  EXPECT_EQ(fp32->kernelChunks, 0);
  ASSERT_FALSE(fp32->kernelsNotLaunched.empty());
  EXPECT_NE(fp32->kernelsNotLaunched.front().find("fp32 inputs"),
            std::string::npos)
      << fp32->kernelsNotLaunched.front();

  useBf16Gemms();
  if (HasFatalFailure())
    return;
  expectGeneratedProjectionsExact(generated_->kernels);
}

// The same bundle's save kernels over the GPU's cache: every object
// encoded on the GPU, stored byte for byte as the host's encoder stores it.
TEST_F(CudaBackendTest, GeneratedSaveKernelsStoreWhatTheHostDoes) {
  readGeneratedKernels();
  if (IsSkipped() || HasFatalFailure())
    return;
  expectGeneratedSavesAsTheHost(generated_->kernels);
}

// The plans kvc-opt's pipelines compiled for the fixture's model with
// gpu-chip ($KVC_EXEC_RESTORES and $KVC_EXEC_SAVES, which
// scripts/gpu-check.sh sets) launch their kernels on the GPU, on bf16
// GEMMs: the int8 hidden plan's projection kernels need them.
TEST_F(CudaBackendTest, ThePipelinesPlansLaunchTheirKernels) {
  const char *restores = std::getenv("KVC_EXEC_RESTORES");
  const char *saves = std::getenv("KVC_EXEC_SAVES");
  if (!restores || !saves)
    GTEST_SKIP() << "no compiled plans (set KVC_EXEC_RESTORES and "
                    "KVC_EXEC_SAVES)";
  useBf16Gemms();
  if (HasFatalFailure())
    return;
  expectCompiledPlansLaunchTheirKernels(restores, saves);
}

TEST_F(CudaBackendTest, EightConcurrentRestoresAreAllExact) {
  expectConcurrentRestoresExact();
}

// A server's cache: device memory the caller owns, one tensor per layer
// interleaving K and V per block (one of vLLM's layouts).
TEST_F(CudaBackendTest, RestoresIntoDeviceMemoryTheCallerOwns) {
  PagedCacheConfig shape = cache_->config();
  const int64_t block = shape.blockSize * cache_->kvDim();
  shape.blockStride = 2 * block;
  const size_t bytes = size_t(shape.numBlocks * 2 * block) * sizeof(uint16_t);
  std::vector<void *> tensors(model_->config().numLayers);
  std::vector<PagedLayerMemory> layers;
  for (void *&tensor : tensors) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&tensor), bytes),
              cudaSuccess);
    auto *words = static_cast<uint16_t *>(tensor);
    layers.push_back({words, words + block});
  }
  auto view = PagedKVCache::view(shape, layers, CacheMemory::Device);
  ASSERT_TRUE(view) << view.status().toString();
  cache_ = std::move(*view);
  const int64_t n = model_->config().numLayers;
  expectExact({128, n / 2, 64});
  expectExact({0, n, 64});
  cache_.reset();
  for (void *tensor : tensors)
    cudaFree(tensor);
}

TEST_F(CudaBackendTest, DecodeGivesTheCpuModelsLogits) {
  BlockTable table = *cache_->allocate(kTokens + 1);
  ASSERT_TRUE(
      run(makePlan({128, 2, 64}, model_->config().numLayers), table).isOk());
  const int64_t vocab = model_->config().vocabSize;
  std::vector<float> logits(vocab), expected(vocab);
  const int32_t next = 5;
  Status status = gpu->createRunner(*model_)->decode(*cache_, table, kTokens,
                                                     &next, 1, logits.data());
  ASSERT_TRUE(status.isOk()) << status.toString();
  LlamaModel::Cache context = reference_;
  ASSERT_TRUE(
      model_->nextLogits(context, kTokens, &next, 1, expected.data()).isOk());
  float peak = 0, error = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    peak = std::max(peak, std::fabs(expected[i]));
    error = std::max(error, std::fabs(logits[i] - expected[i]));
  }
  EXPECT_LT(error, peak / 128) << "largest logit " << peak;
}

/// Ends the process with where it was when a test step outlives its
/// limit: a stream that never passes a wait would hang every later
/// device-wide synchronization (the fixture's frees), and the tests after
/// it with them.
class Watchdog {
public:
  explicit Watchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [&] { return done_; })) {
            std::fprintf(stderr, "watchdog: hung after %lld s at: %s\n",
                         static_cast<long long>(limit.count()), phase_.c_str());
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }
  void phase(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    phase_ = std::move(what);
  }

private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string phase_ = "start";
  std::thread thread_;
};

/// Whether `stream` passes everything queued on it within `limit`.
bool passesWithin(cudaStream_t stream, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  do {
    if (cudaStreamQuery(stream) != cudaErrorNotReady)
      return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

// A stream of the caller's waits on a signal without the host blocking: a
// memset queued behind the wait runs only once the host raises it; the
// wait words are reused once their stream has passed them. Every wait is
// bounded: a stream that does not pass fails the test, and the watchdog
// ends the process, saying where, rather than let it hang.
TEST_F(CudaBackendTest, AStreamWaitHoldsTheStreamUntilRaised) {
  Watchdog watchdog(std::chrono::seconds(20));
  using namespace std::chrono_literals;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void *word = nullptr;
  ASSERT_EQ(cudaMalloc(&word, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(word, 0, sizeof(int), stream), cudaSuccess);
  watchdog.phase("the first wait (the probe)");
  StatusOr<std::shared_ptr<StreamSignal>> signal = gpu->streamWait(stream);
  if (signal.status().code() == StatusCode::Unimplemented)
    GTEST_SKIP() << signal.status().toString();
  ASSERT_TRUE(signal) << signal.status().toString();
  ASSERT_EQ(cudaMemsetAsync(word, 1, sizeof(int), stream), cudaSuccess);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
  watchdog.phase("the first wait, raised");
  (*signal)->raise();
  ASSERT_TRUE(passesWithin(stream, 2000ms))
      << "the stream did not pass a raised wait";
  int host = 0;
  ASSERT_EQ(cudaMemcpy(&host, word, sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(host, 0x01010101);
  signal->reset();
  // More waits than there are words, each raised (by its signal going)
  // before the next: every one is made.
  for (int i = 0; i < 3000; ++i) {
    watchdog.phase("wait " + std::to_string(i) + " of 3000");
    StatusOr<std::shared_ptr<StreamSignal>> next = gpu->streamWait(stream);
    ASSERT_TRUE(next) << i << ": " << next.status().toString();
    if (i % 100 == 99) {
      ASSERT_TRUE(passesWithin(stream, 2000ms))
          << "the stream did not pass wait " << i;
    }
  }
  watchdog.phase("the last waits");
  EXPECT_TRUE(passesWithin(stream, 2000ms));
  cudaFree(word);
  cudaStreamDestroy(stream);
}

// A server's fp16 cache (an fp16 model's): every strategy loads stored
// bf16 KV rounded to f16 and writes computed chunks as f16, within bf16
// rounding of the full prefill; a loaded chunk's values are the stored
// bf16 values exactly where f16 holds them (all but a handful the chunked
// save rounded apart from the full prefill, or f16's subnormals).
TEST_F(CudaBackendTest, Fp16CachesRestoreEveryStrategy) {
  PagedCacheConfig config = cache_->config();
  config.dtype = DType::F16;
  StatusOr<std::unique_ptr<PagedKVCache>> f16 = device_->createCache(config);
  ASSERT_TRUE(f16) << f16.status().toString();
  cache_ = std::move(*f16);
  expectEveryStrategyExact();

  BlockTable table = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({0, 0, 64}, model_->config().numLayers), table));
  int64_t differ = 0, total = 0;
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    auto [k, v] = rows(*device_, *cache_, table, l, kTokens);
    for (std::size_t i = 0; i < k.size(); ++i) {
      differ += k[i] != bf16ToFloat(floatToBf16(reference_.k[l][i]));
      differ += v[i] != bf16ToFloat(floatToBf16(reference_.v[l][i]));
      total += 2;
    }
  }
  EXPECT_LT(double(differ) / double(total), 0.01);
  cache_->release(table);
}

// A stored value f16 cannot hold is an error where an fp16 cache is written,
// as the CPU's cache refuses it, never an infinity in the cache.
TEST_F(CudaBackendTest, Fp16CachesRefuseValuesBeyondTheirRange) {
  PagedCacheConfig config = cache_->config();
  config.dtype = DType::F16;
  cache_ = std::move(device_->createCache(config).value());
  BlockTable table = *cache_->allocate(16);
  const ChunkBox box{0, 16, 0, 1};
  HostWords kv(device_->hostMemory());
  kv.resize(size_t(2 * 16 * model_->kvDim()));
  for (uint16_t &word : kv)
    word = floatToBf16(0.5f);
  std::unique_ptr<DeviceBuffer> buffer = device_->allocate();
  ASSERT_TRUE(device_->upload(kv, false, *buffer).isOk());
  ASSERT_TRUE(device_->scatter(*buffer, box, *cache_, table).isOk());
  auto [k, v] = rows(*device_, *cache_, table, 0, 16);
  EXPECT_EQ(k[5], 0.5f);
  kv[7] = floatToBf16(1e6f);
  ASSERT_TRUE(device_->upload(kv, false, *buffer).isOk());
  Status status = device_->scatter(*buffer, box, *cache_, table);
  EXPECT_EQ(status.code(), StatusCode::DataLoss) << status.toString();
  // The lane's record is cleared: the next write in range succeeds.
  kv[7] = floatToBf16(0.5f);
  ASSERT_TRUE(device_->upload(kv, false, *buffer).isOk());
  EXPECT_TRUE(device_->scatter(*buffer, box, *cache_, table).isOk());
  cache_->release(table);
}

// A traced restore's trace shows the GPU's own spans of its uploads and
// scatters, a thread per stream, within the restore's time.
TEST_F(CudaBackendTest, ATraceShowsTheGpusSpans) {
  BlockTable table = *cache_->allocate(kTokens);
  RestoreOptions options;
  options.tracePath = ::testing::TempDir() + "/kvc-gpu-spans.json";
  StatusOr<RestoreMetrics> metrics =
      restore(*pools_, makePlan({0, 0, 64}, model_->config().numLayers),
              targetFor(table), options);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  std::ifstream in(options.tracePath);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> spans;
  for (const nlohmann::json &event : trace)
    if (event["ph"] == "X" && event["cat"] == "device") {
      const double start = event["ts"], end = start + double(event["dur"]);
      EXPECT_GT(start, -1e3) << event.dump(); // Microseconds.
      EXPECT_LT(end, metrics->makespanSeconds * 1e6 + 1e3) << event.dump();
      ++spans[event["name"].get<std::string>()];
    }
  EXPECT_EQ(spans["upload"], (kTokens + 63) / 64) << trace.dump();
  EXPECT_EQ(spans["scatter"], (kTokens + 63) / 64) << trace.dump();
  cache_->release(table);
}

TEST_F(CudaBackendTest, HostCachesAreRefused) {
  auto host = PagedKVCache::create(cache_->config());
  ASSERT_TRUE(host);
  BlockTable table = *(*host)->allocate(16);
  std::vector<float> k(16 * model_->kvDim()), v(k.size());
  Status status = gpu->readBack(**host, table, 0, 0, 16, k.data(), v.data());
  EXPECT_EQ(status.code(), StatusCode::FailedPrecondition) << status.toString();
}

using test::relativeMaxError;

// A save's prefill and verification's full prefill on the GPU
// (streamPrefill): what they show equals the CPU model's within bf16
// rounding, every layer's K, V and hidden states.
TEST_F(CudaBackendTest, SavesAndVerifiesWithTheGpusPrefill) {
  StatusOr<ModelCompute::Cache> full =
      fullPrefill(*gpu->createRunner(*model_), tokens_);
  ASSERT_TRUE(full) << full.status().toString();
  ASSERT_EQ(full->tokens, kTokens);
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    EXPECT_LE(relativeMaxError(full->k[l], reference_.k[l]), 1.0 / 128) << l;
    EXPECT_LE(relativeMaxError(full->v[l], reference_.v[l]), 1.0 / 128) << l;
  }

  // On a tier of its own: on the fixture's, objects equal to the CPU's
  // would be kept as they were, and compared with themselves.
  ChunkStore store = storeOn(std::shared_ptr<Tier>(*openTier("mem://")));
  SaveOptions options;
  options.device = gpu.get();
  options.prefillTokens = 128; // Spans of two chunks.
  StatusOr<SaveStats> saved = saveContext(*model_, store, tokens_, options);
  ASSERT_TRUE(saved) << saved.status().toString();
  const int64_t objects = forEachObjectAsSaved(
      store, [](const ChunkRef &ref, const std::vector<float> &ours,
                const std::vector<float> &cpus) {
        EXPECT_LE(relativeMaxError(ours, cpus), 1.0 / 128) << ref.name();
      });
  EXPECT_EQ(objects, saved->written);

  // A joint restore from the GPU's save, verified on the GPU.
  BlockTable table = *cache_->allocate(kTokens);
  const int64_t layers = model_->config().numLayers;
  ASSERT_TRUE(
      run(makePlan({128, layers / 2, 64}, layers), table, &store).isOk());
  StatusOr<RestoreError> error =
      restoreError(*model_, tokens_, *cache_, table, *gpu);
  ASSERT_TRUE(error) << error.status().toString();
  EXPECT_LE(error->max, 1.0 / 128);
}

// The bf16 GEMMs a server runs round every GEMM's inputs: a prefill drifts
// from the fp32 CPU model by more than one bf16 rounding, but stays close.
TEST_F(CudaBackendTest, Bf16GemmsStayNearTheCpuModel) {
  CudaDeviceOptions options;
  options.gemm = CudaDeviceOptions::Gemm::BF16;
  auto bf16 = createCudaDevice(options);
  ASSERT_TRUE(bf16) << bf16.status().toString();
  device_ = bf16->get();
  cache_ = std::move(device_->createCache(cache_->config()).value());
  BlockTable table = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({kTokens, 0, 64}, model_->config().numLayers), table)
                  .isOk());
  const double error = relativeError(table);
  std::printf("bf16 GEMMs: largest error %.4g of the largest |K|, |V|\n",
              error);
  EXPECT_LT(error, 1.0 / 16);
  // The same prefill twice is the same cache: the GPU path is deterministic.
  BlockTable again = *cache_->allocate(kTokens);
  ASSERT_TRUE(run(makePlan({kTokens, 0, 64}, model_->config().numLayers), again)
                  .isOk());
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    auto first = rows(**bf16, *cache_, table, l, kTokens);
    auto second = rows(**bf16, *cache_, again, l, kTokens);
    EXPECT_EQ(first, second) << "layer " << l;
  }
  cache_.reset();
}

// A server's model on the GPU: a runner over bf16 weights the test holds
// in device memory, laid out as vLLM's Llama holds them (fused QKV and
// gate/up), computes a restore's chunks within bf16 GEMMs' reach of the CPU
// model; a weight outside the GPU's memory is refused with which.
TEST_F(CudaBackendTest, ARunnerOverTheServersWeightsComputesTheChunks) {
  useBf16Gemms();
  std::vector<void *> held;
  auto hold = [&](std::vector<const std::vector<float> *> parts) -> void * {
    std::vector<uint16_t> bits;
    for (const std::vector<float> *part : parts)
      for (float x : *part)
        bits.push_back(floatToBf16(x));
    void *p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bits.size() * 2), cudaSuccess);
    EXPECT_EQ(
        cudaMemcpy(p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice),
        cudaSuccess);
    held.push_back(p);
    return p;
  };
  CudaLlamaWeights weights;
  weights.embedding = hold({&model_->embedding()});
  weights.finalNorm = hold({&model_->finalNorm()});
  weights.output = hold({&model_->outputLayer()});
  for (int64_t l = 0; l < model_->config().numLayers; ++l) {
    const LlamaModel::Layer &L = model_->layer(l);
    weights.layers.push_back({hold({&L.attnNorm}), hold({&L.mlpNorm}),
                              hold({&L.q, &L.k, &L.v}), hold({&L.o}),
                              hold({&L.gate, &L.up}), hold({&L.down})});
  }
  StatusOr<std::unique_ptr<ModelRunner>> runner =
      createCudaRunner(*device_, *model_, weights);
  ASSERT_TRUE(runner) << runner.status().toString();
  BlockTable table = *cache_->allocate(kTokens);
  RestoreTarget target = targetFor(table);
  target.runner = runner->get();
  StatusOr<RestoreMetrics> metrics = restore(
      *pools_, makePlan({kTokens, 0, 64}, model_->config().numLayers), target);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  const double error = relativeError(table);
  std::printf("the server's weights: largest error %.4g of the largest "
              "|K|, |V|\n",
              error);
  EXPECT_LT(error, 1.0 / 16);

  std::vector<float> onTheHost(model_->config().hiddenSize);
  weights.layers.back().postAttentionNorm = onTheHost.data();
  StatusOr<std::unique_ptr<ModelRunner>> refused =
      createCudaRunner(*device_, *model_, weights);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("post-attention norm is not in "
                                            "the memory of GPU"),
            std::string::npos)
      << refused.status().message();
  EXPECT_EQ(createCudaRunner(cpuDevice(), *model_, weights).status().code(),
            StatusCode::InvalidArgument);
  runner->reset();
  cache_.reset();
  for (void *p : held)
    cudaFree(p);
}

// A model loaded without its fp32 host weights computes on the GPU from its
// checkpoint as stored (bf16 copied straight, others converted a piece at a
// time): the restore is exact and the host weights are never made.
TEST_F(CudaBackendTest, AModelWithoutHostWeightsComputesFromItsCheckpoint) {
  LlamaModel::LoadOptions options;
  options.hostWeights = false;
  auto lazy = LlamaModel::load(
      test::generateTestModel("exec-bf16", 7, 4, 128, DType::BF16), options);
  ASSERT_TRUE(lazy) << lazy.status().toString();
  ASSERT_EQ((*lazy)->fingerprint(), model_->fingerprint());
  BlockTable table = *cache_->allocate(kTokens);
  RestoreTarget target = targetFor(table);
  target.model = lazy->get();
  StatusOr<RestoreMetrics> metrics = restore(
      *pools_, makePlan({128, 0, 64}, model_->config().numLayers), target);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_LT(relativeError(table), 1.0 / 128);
  EXPECT_FALSE((*lazy)->hasHostWeights());
  cache_->release(table);
}

// The tiled tensor-core attention against the fp32 kernel on the same
// paged cache: GQA, a shuffled block table, chunks that are no multiple of
// the tiles and start past token 0, and decode's single query.
TEST(CudaKernels, TiledAttentionMatchesTheFp32Kernel) {
  const int64_t heads = 8, kvHeads = 2, block = 16;
  for (int64_t headDim : {32, 64, 128})
    for (auto [position, n] :
         {std::pair<int64_t, int64_t>{0, 200}, {100, 70}, {333, 1}, {64, 64}}) {
      SCOPED_TRACE("head_dim " + std::to_string(headDim) + ", tokens " +
                   std::to_string(position) + " + " + std::to_string(n));
      const int64_t kvDim = kvHeads * headDim, total = position + n;
      const int64_t blocks = (total + block - 1) / block;
      const int64_t qWidth = heads * headDim;
      std::mt19937 random(headDim * 1000 + position);
      std::normal_distribution<float> normal;
      std::vector<uint16_t> keys(blocks * block * kvDim), values(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = floatToBf16(normal(random));
        values[i] = floatToBf16(normal(random));
      }
      std::vector<int32_t> table(blocks);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), random);
      std::vector<float> q(n * qWidth);
      for (float &x : q)
        x = 2 * normal(random); // Peaked softmaxes too.

      uint16_t *dKeys, *dValues;
      int32_t *dTable;
      float *dQ, *tiledOut, *exactOut;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&dKeys), keys.size() * 2),
                cudaSuccess);
      ASSERT_EQ(
          cudaMalloc(reinterpret_cast<void **>(&dValues), values.size() * 2),
          cudaSuccess);
      ASSERT_EQ(
          cudaMalloc(reinterpret_cast<void **>(&dTable), table.size() * 4),
          cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&dQ), q.size() * 4),
                cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&tiledOut), q.size() * 4),
                cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&exactOut), q.size() * 4),
                cudaSuccess);
      cudaMemcpy(dKeys, keys.data(), keys.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dValues, values.data(), values.size() * 2,
                 cudaMemcpyHostToDevice);
      cudaMemcpy(dTable, table.data(), table.size() * 4,
                 cudaMemcpyHostToDevice);
      cudaMemcpy(dQ, q.data(), q.size() * 4, cudaMemcpyHostToDevice);
      cuda::RowLayout cache{dKeys,         dValues, dTable, block,
                            block * kvDim, kvDim,   0};
      for (auto [out, tensorCores] :
           {std::pair{tiledOut, true}, std::pair{exactOut, false}})
        ASSERT_EQ(cuda::attention(dQ, qWidth, cache, position, n, heads,
                                  kvHeads, headDim, out, /*bf16Out=*/false,
                                  tensorCores, nullptr),
                  cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> tiled(q.size()), exact(q.size());
      cudaMemcpy(tiled.data(), tiledOut, q.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(exact.data(), exactOut, q.size() * 4, cudaMemcpyDeviceToHost);
      for (void *p : {(void *)dKeys, (void *)dValues, (void *)dTable,
                      (void *)dQ, (void *)tiledOut, (void *)exactOut})
        cudaFree(p);
      // Outputs are convex combinations of V (|V| of a few units): bf16's
      // rounding of Q and the weights moves them by hundredths at most.
      double worst = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_TRUE(std::isfinite(tiled[i])) << i;
        worst = std::max(worst, double(std::fabs(tiled[i] - exact[i])));
      }
      EXPECT_LT(worst, 0.05);
      EXPECT_GT(relativeMaxError(tiled, exact), 0.0); // Not the fp32 kernel.
    }
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!::testing::GTEST_FLAG(list_tests)) {
    CudaDeviceOptions options;
    options.gemm = CudaDeviceOptions::Gemm::F32;
    StatusOr<std::unique_ptr<Device>> backend = createCudaDevice(options);
    if (!backend) {
      std::printf("skipped: %s\n", backend.status().toString().c_str());
      return 77;
    }
    gpu = std::move(*backend);
  }
  int status = RUN_ALL_TESTS();
  gpu.reset();
  return status;
}
