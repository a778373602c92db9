//===- CudaSupport.cpp - What the CUDA backend shares ---------------------===//

#include "CudaSupport.h"

#include <dlfcn.h>

#include <map>
#include <mutex>

namespace kvc {
namespace cuda {

// Two levels, so that the name cublas_v2.h maps an entry point to is the
// one looked up ("cublasCreate_v2").
#define KVC_CUBLAS_SYMBOL_NAME(name) KVC_CUBLAS_STRINGIFY(name)
#define KVC_CUBLAS_STRINGIFY(name) #name

namespace {

StatusOr<Cublas> loadCublas() {
  void *library =
      dlopen("libcublas.so." KVC_CUBLAS_SONAME_VERSION, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char *error = dlerror();
    return unavailable(std::string("cuda backend: no cuBLAS: ") +
                       (error ? error : "libcublas not found"));
  }
  Cublas cublas;
#define KVC_CUBLAS_LOAD(name, type)                                            \
  cublas.name = reinterpret_cast<decltype(cublas.name)>(                       \
      dlsym(library, KVC_CUBLAS_SYMBOL_NAME(name)));                           \
  if (!cublas.name)                                                            \
    return Status(                                                             \
        StatusCode::Unavailable,                                               \
        "cuda backend: cuBLAS has no " KVC_CUBLAS_SYMBOL_NAME(name));
  KVC_CUBLAS_ENTRY_POINTS(KVC_CUBLAS_LOAD)
#undef KVC_CUBLAS_LOAD
  return cublas;
}

} // namespace

StatusOr<const Cublas *> Cublas::get() {
  static const StatusOr<Cublas> cublas = loadCublas();
  if (!cublas)
    return cublas.status();
  return &*cublas;
}

cudaStream_t DeviceArray::releaseStream() {
  // Never destroyed: an array that a static owns may free itself during
  // static destruction, after statics made later than its owner are gone.
  static std::mutex &mutex = *new std::mutex;
  static std::map<int, cudaStream_t> &streams =
      *new std::map<int, cudaStream_t>;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t &stream = streams[device];
  if (!stream)
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  return stream;
}

StatusOr<std::unique_ptr<Lane>> Lane::create(int device, LaneUse use) {
  auto lane = std::make_unique<Lane>();
  lane->use = use;
  KVC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "selecting the device");
  int least = 0, greatest = 0;
  KVC_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                           "reading the device's stream priorities");
  KVC_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&lane->stream, cudaStreamNonBlocking,
                                   use == LaneUse::Load ? greatest : least),
      "creating a stream");
  for (cudaEvent_t &event : lane->halves)
    KVC_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
        "creating an event");
  void *word = nullptr;
  KVC_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&word, sizeof(unsigned),
                    cudaHostAllocMapped | cudaHostAllocPortable),
      "allocating a lane's range word");
  lane->outOfRange = static_cast<volatile unsigned *>(word);
  *lane->outOfRange = 0;
  void *onDevice = nullptr;
  KVC_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&onDevice, word, 0),
                           "mapping a lane's range word");
  lane->outOfRangeOnDevice = static_cast<unsigned *>(onDevice);
  KVC_ASSIGN_OR_RETURN(cublas, Cublas::get());
  lane->cublas = cublas;
  KVC_RETURN_IF_ERROR(
      blasStatus(cublas->cublasCreate(&lane->blas), "cublasCreate"));
  KVC_RETURN_IF_ERROR(blasStatus(
      cublas->cublasSetStream(lane->blas, lane->stream), "cublasSetStream"));
  return lane;
}

Status Lane::sync(const char *what) const {
  KVC_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(stream), what));
  if (!*outOfRange)
    return Status::ok();
  *outOfRange = 0;
  return dataLoss(std::string(what) +
                  ": a value beyond f16's range (65504) for an f16 cache");
}

Lane::~Lane() {
  if (blas)
    cublas->cublasDestroy(blas);
  for (cudaEvent_t event : halves)
    if (event)
      cudaEventDestroy(event);
  if (pinned)
    cudaFreeHost(pinned);
  if (outOfRange)
    cudaFreeHost(const_cast<unsigned *>(outOfRange));
  if (stream)
    cudaStreamDestroy(stream);
}

} // namespace cuda
} // namespace kvc
