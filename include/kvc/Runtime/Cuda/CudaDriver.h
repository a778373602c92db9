//===- CudaDriver.h - The CUDA driver API, loaded at run time ---*- C++ -*-===//
//
// The runtime runs where no GPU (and no NVIDIA driver) exists, so nothing in
// it links libcuda: what needs the driver API gets its entry points from
// here, loaded from libcuda.so.1 on first use. A machine without the driver,
// or whose driver finds no device, gets Unavailable, which a GPU test turns
// into "skipped" (exit 77) and a server into the CPU backend.
//
// Only cuda.h's types and declarations are used at build time; each entry
// point is looked up under the versioned name cuda.h maps it to
// (cuMemAlloc -> cuMemAlloc_v2), so calls behave as if linked.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_CUDA_CUDADRIVER_H
#define KVC_RUNTIME_CUDA_CUDADRIVER_H

#include "kvc/Runtime/Base/Status.h"

#include <cuda.h>

#include <string>

namespace kvc {

/// The entry points kvc uses, as function pointers.
struct CudaDriver {
#define KVC_CUDA_DRIVER_ENTRY_POINTS(X)                                        \
  X(cuInit)                                                                    \
  X(cuGetErrorName)                                                            \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetName)                                                           \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxSynchronize)                                                          \
  X(cuModuleLoadData)                                                          \
  X(cuModuleGetFunction)                                                       \
  X(cuModuleUnload)                                                            \
  X(cuLaunchKernel)                                                            \
  X(cuMemAlloc)                                                                \
  X(cuMemFree)                                                                 \
  X(cuMemcpyHtoD)                                                              \
  X(cuMemcpyDtoH)                                                              \
  X(cuMemcpyDtoDAsync)                                                         \
  X(cuMemsetD8)                                                                \
  X(cuMemsetD16)                                                               \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuEventCreate)                                                             \
  X(cuEventDestroy)                                                            \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventElapsedTime)
// Entry points kvc does without where a driver lacks them (the emulated
// driver of the tests does): null then.
#define KVC_CUDA_DRIVER_OPTIONAL_ENTRY_POINTS(X)                               \
  X(cuStreamWaitValue32)                                                       \
  X(cuStreamWriteValue32)
#define KVC_CUDA_DRIVER_FIELD(name) decltype(&::name) name = nullptr;
  KVC_CUDA_DRIVER_ENTRY_POINTS(KVC_CUDA_DRIVER_FIELD)
  KVC_CUDA_DRIVER_OPTIONAL_ENTRY_POINTS(KVC_CUDA_DRIVER_FIELD)
#undef KVC_CUDA_DRIVER_FIELD

  /// The driver, loaded and initialized (cuInit) once per process; never
  /// unloaded. Unavailable when libcuda.so.1 is missing, lacks an entry
  /// point, or cuInit fails (no device, no driver/kernel module match).
  static StatusOr<const CudaDriver *> get();

  /// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY", or ok for CUDA_SUCCESS.
  Status check(CUresult result, const char *what) const;
};

} // namespace kvc

#endif // KVC_RUNTIME_CUDA_CUDADRIVER_H
