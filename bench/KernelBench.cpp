//===- KernelBench.cpp - Generated kernels on a GPU -----------------------===//
//
// kvc-kernel-bench --bundle kernels.json [--iters N] [--out results.json]
//
// For every kernel of a plan bundle's kernel table (bench/kernels/
// gen-kernels.py makes one per kind, codec composition and chunk size):
// loads its PTX with the CUDA driver API, launches it on a KernelCase
// (KernelCase.h: random KV encoded by the runtime's codecs, f32 projections
// and Llama 3.1's RoPE table, a filled cache to save from, or hidden states
// to normalize; a paged cache
// with a shuffled block table, a chunk starting mid-block, one layer of
// offset), which checks every written value against the runtime's own code
// bit for bit and that nothing else was written; the host JIT test shares
// it. Then times the kernel from a block-aligned start and prints its
// bandwidth (payload + cache rows) beside a device-to-device copy of the
// same bytes, measured in the same run.
//
// Exits 77 where no GPU is usable, 1 on any mismatch or CUDA error.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Cuda/CudaDriver.h"
#include "kvc/Runtime/Exec/KernelAbi.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Testing/KernelCase.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct CudaError {
  std::string what;
};

/// The driver, loaded by main() before any other use.
const kvc::CudaDriver *cu = nullptr;

void check(CUresult result, const char *what) {
  kvc::Status status = cu->check(result, what);
  if (!status.isOk())
    throw CudaError{status.message()};
}

/// A device buffer.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    check(cu->cuMemAlloc(&ptr, std::max<size_t>(n, 16)), "cuMemAlloc");
  }
  ~DeviceBuffer() {
    if (ptr)
      cu->cuMemFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
};

kvc::DType dtypeOf(const std::string &name) {
  return name == "f32"   ? kvc::DType::F32
         : name == "f16" ? kvc::DType::F16
                         : kvc::DType::BF16;
}

struct Result {
  std::string name;
  int64_t tokens = 0, layers = 0;
  kvc::testing::CacheErrors errors;
  double kernelUs = 0, copyUs = 0, bytes = 0;
};

class Bench {
public:
  Bench(const kvc::BundleKernel &kernel, int iters) : k(kernel), iters(iters) {}

  Result run() {
    Result r;
    r.name = k.name;
    r.tokens = k.tokens;
    r.layers = k.layers;
    CUmodule module;
    check(cu->cuModuleLoadData(&module, k.ptx.c_str()), "cuModuleLoadData");
    CUfunction fn;
    check(cu->cuModuleGetFunction(&fn, module, k.function.c_str()),
          "cuModuleGetFunction");

    kvc::testing::KernelShape shape;
    shape.tokens = k.tokens;
    shape.layers = k.layers;
    shape.kvHeads = k.kvHeads;
    shape.headDim = k.headDim;
    shape.blockSize = k.blockSize;
    shape.codec = k.codec;
    shape.storage = dtypeOf(k.storage);
    shape.hidden = k.hidden;
    shape.eps = float(k.eps);
    using kvc::testing::KernelCase;
    const bool rope = k.kind == kvc::BundleKernel::Kind::RopeScatter;
    const bool save = k.kind == kvc::BundleKernel::Kind::Save;
    const bool norm = k.kind == kvc::BundleKernel::Kind::RmsNorm;
    const uint32_t seed = uint32_t(k.tokens * 131 + k.layers);
    kvc::StatusOr<KernelCase> made =
        rope   ? KernelCase::makeRopeScatter(shape, /*firstToken=*/5,
                                             /*firstLayer=*/1, seed)
        : save ? KernelCase::makeSave(shape, /*firstToken=*/5,
                                      /*firstLayer=*/1, seed)
        : norm
            ? KernelCase::makeRmsNorm(shape, /*firstLayer=*/1, seed)
            : KernelCase::make(shape, /*firstToken=*/5, /*firstLayer=*/1, seed);
    if (!made)
      throw CudaError{"case: " + made.status().message()};
    const KernelCase &c = *made;
    const std::string &payload = c.payload();
    if (int64_t(payload.size()) != k.payloadBytes)
      throw CudaError{"payload of " + std::to_string(payload.size()) +
                      " bytes, the kernel expects " +
                      std::to_string(k.payloadBytes)};
    const std::vector<int32_t> &table = c.blockTable();
    const int64_t cacheValues = c.cacheValues();

    const std::vector<float> &ropeTable = c.ropeTable();
    const std::vector<float> &weights = c.normWeights();
    DeviceBuffer dPayload(payload.size()), dTable(table.size() * 4),
        dKeys(cacheValues * 2), dValues(cacheValues * 2),
        dRope(ropeTable.size() * 4), dWeights(weights.size() * 4),
        dNormed(c.normedValues() * 2);
    if (rope)
      check(cu->cuMemcpyHtoD(dRope.ptr, ropeTable.data(), ropeTable.size() * 4),
            "upload RoPE table");
    if (norm) {
      check(cu->cuMemcpyHtoD(dWeights.ptr, weights.data(), weights.size() * 4),
            "upload weights");
      check(cu->cuMemsetD16(dNormed.ptr, KernelCase::kPoison, c.normedValues()),
            "poison");
    }
    check(cu->cuMemcpyHtoD(dTable.ptr, table.data(), table.size() * 4),
          "upload table");
    // A save kernel reads a filled cache and writes a poisoned payload; the
    // others the other way round.
    std::vector<uint16_t> keys(cacheValues), vals(cacheValues);
    if (save) {
      c.fillCache(keys.data(), vals.data());
      check(cu->cuMemcpyHtoD(dKeys.ptr, keys.data(), cacheValues * 2),
            "upload keys");
      check(cu->cuMemcpyHtoD(dValues.ptr, vals.data(), cacheValues * 2),
            "upload values");
      check(cu->cuMemsetD8(dPayload.ptr, 0xA5, payload.size()), "poison");
    } else {
      check(cu->cuMemcpyHtoD(dPayload.ptr, payload.data(), payload.size()),
            "upload payload");
      check(cu->cuMemsetD16(dKeys.ptr, KernelCase::kPoison, cacheValues),
            "poison");
      check(cu->cuMemsetD16(dValues.ptr, KernelCase::kPoison, cacheValues),
            "poison");
    }

    kvc::KernelParams params;
    const void *payloadAt = reinterpret_cast<const void *>(dPayload.ptr);
    auto at = [](const DeviceBuffer &b) {
      return reinterpret_cast<const void *>(b.ptr);
    };
    params.buffer("payload", payloadAt, int64_t(payload.size()));
    params.buffer("hidden", payloadAt, int64_t(payload.size()));
    params.buffer("key_cache", at(dKeys), cacheValues * 2);
    params.buffer("value_cache", at(dValues), cacheValues * 2);
    params.buffer("block_table", at(dTable), int64_t(table.size()));
    params.buffer("rope_table", at(dRope), int64_t(ropeTable.size() * 4));
    params.buffer("norm_weights", at(dWeights), int64_t(weights.size() * 4));
    params.buffer("normed", at(dNormed), c.normedValues() * 2);
    params.scalar("first_layer", c.firstLayer());
    params.scalar("layer_rows", c.layerRows());
    auto launch = [&](int64_t first, CUstream stream) {
      params.scalar("first_token", first);
      kvc::StatusOr<std::vector<void *>> pointers = params.pointers(k);
      if (!pointers)
        throw CudaError{pointers.status().message()};
      check(cu->cuLaunchKernel(fn, unsigned(k.grid[0]), unsigned(k.grid[1]),
                               unsigned(k.grid[2]), unsigned(k.block[0]),
                               unsigned(k.block[1]), unsigned(k.block[2]), 0,
                               stream, pointers->data(), nullptr),
            "cuLaunchKernel");
    };

    // Correctness.
    launch(c.firstToken(), nullptr);
    check(cu->cuCtxSynchronize(), "kernel");
    check(cu->cuMemcpyDtoH(keys.data(), dKeys.ptr, cacheValues * 2),
          "download");
    check(cu->cuMemcpyDtoH(vals.data(), dValues.ptr, cacheValues * 2),
          "download");
    std::string written(payload.size(), '\0');
    check(cu->cuMemcpyDtoH(written.data(), dPayload.ptr, payload.size()),
          "download");
    if (norm) {
      std::vector<uint16_t> normed(c.normedValues());
      check(cu->cuMemcpyDtoH(normed.data(), dNormed.ptr, normed.size() * 2),
            "download");
      r.errors = c.checkNormed(normed.data());
    } else {
      r.errors = c.check(keys.data(), vals.data(),
                         reinterpret_cast<const uint8_t *>(written.data()));
    }

    // Timing: events around `iters` launches, after a warm-up; the copy of
    // the same bytes (payload + cache rows written) between two buffers.
    CUstream stream;
    check(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
    CUevent start, stop;
    check(cu->cuEventCreate(&start, CU_EVENT_DEFAULT), "event");
    check(cu->cuEventCreate(&stop, CU_EVENT_DEFAULT), "event");
    auto timeUs = [&](auto &&body) {
      for (int i = 0; i < 3; ++i)
        body();
      check(cu->cuEventRecord(start, stream), "record");
      for (int i = 0; i < iters; ++i)
        body();
      check(cu->cuEventRecord(stop, stream), "record");
      check(cu->cuEventSynchronize(stop), "sync");
      float ms = 0;
      check(cu->cuEventElapsedTime(&ms, start, stop), "elapsed");
      return 1000.0 * ms / iters;
    };
    r.kernelUs = timeUs([&] { launch(0, stream); });
    const double rowBytes = 2.0 * k.layers * k.tokens * shape.width() * 2;
    // Bytes that must move: the payload, the RoPE rows of the chunk's
    // tokens, the cache rows written (or, saving, read); for RMSNorm the
    // hidden states, the chunk's layers' weights and the bf16 output.
    r.bytes = norm ? double(payload.size()) + 4.0 * k.layers * k.hidden +
                         2.0 * double(c.normedValues())
                   : double(payload.size()) + rowBytes +
                         (rope ? 4.0 * k.tokens * k.headDim : 0.0);
    // A copy moving the same bytes: half read, half written.
    size_t copyBytes = size_t(r.bytes / 2) & ~size_t(15);
    DeviceBuffer a(copyBytes), b(copyBytes);
    r.copyUs = timeUs([&] {
      check(cu->cuMemcpyDtoDAsync(b.ptr, a.ptr, copyBytes, stream), "copy");
    });
    cu->cuEventDestroy(start);
    cu->cuEventDestroy(stop);
    cu->cuStreamDestroy(stream);
    cu->cuModuleUnload(module);
    return r;
  }

private:
  const kvc::BundleKernel &k;
  int iters;
};

} // namespace

int main(int argc, char **argv) {
  // Line by line, so that a run cut short still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
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
      std::fprintf(
          stderr, "usage: kvc-kernel-bench --bundle F [--iters N] [--out F]\n");
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
  kvc::StatusOr<const kvc::CudaDriver *> driver = kvc::CudaDriver::get();
  int devices = 0;
  if (driver)
    cu = *driver;
  if (!driver || cu->cuDeviceGetCount(&devices) != CUDA_SUCCESS ||
      devices == 0) {
    std::printf("kvc-kernel-bench: no GPU (%s); skipped\n",
                driver ? "no device" : driver.status().message().c_str());
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
    check(cu->cuDeviceGet(&device, 0), "cuDeviceGet");
    char name[256];
    check(cu->cuDeviceGetName(name, sizeof(name), device), "cuDeviceGetName");
    CUcontext context;
    check(cu->cuDevicePrimaryCtxRetain(&context, device), "context");
    check(cu->cuCtxSetCurrent(context), "context");
    std::printf("device: %s, %d iterations per timing\n", name, iters);
    std::printf("%-52s %6s %9s %9s %9s %9s %6s  %s\n", "kernel", "tokens", "MB",
                "us", "GB/s", "copy GB/s", "ratio", "check");
    if (out)
      std::fprintf(out, "[\n");
    for (size_t i = 0; i < kernels.size(); ++i) {
      Result r = Bench(kernels[i], iters).run();
      bool ok = r.errors.ok();
      failures += !ok;
      double gbps = r.bytes / r.kernelUs / 1e3, copy = r.bytes / r.copyUs / 1e3;
      std::printf("%-52s %6lld %9.2f %9.2f %9.1f %9.1f %5.0f%%  %s\n",
                  r.name.c_str(), (long long)r.tokens, r.bytes / 1e6,
                  r.kernelUs, gbps, copy, 100 * gbps / copy,
                  ok ? "bit-exact" : ("FAIL " + r.errors.str()).c_str());
      if (out)
        std::fprintf(
            out,
            " {\"kernel\": \"%s\", \"tokens\": %lld, \"layers\": "
            "%lld, \"bytes\": %.0f, \"kernel_us\": %.3f, "
            "\"copy_us\": %.3f, \"mismatches\": %lld, "
            "\"unwritten\": %lld, \"clobbered\": %lld}%s\n",
            r.name.c_str(), (long long)r.tokens, (long long)r.layers, r.bytes,
            r.kernelUs, r.copyUs, (long long)r.errors.mismatches,
            (long long)r.errors.unwritten, (long long)r.errors.clobbered,
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
