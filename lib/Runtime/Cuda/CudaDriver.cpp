//===- CudaDriver.cpp - The CUDA driver API, loaded at run time -----------===//

#include "kvc/Runtime/Cuda/CudaDriver.h"

#include <dlfcn.h>

using namespace kvc;

namespace {

// Two levels, so that the name cuda.h maps an entry point to is the one
// looked up ("cuMemAlloc_v2").
#define KVC_CUDA_SYMBOL_NAME(name) KVC_CUDA_STRINGIFY(name)
#define KVC_CUDA_STRINGIFY(name) #name

StatusOr<CudaDriver> load() {
  void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char *error = dlerror();
    return unavailable(std::string("no CUDA driver: ") +
                       (error ? error : "libcuda.so.1 not found"));
  }
  CudaDriver driver;
#define KVC_CUDA_LOAD(name)                                                    \
  driver.name = reinterpret_cast<decltype(driver.name)>(                       \
      dlsym(library, KVC_CUDA_SYMBOL_NAME(name)));                             \
  if (!driver.name)                                                            \
    return unavailable("the CUDA driver has no " KVC_CUDA_SYMBOL_NAME(         \
        name) " (too old for kvc)");
  KVC_CUDA_DRIVER_ENTRY_POINTS(KVC_CUDA_LOAD)
#undef KVC_CUDA_LOAD
#define KVC_CUDA_LOAD_OPTIONAL(name)                                           \
  driver.name = reinterpret_cast<decltype(driver.name)>(                       \
      dlsym(library, KVC_CUDA_SYMBOL_NAME(name)));
  KVC_CUDA_DRIVER_OPTIONAL_ENTRY_POINTS(KVC_CUDA_LOAD_OPTIONAL)
#undef KVC_CUDA_LOAD_OPTIONAL
  CUresult init = driver.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char *name = nullptr;
    driver.cuGetErrorName(init, &name);
    return unavailable(std::string("the CUDA driver cannot start: cuInit: ") +
                       (name ? name : "unknown error"));
  }
  return driver;
}

} // namespace

StatusOr<const CudaDriver *> CudaDriver::get() {
  static const StatusOr<CudaDriver> driver = load();
  if (!driver)
    return driver.status();
  return &*driver;
}

Status CudaDriver::check(CUresult result, const char *what) const {
  if (result == CUDA_SUCCESS)
    return Status::ok();
  const char *name = nullptr;
  cuGetErrorName(result, &name);
  return internalError(std::string(what) + ": " +
                       (name ? name : "unknown error"));
}
