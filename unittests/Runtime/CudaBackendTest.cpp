//===- CudaBackendTest.cpp - Restores into GPU memory ---------------------===//
//
// The executor's restores (ExecutorFixture.h) on the CUDA backend: every
// strategy, the fallbacks and concurrent restores must equal a full CPU
// prefill within bf16 rounding, as they do on the CPU backend. The backend
// computes in fp32 GEMMs here (the CPU model's arithmetic); one test runs
// the bf16 GEMMs a server would and bounds how far they drift.
//
// Exits 77 (reported skipped) where no GPU is usable; listing the tests
// needs none.
//
//===----------------------------------------------------------------------===//

#include "ExecutorFixture.h"

#include "kvc/Runtime/Cuda/CudaBackend.h"

#include <cuda_runtime_api.h>

#include <cstdlib>

using namespace kvc;
using namespace kvc::exec_test;

namespace {

std::unique_ptr<Backend> gpu;

class CudaBackendTest : public ExecutorTest {
protected:
  void SetUp() override {
    backend_ = gpu.get();
    ExecutorTest::SetUp();
  }

  /// Tokens [0, n) of `layer` from `cache` through `backend`.
  std::pair<std::vector<float>, std::vector<float>>
  rows(Backend &backend, const PagedKVCache &cache, const BlockTable &table,
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

TEST_F(CudaBackendTest, ModelsOfEveryDTypeRestoreExactly) {
  for (DType dtype : {DType::F16, DType::F32}) {
    SCOPED_TRACE(dtypeName(dtype));
    useModel(dtype);
    const int64_t layers = model_->config().numLayers;
    expectExact({0, layers, 64});
    expectExact({128, layers / 2, 64});
  }
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
  std::string path;
  if (const char *given = std::getenv("KVC_EXEC_KERNELS"))
    path = given;
#ifdef KVC_EXEC_KERNELS
  if (path.empty())
    path = KVC_EXEC_KERNELS;
#endif
  if (path.empty())
    GTEST_SKIP() << "no generated kernels (set KVC_EXEC_KERNELS)";
  StatusOr<PlanBundle> generated = readPlanBundle(path);
  ASSERT_TRUE(generated) << generated.status().toString();
  expectGeneratedKernelsDecodeAsTheHost(generated->kernels);
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
    ASSERT_EQ(cudaMalloc(&tensor, bytes), cudaSuccess);
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
  Status status =
      gpu->decode(*model_, *cache_, table, kTokens, &next, 1, logits.data());
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

TEST_F(CudaBackendTest, HostCachesAreRefused) {
  auto host = PagedKVCache::create(cache_->config());
  ASSERT_TRUE(host);
  BlockTable table = *(*host)->allocate(16);
  std::vector<float> k(16 * model_->kvDim()), v(k.size());
  Status status = gpu->readBack(**host, table, 0, 0, 16, k.data(), v.data());
  EXPECT_EQ(status.code(), StatusCode::FailedPrecondition) << status.toString();
}

// The bf16 GEMMs a server runs round every GEMM's inputs: a prefill drifts
// from the fp32 CPU model by more than one bf16 rounding, but stays close.
TEST_F(CudaBackendTest, Bf16GemmsStayNearTheCpuModel) {
  CudaBackendOptions options;
  options.gemm = CudaBackendOptions::Gemm::BF16;
  auto bf16 = createCudaBackend(options);
  ASSERT_TRUE(bf16) << bf16.status().toString();
  backend_ = bf16->get();
  cache_ = std::move(backend_->createCache(cache_->config()).value());
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

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!::testing::GTEST_FLAG(list_tests)) {
    CudaBackendOptions options;
    options.gemm = CudaBackendOptions::Gemm::F32;
    StatusOr<std::unique_ptr<Backend>> backend = createCudaBackend(options);
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
