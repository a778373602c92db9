//===- KernelBench.cpp - Generated restore kernels on a GPU ---------------===//
//
// kvc-kernel-bench --bundle kernels.json [--iters N] [--out results.json]
//
// For every kernel of a plan bundle's kernel table (bench/kernels/
// gen-kernels.py makes one per codec composition and chunk size): loads its
// PTX with the CUDA driver API, encodes random KV with the runtime's codecs,
// launches the kernel into a paged cache (a shuffled block table, a chunk
// starting mid-block, one layer of offset) and checks every written value
// against the runtime's own decoder (decodeChunkToBf16), bit for bit, and
// that nothing else was written. Then times it from a block-aligned start
// and prints its bandwidth (payload read + cache written) beside a
// device-to-device copy of the same bytes, measured in the same run.
//
// Exits 77 where no GPU is usable, 1 on any mismatch or CUDA error.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Exec/PlanBundle.h"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

struct CudaError {
  std::string what;
};

void check(CUresult result, const char *what) {
  if (result != CUDA_SUCCESS) {
    const char *name = nullptr;
    cuGetErrorName(result, &name);
    throw CudaError{std::string(what) + ": " + (name ? name : "?")};
  }
}

/// A device buffer.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    check(cuMemAlloc(&ptr, std::max<size_t>(n, 16)), "cuMemAlloc");
  }
  ~DeviceBuffer() {
    if (ptr)
      cuMemFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
};

/// The five values of a 1-D MLIR memref descriptor.
struct Memref {
  CUdeviceptr allocated, aligned;
  int64_t offset, size, stride;
};

kvc::DType dtypeOf(const std::string &name) {
  return name == "f32" ? kvc::DType::F32
         : name == "f16" ? kvc::DType::F16
                         : kvc::DType::BF16;
}

struct Result {
  std::string name;
  int64_t tokens = 0, layers = 0;
  int64_t mismatches = 0, unwritten = 0, clobbered = 0;
  double kernelUs = 0, copyUs = 0, bytes = 0;
};

class Bench {
public:
  Bench(const kvc::BundleKernel &kernel, int iters)
      : k(kernel), iters(iters) {}

  Result run() {
    Result r;
    r.name = k.name;
    r.tokens = k.tokens;
    r.layers = k.layers;
    CUmodule module;
    check(cuModuleLoadData(&module, k.ptx.c_str()), "cuModuleLoadData");
    CUfunction fn;
    check(cuModuleGetFunction(&fn, module, k.function.c_str()),
          "cuModuleGetFunction");

    const int64_t width = k.kvHeads * k.headDim;
    kvc::ChunkShape shape;
    shape.form = kvc::ChunkForm::KV;
    shape.tokens = k.tokens;
    shape.layers = k.layers;
    shape.width = width;
    shape.headDim = k.headDim;
    shape.modelLayers = k.layers;
    // Keys with per-channel outliers, values around zero: KIVI's setting.
    std::mt19937 rng(uint32_t(k.tokens * 131 + k.layers));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(shape.numel());
    for (int64_t i = 0; i < shape.numel(); ++i) {
      int64_t channel = i % width;
      values[i] = normal(rng) * (channel % 37 == 0 ? 8.0f : 1.0f);
    }
    kvc::DType storage = dtypeOf(k.storage);
    kvc::StatusOr<std::string> payload =
        kvc::encodeChunk(values.data(), shape, k.codec, storage);
    if (!payload)
      throw CudaError{"encode: " + payload.status().message()};
    if (int64_t(payload->size()) != k.payloadBytes)
      throw CudaError{"payload of " + std::to_string(payload->size()) +
                      " bytes, the kernel expects " +
                      std::to_string(k.payloadBytes)};
    std::vector<uint16_t> expected(shape.numel());
    kvc::Status decoded = kvc::decodeChunkToBf16(*payload, shape, k.codec,
                                                 storage, expected.data());
    if (!decoded.isOk())
      throw CudaError{"decode: " + decoded.message()};

    // The cache: one layer more than the chunk, first_token mid-block, a
    // shuffled block table with spare blocks nothing should touch.
    const int64_t B = k.blockSize, firstToken = 5, firstLayer = 1;
    const int64_t tableBlocks = (firstToken + k.tokens + B - 1) / B;
    const int64_t numBlocks = 2 * tableBlocks + 3;
    std::vector<int32_t> blocks(numBlocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::vector<int32_t> table(blocks.begin(), blocks.begin() + tableBlocks);
    const int64_t layerRows = numBlocks * B;
    const int64_t cacheValues = (k.layers + firstLayer) * layerRows * width;

    DeviceBuffer dPayload(payload->size()), dTable(table.size() * 4),
        dKeys(cacheValues * 2), dValues(cacheValues * 2);
    check(cuMemcpyHtoD(dPayload.ptr, payload->data(), payload->size()),
          "upload payload");
    check(cuMemcpyHtoD(dTable.ptr, table.data(), table.size() * 4),
          "upload table");
    const uint16_t poison = 0x7FC1; // A NaN the kernel never writes.
    check(cuMemsetD16(dKeys.ptr, poison, cacheValues), "poison");
    check(cuMemsetD16(dValues.ptr, poison, cacheValues), "poison");

    auto launch = [&](int64_t first, CUstream stream) {
      Memref payloadRef{dPayload.ptr, dPayload.ptr, 0,
                        int64_t(payload->size()), 1};
      Memref keyRef{dKeys.ptr, dKeys.ptr, 0, cacheValues * 2, 1};
      Memref valueRef{dValues.ptr, dValues.ptr, 0, cacheValues * 2, 1};
      Memref tableRef{dTable.ptr, dTable.ptr, 0, int64_t(table.size()), 1};
      int64_t scalars[3] = {first, firstLayer, layerRows};
      std::vector<void *> params;
      auto addMemref = [&](Memref &m) {
        params.push_back(&m.allocated);
        params.push_back(&m.aligned);
        params.push_back(&m.offset);
        params.push_back(&m.size);
        params.push_back(&m.stride);
      };
      for (const std::string &arg : k.args) {
        if (arg == "payload")
          addMemref(payloadRef);
        else if (arg == "key_cache")
          addMemref(keyRef);
        else if (arg == "value_cache")
          addMemref(valueRef);
        else if (arg == "block_table")
          addMemref(tableRef);
        else if (arg == "first_token")
          params.push_back(&scalars[0]);
        else if (arg == "first_layer")
          params.push_back(&scalars[1]);
        else
          params.push_back(&scalars[2]);
      }
      check(cuLaunchKernel(fn, unsigned(k.grid[0]), unsigned(k.grid[1]),
                           unsigned(k.grid[2]), unsigned(k.block[0]),
                           unsigned(k.block[1]), unsigned(k.block[2]), 0,
                           stream, params.data(), nullptr),
            "cuLaunchKernel");
    };

    // Correctness.
    launch(firstToken, nullptr);
    check(cuCtxSynchronize(), "kernel");
    std::vector<uint16_t> keys(cacheValues), vals(cacheValues);
    check(cuMemcpyDtoH(keys.data(), dKeys.ptr, cacheValues * 2), "download");
    check(cuMemcpyDtoH(vals.data(), dValues.ptr, cacheValues * 2),
          "download");
    std::vector<char> written(cacheValues / width, 0);
    for (int64_t l = 0; l < k.layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t t = 0; t < k.tokens; ++t) {
          int64_t position = firstToken + t;
          int64_t row = (firstLayer + l) * layerRows +
                        int64_t(table[position / B]) * B + position % B;
          written[row] = 1;
          const uint16_t *got = (kv ? vals.data() : keys.data()) + row * width;
          const uint16_t *want =
              expected.data() + ((2 * l + kv) * k.tokens + t) * width;
          for (int64_t c = 0; c < width; ++c) {
            if (got[c] == poison && want[c] != poison)
              ++r.unwritten;
            else if (got[c] != want[c])
              ++r.mismatches;
          }
        }
    for (int64_t row = 0; row < int64_t(written.size()); ++row)
      if (!written[row])
        for (int64_t c = 0; c < width; ++c)
          r.clobbered += (keys[row * width + c] != poison) +
                         (vals[row * width + c] != poison);

    // Timing: events around `iters` launches, after a warm-up; the copy of
    // the same bytes (payload + cache rows written) between two buffers.
    CUstream stream;
    check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
    CUevent start, stop;
    check(cuEventCreate(&start, CU_EVENT_DEFAULT), "event");
    check(cuEventCreate(&stop, CU_EVENT_DEFAULT), "event");
    auto timeUs = [&](auto &&body) {
      for (int i = 0; i < 3; ++i)
        body();
      check(cuEventRecord(start, stream), "record");
      for (int i = 0; i < iters; ++i)
        body();
      check(cuEventRecord(stop, stream), "record");
      check(cuEventSynchronize(stop), "sync");
      float ms = 0;
      check(cuEventElapsedTime(&ms, start, stop), "elapsed");
      return 1000.0 * ms / iters;
    };
    r.kernelUs = timeUs([&] { launch(0, stream); });
    const double written_bytes = 2.0 * k.layers * k.tokens * width * 2;
    r.bytes = double(payload->size()) + written_bytes;
    // A copy moving the same bytes: half read, half written.
    size_t copyBytes = size_t(r.bytes / 2) & ~size_t(15);
    DeviceBuffer a(copyBytes), b(copyBytes);
    r.copyUs = timeUs([&] {
      check(cuMemcpyDtoDAsync(b.ptr, a.ptr, copyBytes, stream), "copy");
    });
    cuEventDestroy(start);
    cuEventDestroy(stop);
    cuStreamDestroy(stream);
    cuModuleUnload(module);
    return r;
  }

private:
  const kvc::BundleKernel &k;
  int iters;
};

} // namespace

int main(int argc, char **argv) {
  std::string bundlePath, outPath;
  int iters = 200;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--bundle" && i + 1 < argc)
      bundlePath = argv[++i];
    else if (arg == "--out" && i + 1 < argc)
      outPath = argv[++i];
    else if (arg == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: kvc-kernel-bench --bundle F [--iters N] [--out F]\n");
      return 2;
    }
  }
  if (bundlePath.empty()) {
    std::fprintf(stderr, "kvc-kernel-bench: --bundle is required\n");
    return 2;
  }
  kvc::StatusOr<kvc::PlanBundle> bundle = kvc::readPlanBundle(bundlePath);
  if (!bundle) {
    std::fprintf(stderr, "kvc-kernel-bench: %s\n",
                 bundle.status().message().c_str());
    return 1;
  }
  int devices = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&devices) != CUDA_SUCCESS ||
      devices == 0) {
    std::printf("kvc-kernel-bench: no GPU; skipped\n");
    return 77;
  }
  std::vector<kvc::BundleKernel> kernels = bundle->kernels;
  std::sort(kernels.begin(), kernels.end(), [](const auto &a, const auto &b) {
    return std::make_pair(a.tokens, a.name) < std::make_pair(b.tokens, b.name);
  });
  int failures = 0;
  FILE *out = outPath.empty() ? nullptr : std::fopen(outPath.c_str(), "w");
  try {
    CUdevice device;
    check(cuDeviceGet(&device, 0), "cuDeviceGet");
    char name[256];
    check(cuDeviceGetName(name, sizeof(name), device), "cuDeviceGetName");
    CUcontext context;
    check(cuDevicePrimaryCtxRetain(&context, device), "context");
    check(cuCtxSetCurrent(context), "context");
    std::printf("device: %s, %d iterations per timing\n", name, iters);
    std::printf("%-52s %6s %9s %9s %9s %9s %6s  %s\n", "kernel", "tokens",
                "MB", "us", "GB/s", "copy GB/s", "ratio", "check");
    if (out)
      std::fprintf(out, "[\n");
    for (size_t i = 0; i < kernels.size(); ++i) {
      Result r = Bench(kernels[i], iters).run();
      bool ok = !r.mismatches && !r.unwritten && !r.clobbered;
      failures += !ok;
      double gbps = r.bytes / r.kernelUs / 1e3, copy = r.bytes / r.copyUs / 1e3;
      std::printf("%-52s %6lld %9.2f %9.2f %9.1f %9.1f %5.0f%%  %s\n",
                  r.name.c_str(), (long long)r.tokens, r.bytes / 1e6,
                  r.kernelUs, gbps, copy, 100 * gbps / copy,
                  ok ? "bit-exact"
                     : ("FAIL " + std::to_string(r.mismatches) + " wrong, " +
                        std::to_string(r.unwritten) + " unwritten, " +
                        std::to_string(r.clobbered) + " clobbered")
                           .c_str());
      if (out)
        std::fprintf(out,
                     " {\"kernel\": \"%s\", \"tokens\": %lld, \"layers\": "
                     "%lld, \"bytes\": %.0f, \"kernel_us\": %.3f, "
                     "\"copy_us\": %.3f, \"mismatches\": %lld, "
                     "\"unwritten\": %lld, \"clobbered\": %lld}%s\n",
                     r.name.c_str(), (long long)r.tokens, (long long)r.layers,
                     r.bytes, r.kernelUs, r.copyUs, (long long)r.mismatches,
                     (long long)r.unwritten, (long long)r.clobbered,
                     i + 1 < kernels.size() ? "," : "");
    }
    if (out)
      std::fprintf(out, "]\n");
  } catch (const CudaError &e) {
    std::fprintf(stderr, "kvc-kernel-bench: %s\n", e.what.c_str());
    return 1;
  }
  if (out)
    std::fclose(out);
  std::printf("%zu kernels, %d failed\n", kernels.size(), failures);
  return failures ? 1 : 0;
}
