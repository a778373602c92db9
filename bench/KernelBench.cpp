//===- KernelBench.cpp - Generated kernels on a GPU -----------------------===//
//
// kvc-kernel-bench --bundle kernels.json [--iters N] [--out results.json]
//                  [--only REGEX]
//
// For every kernel of a plan bundle's kernel table (bench/kernels/
// gen-kernels.py makes one per kind, codec composition and chunk size):
// loads its PTX with the CUDA driver API and runs the check of
// KernelDevice.h on the GPU (a KernelCase: random KV encoded by the
// runtime's codecs, f32 projections and Llama 3.1's RoPE table, a filled
// cache to save from, or hidden states to normalize; a paged cache with a
// shuffled block table, a chunk starting mid-block, one layer of offset;
// every written value against the runtime's own code, bit for bit, and
// nothing else written; the unit tests run the same check in the PTX
// interpreter). Then times the kernel from a block-aligned start and prints
// its bandwidth (payload + cache rows) beside a device-to-device copy of
// the same bytes, measured in the same run. A restore kernel of a small
// chunk (under 256 tokens: launch-bound) is also checked and timed over 16
// chunks in one launch (its chunk table's records): the time per chunk
// there, beside a launch's of one chunk, is what batching small chunks
// saves. Larger chunks are not batched: a launch's cost is amortized there,
// and encoding 16 of them on the host for the check takes minutes. --only
// runs the kernels whose names REGEX matches (ECMAScript, anywhere in the
// name): a profiler's run of a few kernels.
//
// Exits 77 where no GPU is usable, 1 on any mismatch or CUDA error.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Cuda/CudaDriver.h"
#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Testing/KernelDevice.h"

#include <algorithm>
#include <cstdio>
#include <regex>
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

/// A CUDA event.
struct Event {
  CUevent event = nullptr;
  Event() { check(cu->cuEventCreate(&event, CU_EVENT_DEFAULT), "event"); }
  ~Event() { cu->cuEventDestroy(event); }
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
};

/// The GPU as the checks' device: one kernel's module, launched on a
/// stream (enqueue) or to completion (run).
class CudaDevice : public kvc::testing::KernelDevice {
public:
  explicit CudaDevice(const kvc::BundleKernel &kernel) : k(kernel) {
    check(cu->cuModuleLoadData(&module, k.binary.c_str()), "cuModuleLoadData");
    check(cu->cuModuleGetFunction(&fn, module, k.function.c_str()),
          "cuModuleGetFunction");
    check(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
  }
  ~CudaDevice() override {
    cu->cuStreamDestroy(stream);
    cu->cuModuleUnload(module);
  }
  kvc::StatusOr<uint64_t> allocate(size_t bytes) override {
    CUdeviceptr ptr = 0;
    KVC_RETURN_IF_ERROR(cu->check(cu->cuMemAlloc(&ptr, bytes), "cuMemAlloc"));
    return uint64_t(ptr);
  }
  void release(uint64_t address) override { cu->cuMemFree(address); }
  kvc::Status copyIn(uint64_t to, const void *from, size_t bytes) override {
    return cu->check(cu->cuMemcpyHtoD(to, from, bytes), "upload");
  }
  kvc::Status copyOut(void *to, uint64_t from, size_t bytes) override {
    return cu->check(cu->cuMemcpyDtoH(to, from, bytes), "download");
  }
  kvc::Status run(int64_t chunks, void **params) override {
    // The copies ran on the legacy stream, which a non-blocking stream
    // does not wait for.
    KVC_RETURN_IF_ERROR(cu->check(cu->cuCtxSynchronize(), "upload"));
    enqueue(chunks, params);
    return cu->check(cu->cuCtxSynchronize(), "kernel");
  }
  /// Launches the kernel over `chunks` chunks on the stream.
  void enqueue(int64_t chunks, void **params) {
    check(cu->cuLaunchKernel(fn, unsigned(k.grid[0]),
                             unsigned(k.grid[1] * chunks), unsigned(k.grid[2]),
                             unsigned(k.block[0]), unsigned(k.block[1]),
                             unsigned(k.block[2]), 0, stream, params, nullptr),
          "cuLaunchKernel");
  }
  CUstream stream = nullptr;

private:
  const kvc::BundleKernel &k;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
};

template <typename T> T orThrow(kvc::StatusOr<T> value) {
  if (!value)
    throw CudaError{value.status().message()};
  return std::move(*value);
}

void orThrow(const kvc::Status &status) {
  if (!status.isOk())
    throw CudaError{status.message()};
}

struct Result {
  std::string name;
  int64_t tokens = 0, layers = 0;
  kvc::testing::CacheErrors errors;
  double kernelUs = 0, copyUs = 0, bytes = 0;
  /// Restore kernels: microseconds per chunk in a launch of Bench::kBatch
  /// chunks (0: not measured).
  double batchedUs = 0;
};

class Bench {
public:
  Bench(const kvc::BundleKernel &kernel, int iters)
      : k(kernel), iters(iters), device(kernel) {}

  Result run() {
    using kvc::testing::CaseOnDevice;
    Result r;
    r.name = k.name;
    r.tokens = k.tokens;
    r.layers = k.layers;
    const kvc::testing::KernelCase c = orThrow(kvc::testing::caseFor(k));
    std::unique_ptr<CaseOnDevice> one =
        orThrow(CaseOnDevice::make(device, k, c));
    r.errors = orThrow(one->check());

    // Timing from a block-aligned start; the copy of the same bytes
    // (payload + cache rows written) between two buffers.
    if (!norm())
      orThrow(one->moveChunks(/*fromToken=*/0));
    std::vector<void *> params = orThrow(one->pointers());
    r.kernelUs = timeUs([&] { device.enqueue(1, params.data()); });
    const double rowBytes = 2.0 * k.layers * k.tokens * c.shape().width() * 2;
    // Bytes that must move: the payload, the RoPE rows of the chunk's
    // tokens, the cache rows written (or, saving, read); for RMSNorm the
    // hidden states, the chunk's layers' weights and the bf16 output.
    r.bytes = norm() ? double(c.payload().size()) + 4.0 * k.layers * k.hidden +
                           2.0 * double(c.normedValues())
                     : double(c.payload().size()) + rowBytes +
                           (rope() ? 4.0 * k.tokens * k.headDim : 0.0);
    // A copy moving the same bytes: half read, half written.
    size_t copyBytes = size_t(r.bytes / 2) & ~size_t(15);
    DeviceBuffer a(copyBytes), b(copyBytes);
    r.copyUs = timeUs([&] {
      check(cu->cuMemcpyDtoDAsync(b.ptr, a.ptr, copyBytes, device.stream),
            "copy");
    });

    // A small restore chunk's batch in one launch: checked, and timed per
    // chunk.
    if (k.kind == kvc::BundleKernel::Kind::Restore &&
        k.tokens < kBatchBelowTokens) {
      const kvc::testing::KernelCase batch =
          orThrow(kvc::testing::caseFor(k, kBatch));
      std::unique_ptr<CaseOnDevice> many =
          orThrow(CaseOnDevice::make(device, k, batch));
      kvc::testing::CacheErrors errors = orThrow(many->check());
      r.errors.mismatches += errors.mismatches;
      r.errors.unwritten += errors.unwritten;
      r.errors.clobbered += errors.clobbered;
      std::vector<void *> batched = orThrow(many->pointers());
      r.batchedUs =
          timeUs([&] { device.enqueue(kBatch, batched.data()); }) / kBatch;
    }
    return r;
  }

  /// Chunks of the batched launch each small restore chunk is timed in, and
  /// the chunk size from which a launch is not batched.
  static constexpr int64_t kBatch = 16, kBatchBelowTokens = 256;

private:
  bool rope() const { return k.kind == kvc::BundleKernel::Kind::RopeScatter; }
  bool norm() const { return k.kind == kvc::BundleKernel::Kind::RmsNorm; }

  /// Microseconds per call of `body`: events around `iters` calls, after a
  /// warm-up.
  template <typename Body> double timeUs(Body &&body) {
    for (int i = 0; i < 3; ++i)
      body();
    check(cu->cuEventRecord(start.event, device.stream), "record");
    for (int i = 0; i < iters; ++i)
      body();
    check(cu->cuEventRecord(stop.event, device.stream), "record");
    check(cu->cuEventSynchronize(stop.event), "sync");
    float ms = 0;
    check(cu->cuEventElapsedTime(&ms, start.event, stop.event), "elapsed");
    return 1000.0 * ms / iters;
  }

  const kvc::BundleKernel &k;
  int iters;
  CudaDevice device;
  Event start, stop;
};

} // namespace

int main(int argc, char **argv) {
  // Line by line, so that a run cut short still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string bundlePath, outPath, only;
  int iters = 200;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--bundle" && i + 1 < argc)
      bundlePath = argv[++i];
    else if (arg == "--out" && i + 1 < argc)
      outPath = argv[++i];
    else if (arg == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--only" && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr, "usage: kvc-kernel-bench --bundle F [--iters N] "
                           "[--out F] [--only REGEX]\n");
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
  std::vector<kvc::BundleKernel> kernels;
  try {
    const std::regex selected(only);
    for (const kvc::BundleKernel &kernel : bundle->kernels)
      if (std::regex_search(kernel.name, selected))
        kernels.push_back(kernel);
  } catch (const std::regex_error &e) {
    std::fprintf(stderr, "kvc-kernel-bench: --only %s: %s\n", only.c_str(),
                 e.what());
    return 2;
  }
  if (kernels.empty()) {
    if (only.empty())
      std::fprintf(stderr, "kvc-kernel-bench: %s has no kernels\n",
                   bundlePath.c_str());
    else
      std::fprintf(stderr, "kvc-kernel-bench: no kernel of %s matches \"%s\"\n",
                   bundlePath.c_str(), only.c_str());
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
    std::printf("%-52s %6s %9s %9s %9s %9s %6s %10s  %s\n", "kernel", "tokens",
                "MB", "us", "GB/s", "copy GB/s", "ratio", "us/chunk16",
                "check");
    if (out)
      std::fprintf(out, "[\n");
    for (size_t i = 0; i < kernels.size(); ++i) {
      Result r = Bench(kernels[i], iters).run();
      bool ok = r.errors.ok();
      failures += !ok;
      double gbps = r.bytes / r.kernelUs / 1e3, copy = r.bytes / r.copyUs / 1e3;
      char batched[16] = "-";
      if (r.batchedUs > 0)
        std::snprintf(batched, sizeof(batched), "%.2f", r.batchedUs);
      std::printf("%-52s %6lld %9.2f %9.2f %9.1f %9.1f %5.0f%% %10s  %s\n",
                  r.name.c_str(), (long long)r.tokens, r.bytes / 1e6,
                  r.kernelUs, gbps, copy, 100 * gbps / copy, batched,
                  ok ? "bit-exact" : ("FAIL " + r.errors.str()).c_str());
      if (out)
        std::fprintf(
            out,
            " {\"kernel\": \"%s\", \"tokens\": %lld, \"layers\": "
            "%lld, \"bytes\": %.0f, \"kernel_us\": %.3f, "
            "\"copy_us\": %.3f, \"batched_us_per_chunk\": %.3f, "
            "\"mismatches\": %lld, "
            "\"unwritten\": %lld, \"clobbered\": %lld}%s\n",
            r.name.c_str(), (long long)r.tokens, (long long)r.layers, r.bytes,
            r.kernelUs, r.copyUs, r.batchedUs, (long long)r.errors.mismatches,
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
