//===- Register.cpp - The CUDA driver in the backend registry -------------===//
//
// Linked as an object file into every program that links KVCCudaBackend
// (lib/Runtime/CMakeLists.txt), so that "cuda" opens wherever the backend
// is built, without the program naming it.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Backend/Registry.h"
#include "kvc/Runtime/Cuda/CudaBackend.h"

#include <mutex>

namespace kvc {
namespace {

StatusOr<Backend *> openCuda(const BackendOptions &options) {
  static std::mutex mutex;
  // Kept for the process's life and never destroyed: at exit, static
  // destructors run in an order no driver object may depend on (the
  // backend's device memory frees through statics of its own, and CUDA's
  // runtime tears its context down on its own), so the process's end, not
  // a destructor, releases the device.
  static Backend *opened = nullptr;
  static Status failed = Status::ok();
  static CudaBackendOptions openedWith;
  std::lock_guard<std::mutex> lock(mutex);
  CudaBackendOptions wanted;
  wanted.device = options.device;
  if (options.gemm == "f32")
    wanted.gemm = CudaBackendOptions::Gemm::F32;
  else if (options.gemm == "bf16")
    wanted.gemm = CudaBackendOptions::Gemm::BF16;
  else if (!options.gemm.empty())
    return invalidArgument("backend cuda: gemm expects f32 or bf16, got " +
                           options.gemm);
  if (!opened && failed.isOk()) {
    StatusOr<std::unique_ptr<Backend>> made = createCudaBackend(wanted);
    if (made.isOk()) {
      opened = made->release();
      openedWith = wanted;
    } else {
      failed = made.status();
    }
  }
  KVC_RETURN_IF_ERROR(failed);
  if (wanted.device != openedWith.device ||
      (wanted.gemm != CudaBackendOptions::Gemm::Auto &&
       wanted.gemm != openedWith.gemm))
    return Status(StatusCode::FailedPrecondition,
                  "backend cuda: already open with other options (one "
                  "device and GEMM precision per process)");
  return opened;
}

[[maybe_unused]] const bool registered = [] {
  registerBackend("cuda", openCuda);
  return true;
}();

} // namespace
} // namespace kvc
