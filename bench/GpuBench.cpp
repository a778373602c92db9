//===- GpuBench.cpp - The CUDA backend against the hardware ---------------===//
//
// kvc-gpu-bench --model DIR [--tokens N] [--repeat R] [--out FILE]
//
// Measures on one GPU, in one run, the backend's paths beside what the
// hardware does without it:
//
//   upload   the backend's host-to-device path as a restore takes it
//            (Device::uploadGBs: 256 MiB from the device's host memory,
//            where staging slots decode chunks), and from pageable memory
//            (through the lane's pinned staging), against cudaMemcpyAsync
//            of 256 MiB from pinned memory;
//   gemm     cuBLAS's bf16 rate (cublasGemmEx, fp32 accumulation, 8192^3),
//            which prefill's MFU is taken against;
//   prefill  N tokens from position 0 through every layer into a paged
//            cache (ModelRunner::prefillInto): FLOPs of the projections, MLP
//            and causal attention per second, and that over the GEMM rate;
//   project  HCache's projection of the same N tokens' hidden states, every
//            layer (ModelRunner::project), and its K and V scattered into the
//            paged cache as the prefill's are (Device::scatter), alone and
//            with their upload: per token against the prefill's time.
//
// The backend's calls return once their work is enqueued; each timed run
// ends with Device::settle on the cache it wrote.
//
// Each time is the fastest of R runs after a warm-up. Prints a table and,
// with --out, writes the numbers as JSON. Exits 77 where no GPU is usable.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Cuda/CudaDevice.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>

using namespace kvc;

namespace {

/// Fails the run with `what` when a CUDA or cuBLAS call does.
void check(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "kvc-gpu-bench: %s failed\n", what);
    std::exit(1);
  }
}
void check(const Status &status) {
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-gpu-bench: %s\n", status.toString().c_str());
    std::exit(1);
  }
}

/// The fastest of `repeat` runs of `run` after one warm-up, in seconds.
double fastest(int repeat, const std::function<void()> &run) {
  run();
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    Clock::time_point start = Clock::now();
    run();
    best = std::min(best, secondsSince(start));
  }
  return best;
}

/// GB/s of cudaMemcpyAsync from pinned host memory, `bytes` at a time.
double pinnedCopyGBs(size_t bytes, int repeat) {
  void *host = nullptr, *device = nullptr;
  cudaStream_t stream;
  check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault) == cudaSuccess,
        "cudaHostAlloc");
  check(cudaMalloc(&device, bytes) == cudaSuccess, "cudaMalloc");
  check(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
  std::memset(host, 1, bytes);
  const double seconds = fastest(repeat, [&] {
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice,
                          stream) == cudaSuccess &&
              cudaStreamSynchronize(stream) == cudaSuccess,
          "cudaMemcpyAsync");
  });
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFreeHost(host);
  return double(bytes) / seconds / 1e9;
}

/// TFLOP/s of cuBLAS's bf16 GEMM with fp32 accumulation, n x n x n.
double gemmTflops(int n, int repeat) {
  void *a = nullptr, *b = nullptr, *c = nullptr;
  const size_t elements = size_t(n) * n;
  check(cudaMalloc(&a, elements * 2) == cudaSuccess &&
            cudaMalloc(&b, elements * 2) == cudaSuccess &&
            cudaMalloc(&c, elements * 4) == cudaSuccess,
        "cudaMalloc");
  cudaMemset(a, 0, elements * 2); // Zeros: the rate does not depend on them.
  cudaMemset(b, 0, elements * 2);
  cublasHandle_t handle;
  check(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
  const float alpha = 1, beta = 0;
  constexpr int kCalls = 10;
  const double seconds = fastest(repeat, [&] {
    for (int i = 0; i < kCalls; ++i)
      check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a,
                         CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c,
                         CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS,
            "cublasGemmEx");
    check(cudaDeviceSynchronize() == cudaSuccess, "the GEMMs");
  });
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * double(n) * kCalls / seconds / 1e12;
}

} // namespace

int main(int argc, char **argv) {
  std::string modelDir, out;
  int64_t tokens = 2048;
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvc-gpu-bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model")
      modelDir = value();
    else if (arg == "--tokens")
      tokens = std::stoll(value());
    else if (arg == "--repeat")
      repeat = std::stoi(value());
    else if (arg == "--out")
      out = value();
    else {
      std::fprintf(stderr, "usage: kvc-gpu-bench --model DIR [--tokens N] "
                           "[--repeat R] [--out FILE]\n");
      return 2;
    }
  }
  if (modelDir.empty() || tokens < 1 || repeat < 1) {
    std::fprintf(stderr, "kvc-gpu-bench: --model DIR is required; --tokens "
                         "and --repeat must be positive\n");
    return 2;
  }
  StatusOr<std::unique_ptr<Device>> created = createCudaDevice({});
  if (!created) {
    std::printf("skipped: %s\n", created.status().toString().c_str());
    return 77;
  }
  Device &backend = **created;
  StatusOr<std::unique_ptr<LlamaModel>> loaded = LlamaModel::load(modelDir);
  check(loaded.status());
  const LlamaModel &model = **loaded;
  const ModelConfig &c = model.config();
  if (tokens > c.maxPositions) {
    std::fprintf(stderr, "kvc-gpu-bench: %lld tokens exceed the model's %lld\n",
                 (long long)tokens, (long long)c.maxPositions);
    return 2;
  }
  const int64_t layers = c.numLayers, h = c.hiddenSize;

  // Upload: the backend's path against pinned cudaMemcpyAsync.
  StatusOr<double> uploadGBs = backend.uploadGBs();
  check(uploadGBs.status());
  const double pinnedGBs = pinnedCopyGBs(size_t(256) << 20, repeat);
  double pageableGBs = 0;
  {
    HostWords pageable; // The heap's.
    pageable.resize(size_t(128) << 20);
    std::unique_ptr<DeviceBuffer> into = backend.allocate();
    pageableGBs = double(pageable.size() * 2) / 1e9 / fastest(repeat, [&] {
                    check(backend.upload(pageable, false, *into));
                  });
  }
  const double peak = gemmTflops(8192, repeat);

  // Prefill of N tokens from position 0, every layer.
  PagedCacheConfig config{layers, c.numKvHeads,       c.headDim,
                          16,     (tokens + 15) / 16, 0};
  std::unique_ptr<ModelRunner> runner = backend.createRunner(model);
  StatusOr<std::unique_ptr<PagedKVCache>> cache = backend.createCache(config);
  check(cache.status());
  StatusOr<BlockTable> table = (*cache)->allocate(tokens);
  check(table.status());
  std::vector<int32_t> ids(tokens);
  std::mt19937 random(7);
  for (int32_t &id : ids)
    id = int32_t(random() % uint32_t(c.vocabSize));
  const double prefillSeconds = fastest(repeat, [&] {
    check(runner->prefillInto(**cache, *table, ids.data(), 0, tokens, layers));
    check(backend.settle(**cache));
  });
  // Causal attention: QK^T and PV over position + 1 keys for each query.
  const double attentionFlops = 4.0 * double(c.numHeads * c.headDim) *
                                double(tokens) * double(tokens + 1) / 2 *
                                double(layers);
  const double prefillFlops =
      model.prefillFlops(tokens, layers) + attentionFlops;

  // HCache's projection of the same tokens' hidden states, every layer.
  std::normal_distribution<float> normal;
  // In the device's host memory, where a restore decodes chunks.
  HostWords hidden(backend.hostMemory());
  hidden.resizeForOverwrite(size_t(layers * tokens * h));
  for (uint16_t &x : hidden)
    x = floatToBf16(normal(random));
  std::unique_ptr<DeviceBuffer> states = backend.allocate(),
                                kv = backend.allocate();
  const ChunkBox box{0, tokens, 0, layers};
  const double uploadSeconds =
      fastest(repeat, [&] { check(backend.upload(hidden, false, *states)); });
  const double projectSeconds = fastest(repeat, [&] {
    check(runner->project(*states, DType::BF16, box, *kv).status());
    check(backend.scatter(*kv, box, **cache, *table));
    check(backend.settle(**cache));
  });

  std::printf("kvc-gpu-bench: %s, %lld tokens, fastest of %d runs\n",
              modelDir.c_str(), (long long)tokens, repeat);
  std::printf("upload   backend %.2f GB/s (from pageable memory %.2f), "
              "pinned cudaMemcpyAsync %.2f GB/s: %.0f%% (%.0f%%)\n",
              *uploadGBs, pageableGBs, pinnedGBs, 100 * *uploadGBs / pinnedGBs,
              100 * pageableGBs / pinnedGBs);
  std::printf("gemm     cuBLAS bf16 8192^3: %.1f TFLOP/s\n", peak);
  std::printf("prefill  %.2f ms, %.1f TFLOP/s (%.1f of them attention's "
              "share), MFU %.0f%% of the GEMM rate\n",
              prefillSeconds * 1e3, prefillFlops / prefillSeconds / 1e12,
              attentionFlops / prefillSeconds / 1e12,
              100 * prefillFlops / prefillSeconds / 1e12 / peak);
  std::printf("project  %.2f ms (%.2f ms with the upload): %.1fx (%.1fx) "
              "faster per token than the prefill\n",
              projectSeconds * 1e3, (projectSeconds + uploadSeconds) * 1e3,
              prefillSeconds / projectSeconds,
              prefillSeconds / (projectSeconds + uploadSeconds));
  if (!out.empty()) {
    std::ofstream file(out);
    file << "{\"model\": \"" << modelDir << "\", \"tokens\": " << tokens
         << ", \"upload_gbs\": " << *uploadGBs
         << ", \"pageable_upload_gbs\": " << pageableGBs
         << ", \"pinned_copy_gbs\": " << pinnedGBs
         << ", \"gemm_tflops\": " << peak
         << ", \"prefill_seconds\": " << prefillSeconds
         << ", \"prefill_flops\": " << prefillFlops
         << ", \"project_seconds\": " << projectSeconds
         << ", \"hidden_upload_seconds\": " << uploadSeconds << "}\n";
    check(bool(file), "writing --out");
  }
  return 0;
}
