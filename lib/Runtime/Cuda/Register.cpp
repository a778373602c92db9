//===- Register.cpp - The CUDA driver in the registry ---------------------===//
//
// Linked as an object file into every program that links KVCCudaBackend
// (lib/Runtime/CMakeLists.txt), so that "cuda" opens wherever the backend
// is built, without the program naming it.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Cuda/CudaDevice.h"
#include "kvc/Runtime/Device/Registry.h"

#include <mutex>

namespace kvc {
namespace {

StatusOr<Device *> openCuda(const DeviceOptions &options) {
  static std::mutex mutex;
  // Kept for the process's life and never destroyed: at exit, static
  // destructors run in an order no driver object may depend on (the
  // device's memory frees through statics of its own, and CUDA's
  // runtime tears its context down on its own), so the process's end, not
  // a destructor, releases the device.
  static Device *opened = nullptr;
  static Status failed = Status::ok();
  static CudaDeviceOptions openedWith;
  std::lock_guard<std::mutex> lock(mutex);
  CudaDeviceOptions wanted;
  wanted.device = options.device;
  if (options.gemm == "f32")
    wanted.gemm = CudaDeviceOptions::Gemm::F32;
  else if (options.gemm == "bf16")
    wanted.gemm = CudaDeviceOptions::Gemm::BF16;
  else if (!options.gemm.empty())
    return invalidArgument("backend cuda: gemm expects f32 or bf16, got " +
                           options.gemm);
  if (!opened && failed.isOk()) {
    StatusOr<std::unique_ptr<Device>> made = createCudaDevice(wanted);
    if (made.isOk()) {
      opened = made->release();
      openedWith = wanted;
    } else {
      failed = made.status();
    }
  }
  KVC_RETURN_IF_ERROR(failed);
  if (wanted.device != openedWith.device ||
      (wanted.gemm != CudaDeviceOptions::Gemm::Auto &&
       wanted.gemm != openedWith.gemm))
    return failedPrecondition(
        "backend cuda: already open with other options (one "
        "device and GEMM precision per process)");
  return opened;
}

[[maybe_unused]] const bool registered = [] {
  registerDriver("cuda", openCuda);
  return true;
}();

} // namespace
} // namespace kvc
