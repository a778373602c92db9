//===- KernelBench.cpp - Generated kernels on a GPU -----------------------===//
//
// kvc-kernel-bench --bundle kernels.json [--iters N] [--out results.json]
//                  [--only REGEX]
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
// same bytes, measured in the same run. A restore kernel is also checked
// and timed over 16 chunks in one launch (its chunk table's records): the
// time per chunk there, beside a launch's of one chunk, is what batching
// small chunks saves. --only runs the kernels whose names REGEX matches
// (ECMAScript, anywhere in the name): a profiler's run of a few kernels.
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
  /// Restore kernels: microseconds per chunk in a launch of Bench::kBatch
  /// chunks (0: not measured).
  double batchedUs = 0;
};

class Bench {
public:
  Bench(const kvc::BundleKernel &kernel, int iters) : k(kernel), iters(iters) {}

  Result run() {
    Result r;
    r.name = k.name;
    r.tokens = k.tokens;
    r.layers = k.layers;
    check(cu->cuModuleLoadData(&module, k.ptx.c_str()), "cuModuleLoadData");
    check(cu->cuModuleGetFunction(&fn, module, k.function.c_str()),
          "cuModuleGetFunction");
    check(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
    check(cu->cuEventCreate(&start, CU_EVENT_DEFAULT), "event");
    check(cu->cuEventCreate(&stop, CU_EVENT_DEFAULT), "event");

    shape.tokens = k.tokens;
    shape.layers = k.layers;
    shape.kvHeads = k.kvHeads;
    shape.headDim = k.headDim;
    shape.blockSize = k.blockSize;
    shape.codec = k.codec;
    shape.storage = dtypeOf(k.storage);
    shape.hidden = k.hidden;
    shape.eps = float(k.eps);
    const KernelCase c = makeCase(1);
    if (int64_t(c.payload().size()) != k.payloadBytes)
      throw CudaError{"payload of " + std::to_string(c.payload().size()) +
                      " bytes, the kernel expects " +
                      std::to_string(k.payloadBytes)};
    OnDevice one(c, norm());
    r.errors = launchAndCheck(one, c);

    // Timing from a block-aligned start; the copy of the same bytes
    // (payload + cache rows written) between two buffers.
    if (!norm())
      one.records(c, /*fromToken=*/0);
    r.kernelUs = timeUs([&] { launch(one, 1); });
    const double rowBytes = 2.0 * k.layers * k.tokens * shape.width() * 2;
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
      check(cu->cuMemcpyDtoDAsync(b.ptr, a.ptr, copyBytes, stream), "copy");
    });

    // A restore kernel's chunks of one launch: checked, and timed per chunk.
    if (k.kind == kvc::BundleKernel::Kind::Restore) {
      const KernelCase batch = makeCase(kBatch);
      OnDevice many(batch, false);
      kvc::testing::CacheErrors errors = launchAndCheck(many, batch);
      r.errors.mismatches += errors.mismatches;
      r.errors.unwritten += errors.unwritten;
      r.errors.clobbered += errors.clobbered;
      r.batchedUs = timeUs([&] { launch(many, kBatch); }) / kBatch;
    }
    cu->cuEventDestroy(start);
    cu->cuEventDestroy(stop);
    cu->cuStreamDestroy(stream);
    cu->cuModuleUnload(module);
    return r;
  }

  /// Chunks of the batched launch each restore kernel is timed in.
  static constexpr int64_t kBatch = 16;

private:
  using KernelCase = kvc::testing::KernelCase;

  bool rope() const { return k.kind == kvc::BundleKernel::Kind::RopeScatter; }
  bool save() const { return k.kind == kvc::BundleKernel::Kind::Save; }
  bool norm() const { return k.kind == kvc::BundleKernel::Kind::RmsNorm; }

  KernelCase makeCase(int64_t chunks) const {
    const uint32_t seed = uint32_t(k.tokens * 131 + k.layers);
    kvc::StatusOr<KernelCase> made =
        rope()   ? KernelCase::makeRopeScatter(shape, /*firstToken=*/5,
                                               /*firstLayer=*/1, seed)
        : save() ? KernelCase::makeSave(shape, /*firstToken=*/5,
                                        /*firstLayer=*/1, seed)
        : norm() ? KernelCase::makeRmsNorm(shape, /*firstLayer=*/1, seed)
                 : KernelCase::make(shape, /*firstToken=*/5, /*firstLayer=*/1,
                                    seed, chunks);
    if (!made)
      throw CudaError{"case: " + made.status().message()};
    return std::move(*made);
  }

  /// A case's buffers on the device and the kernel's parameters over them.
  struct OnDevice {
    OnDevice(const KernelCase &c, bool norm)
        : payload(c.payload().size()), table(c.blockTable().size() * 4),
          chunks(c.chunks().size() * sizeof(kvc::KernelChunk)),
          keys(c.cacheValues() * 2), values(c.cacheValues() * 2),
          rope(c.ropeTable().size() * 4), weights(c.normWeights().size() * 4),
          normed(c.normedValues() * 2), cacheValues(c.cacheValues()) {
      auto at = [](const DeviceBuffer &b) {
        return reinterpret_cast<const void *>(b.ptr);
      };
      const int64_t bytes = int64_t(c.payload().size());
      params.buffer("payload", at(payload), bytes);
      params.buffer("hidden", at(payload), bytes);
      params.buffer("key_cache", at(keys), cacheValues * 2);
      params.buffer("value_cache", at(values), cacheValues * 2);
      params.buffer("block_table", at(table), int64_t(c.blockTable().size()));
      params.buffer("chunks", at(chunks), 3 * int64_t(c.chunks().size()));
      params.buffer("rope_table", at(rope), int64_t(c.ropeTable().size() * 4));
      params.buffer("norm_weights", at(weights),
                    int64_t(c.normWeights().size() * 4));
      params.buffer("normed", at(normed), c.normedValues() * 2);
      params.scalar("first_layer", c.firstLayer());
      params.scalar("layer_rows", c.layerRows());
      upload(rope, c.ropeTable().data());
      upload(weights, c.normWeights().data());
      upload(table, c.blockTable().data());
      if (!norm)
        records(c, -1);
    }
    /// Uploads the case's chunk table, every chunk moved to `fromToken`
    /// when it is not negative.
    void records(const KernelCase &c, int64_t fromToken) {
      std::vector<kvc::KernelChunk> moved = c.chunks();
      for (kvc::KernelChunk &chunk : moved)
        if (fromToken >= 0)
          chunk.firstToken = fromToken;
      upload(chunks, moved.data());
    }
    static void upload(const DeviceBuffer &to, const void *from) {
      if (to.bytes)
        check(cu->cuMemcpyHtoD(to.ptr, from, to.bytes), "upload");
    }
    DeviceBuffer payload, table, chunks, keys, values, rope, weights, normed;
    int64_t cacheValues;
    kvc::KernelParams params;
  };

  /// Launches the kernel over `chunks` chunks of `d` on the stream.
  void launch(OnDevice &d, int64_t chunks) {
    kvc::StatusOr<std::vector<void *>> pointers = d.params.pointers(k);
    if (!pointers)
      throw CudaError{pointers.status().message()};
    check(cu->cuLaunchKernel(
              fn, unsigned(k.grid[0]), unsigned(k.grid[1] * chunks),
              unsigned(k.grid[2]), unsigned(k.block[0]), unsigned(k.block[1]),
              unsigned(k.block[2]), 0, stream, pointers->data(), nullptr),
          "cuLaunchKernel");
  }

  /// Runs the kernel once over `c`, set up on `d`, and checks what it wrote
  /// against the runtime's. A save kernel reads a filled cache and writes a
  /// poisoned payload; the others the other way round.
  kvc::testing::CacheErrors launchAndCheck(OnDevice &d, const KernelCase &c) {
    const int64_t n = d.cacheValues;
    std::vector<uint16_t> keys(n), vals(n);
    if (save()) {
      c.fillCache(keys.data(), vals.data());
      OnDevice::upload(d.keys, keys.data());
      OnDevice::upload(d.values, vals.data());
      check(cu->cuMemsetD8(d.payload.ptr, 0xA5, d.payload.bytes), "poison");
    } else {
      OnDevice::upload(d.payload, c.payload().data());
      check(cu->cuMemsetD16(d.keys.ptr, KernelCase::kPoison, n), "poison");
      check(cu->cuMemsetD16(d.values.ptr, KernelCase::kPoison, n), "poison");
    }
    if (norm())
      check(
          cu->cuMemsetD16(d.normed.ptr, KernelCase::kPoison, c.normedValues()),
          "poison");
    launch(d, int64_t(c.chunks().size()));
    check(cu->cuCtxSynchronize(), "kernel");
    if (norm()) {
      std::vector<uint16_t> normed(c.normedValues());
      check(cu->cuMemcpyDtoH(normed.data(), d.normed.ptr, normed.size() * 2),
            "download");
      return c.checkNormed(normed.data());
    }
    check(cu->cuMemcpyDtoH(keys.data(), d.keys.ptr, n * 2), "download");
    check(cu->cuMemcpyDtoH(vals.data(), d.values.ptr, n * 2), "download");
    std::string written(d.payload.bytes, '\0');
    check(cu->cuMemcpyDtoH(written.data(), d.payload.ptr, d.payload.bytes),
          "download");
    return c.check(keys.data(), vals.data(),
                   reinterpret_cast<const uint8_t *>(written.data()));
  }

  /// Microseconds per call of `body`: events around `iters` calls, after a
  /// warm-up.
  template <typename Body> double timeUs(Body &&body) {
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
  }

  const kvc::BundleKernel &k;
  int iters;
  kvc::testing::KernelShape shape;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  CUstream stream = nullptr;
  CUevent start = nullptr, stop = nullptr;
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
      std::printf("%-52s %6lld %9.2f %9.2f %9.1f %9.1f %5.0f%% %10.2f  %s\n",
                  r.name.c_str(), (long long)r.tokens, r.bytes / 1e6,
                  r.kernelUs, gbps, copy, 100 * gbps / copy, r.batchedUs,
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
