//===- EmulatedCuda.cpp - A libcuda.so.1 that runs PTX in the interpreter -===//
//
// The CUDA driver API entry points kvc loads (CudaDriver.h), over host
// memory, with kernels run by the PTX interpreter (PtxInterpreter.h). Built
// as build/lib/emulated-cuda/libcuda.so.1: a process started with that
// directory on LD_LIBRARY_PATH finds it where it would find the driver, so
// a driver-API program (kvc-kernel-bench) runs its host side end to end on
// a machine without a GPU, every launch checked for the faults the
// interpreter reports.
//
// The model:
//  - one device ("kvc emulated CUDA (PTX interpreter)"); device pointers
//    are host addresses; a launch may touch every live allocation, and no
//    other memory;
//  - every call runs to completion before it returns, so streams and
//    events order nothing; an event's time is when it was recorded (the
//    interpreter's speed, not a GPU's);
//  - a launch that faults prints the interpreter's message on stderr and
//    fails with CUDA_ERROR_ILLEGAL_ADDRESS (a memory fault) or
//    CUDA_ERROR_LAUNCH_FAILED; as on a GPU, the context is then unusable
//    and every later call returns the same error.
//
// PTX outside the interpreter's subset fails cuModuleLoadData with
// CUDA_ERROR_INVALID_PTX, the reason on stderr.
//
//===----------------------------------------------------------------------===//

#include "kvc/Testing/PtxInterpreter.h"

#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

using kvc::testing::PtxModule;
using kvc::testing::PtxRegion;

// The opaque handles of cuda.h.
struct CUctx_st {};
struct CUfunc_st {
  const PtxModule *module;
  std::string name;
};
struct CUmod_st {
  PtxModule module;
  /// Its functions' handles, which live as long as it does.
  std::map<std::string, std::unique_ptr<CUfunc_st>, std::less<>> functions;
};
struct CUstream_st {};
struct CUevent_st {
  std::chrono::steady_clock::time_point recorded;
  bool isRecorded = false;
};

namespace {

struct Driver {
  std::mutex mutex;
  bool initialized = false;
  /// A fault's error, returned by every call after it.
  CUresult sticky = CUDA_SUCCESS;
  std::map<uint64_t, size_t> allocations;
  CUctx_st context;

  /// Whether [address, address + bytes) lies in one allocation.
  bool owns(CUdeviceptr address, size_t bytes) const {
    auto it = allocations.upper_bound(address);
    if (it == allocations.begin())
      return false;
    --it;
    return address - it->first <= it->second &&
           bytes <= it->second - (address - it->first);
  }
};

Driver &driver() {
  static Driver *d = new Driver; // Outlives every static destructor.
  return *d;
}

/// The error every call starts with: a fault's, or not initialized.
CUresult state(const Driver &d) {
  if (!d.initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  return d.sticky;
}

/// Runs `body` on the driver under its lock, unless state() answers first.
template <typename Body> CUresult call(Body &&body) {
  Driver &d = driver();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (CUresult error = state(d))
    return error;
  return body(d);
}

/// Runs `release` (freeing a handle or memory) on the driver under its
/// lock, after a fault too; then state(), where `release` succeeded.
template <typename Release> CUresult callToRelease(Release &&release) {
  Driver &d = driver();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (CUresult error = release(d))
    return error;
  return state(d);
}

/// Creates a stream or event handle into `out`.
template <typename Handle> CUresult createHandle(Handle **out) {
  return call([&](Driver &) -> CUresult {
    if (!out)
      return CUDA_ERROR_INVALID_VALUE;
    *out = new Handle;
    return CUDA_SUCCESS;
  });
}

/// Destroys a handle createHandle made, after a fault too.
template <typename Handle> CUresult destroyHandle(Handle *handle) {
  return callToRelease([&](Driver &) {
    if (!handle)
      return CUDA_ERROR_INVALID_HANDLE;
    delete handle;
    return CUDA_SUCCESS;
  });
}

} // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int flags) {
  if (flags)
    return CUDA_ERROR_INVALID_VALUE;
  Driver &d = driver();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.initialized = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **name) {
  if (!name)
    return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define KVC_ERROR_NAME(code)                                                   \
  case code:                                                                   \
    *name = #code;                                                             \
    return CUDA_SUCCESS;
    KVC_ERROR_NAME(CUDA_SUCCESS)
    KVC_ERROR_NAME(CUDA_ERROR_INVALID_VALUE)
    KVC_ERROR_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    KVC_ERROR_NAME(CUDA_ERROR_NOT_INITIALIZED)
    KVC_ERROR_NAME(CUDA_ERROR_INVALID_DEVICE)
    KVC_ERROR_NAME(CUDA_ERROR_INVALID_PTX)
    KVC_ERROR_NAME(CUDA_ERROR_INVALID_HANDLE)
    KVC_ERROR_NAME(CUDA_ERROR_NOT_FOUND)
    KVC_ERROR_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    KVC_ERROR_NAME(CUDA_ERROR_LAUNCH_FAILED)
    KVC_ERROR_NAME(CUDA_ERROR_NOT_READY)
#undef KVC_ERROR_NAME
  default:
    *name = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  return call([&](Driver &d) -> CUresult {
    if (!count)
      return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  return call([&](Driver &d) -> CUresult {
    if (!device)
      return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
      return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetName(char *name, int length, CUdevice device) {
  return call([&](Driver &d) -> CUresult {
    if (!name || length <= 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (device != 0)
      return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, size_t(length), "%s",
                  "kvc emulated CUDA (PTX interpreter)");
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
  return call([&](Driver &d) -> CUresult {
    if (!context)
      return CUDA_ERROR_INVALID_VALUE;
    if (device != 0)
      return CUDA_ERROR_INVALID_DEVICE;
    *context = &d.context;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext context) {
  return call([&](Driver &d) -> CUresult {
    return context == nullptr || context == &d.context
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  return call([](Driver &) { return CUDA_SUCCESS; });
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  return call([&](Driver &d) -> CUresult {
    if (!module || !image)
      return CUDA_ERROR_INVALID_VALUE;
    kvc::StatusOr<PtxModule> parsed =
        PtxModule::parse(static_cast<const char *>(image));
    if (!parsed) {
      std::fprintf(stderr, "kvc emulated CUDA: cuModuleLoadData: %s\n",
                   parsed.status().message().c_str());
      return CUDA_ERROR_INVALID_PTX;
    }
    *module = new CUmod_st{std::move(*parsed), {}};
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *function, CUmodule module,
                                     const char *name) {
  return call([&](Driver &d) -> CUresult {
    if (!function || !name)
      return CUDA_ERROR_INVALID_VALUE;
    if (!module)
      return CUDA_ERROR_INVALID_HANDLE;
    if (!module->module.hasEntry(name))
      return CUDA_ERROR_NOT_FOUND;
    std::unique_ptr<CUfunc_st> &handle = module->functions[name];
    if (!handle)
      handle.reset(new CUfunc_st{&module->module, name});
    *function = handle.get();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  return callToRelease([&](Driver &) {
    if (!module)
      return CUDA_ERROR_INVALID_HANDLE;
    delete module;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLaunchKernel(CUfunction function, unsigned gridX,
                                unsigned gridY, unsigned gridZ, unsigned blockX,
                                unsigned blockY, unsigned blockZ,
                                unsigned sharedBytes, CUstream, void **params,
                                void **extra) {
  return call([&](Driver &d) -> CUresult {
    if (!function)
      return CUDA_ERROR_INVALID_HANDLE;
    // The generated kernels take their parameters by pointer and use no
    // dynamic shared memory.
    if (extra || sharedBytes || !params)
      return CUDA_ERROR_INVALID_VALUE;
    std::vector<PtxRegion> memory;
    for (const auto &[base, bytes] : d.allocations)
      memory.push_back({base, bytes});
    kvc::Status status =
        function->module->launch(function->name, {gridX, gridY, gridZ},
                                 {blockX, blockY, blockZ}, params, memory);
    if (status.isOk())
      return CUDA_SUCCESS;
    std::fprintf(stderr, "kvc emulated CUDA: cuLaunchKernel: %s\n",
                 status.message().c_str());
    if (status.code() != kvc::StatusCode::FailedPrecondition)
      return CUDA_ERROR_INVALID_VALUE; // Refused before it ran.
    const std::string &message = status.message();
    const bool memoryFault =
        message.find("out-of-bounds ") != std::string::npos ||
        message.find("misaligned ") != std::string::npos;
    d.sticky =
        memoryFault ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_LAUNCH_FAILED;
    return d.sticky;
  });
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *address, size_t bytes) {
  return call([&](Driver &d) -> CUresult {
    if (!address || !bytes)
      return CUDA_ERROR_INVALID_VALUE;
    // 256-byte aligned, as cuMemAlloc's.
    void *memory = std::aligned_alloc(256, (bytes + 255) & ~size_t(255));
    if (!memory)
      return CUDA_ERROR_OUT_OF_MEMORY;
    *address = reinterpret_cast<CUdeviceptr>(memory);
    d.allocations[*address] = bytes;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemFree(CUdeviceptr address) {
  return callToRelease([&](Driver &d) {
    auto it = d.allocations.find(address);
    if (it == d.allocations.end())
      return CUDA_ERROR_INVALID_VALUE;
    d.allocations.erase(it);
    std::free(reinterpret_cast<void *>(address));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr to, const void *from, size_t bytes) {
  return call([&](Driver &d) -> CUresult {
    if (!d.owns(to, bytes) || (bytes && !from))
      return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(reinterpret_cast<void *>(to), from, bytes);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemcpyDtoH(void *to, CUdeviceptr from, size_t bytes) {
  return call([&](Driver &d) -> CUresult {
    if (!d.owns(from, bytes) || (bytes && !to))
      return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(to, reinterpret_cast<const void *>(from), bytes);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr to, CUdeviceptr from,
                                   size_t bytes, CUstream) {
  return call([&](Driver &d) -> CUresult {
    if (!d.owns(to, bytes) || !d.owns(from, bytes))
      return CUDA_ERROR_INVALID_VALUE;
    std::memmove(reinterpret_cast<void *>(to),
                 reinterpret_cast<const void *>(from), bytes);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr to, unsigned char value, size_t n) {
  return call([&](Driver &d) -> CUresult {
    if (!d.owns(to, n))
      return CUDA_ERROR_INVALID_VALUE;
    std::memset(reinterpret_cast<void *>(to), value, n);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemsetD16(CUdeviceptr to, unsigned short value, size_t n) {
  return call([&](Driver &d) -> CUresult {
    if (to % 2 || n > SIZE_MAX / 2 || !d.owns(to, 2 * n))
      return CUDA_ERROR_INVALID_VALUE;
    auto *at = reinterpret_cast<unsigned char *>(to);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(at + 2 * i, &value, 2);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int) {
  return createHandle(stream);
}

CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
  return destroyHandle(stream);
}

CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int) {
  return createHandle(event);
}

CUresult CUDAAPI cuEventDestroy(CUevent event) { return destroyHandle(event); }

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream) {
  return call([&](Driver &d) -> CUresult {
    if (!event)
      return CUDA_ERROR_INVALID_HANDLE;
    event->recorded = std::chrono::steady_clock::now();
    event->isRecorded = true;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  return call([&](Driver &d) -> CUresult {
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  return call([&](Driver &d) -> CUresult {
    if (!ms)
      return CUDA_ERROR_INVALID_VALUE;
    if (!start || !end)
      return CUDA_ERROR_INVALID_HANDLE;
    if (!start->isRecorded || !end->isRecorded)
      return CUDA_ERROR_INVALID_HANDLE;
    *ms = std::chrono::duration<float, std::milli>(end->recorded -
                                                   start->recorded)
              .count();
    return CUDA_SUCCESS;
  });
}

} // extern "C"
