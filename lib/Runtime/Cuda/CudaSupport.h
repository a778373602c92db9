//===- CudaSupport.h - What the CUDA backend shares -------------*- C++ -*-===//
//
// What the CUDA backend's pieces share:
//
//   cudaStatus / blasStatus   CUDA and cuBLAS errors as Status values
//   Cublas                    cuBLAS's entry points, loaded on first use
//                             (dlopen), so that programs linking the
//                             backend start without loading cuBLAS
//   DeviceArray               device memory owned by one object (weights,
//                             staging), freed stream-ordered
//   Lane                      a stream and the cuBLAS handle bound to it:
//                             the backend hands one to each call in flight,
//                             so concurrent calls (a restore's lanes,
//                             concurrent restores) run on their own streams
//   Scratch                   per-call device memory on a lane's stream,
//                             from the stream-ordered pool
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_CUDA_CUDASUPPORT_H
#define KVC_LIB_RUNTIME_CUDA_CUDASUPPORT_H

#include "kvc/Runtime/Base/Status.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kvc::cuda {

inline Status cudaStatus(cudaError_t error, const char *what) {
  if (error == cudaSuccess)
    return Status::ok();
  return Status(error == cudaErrorMemoryAllocation ? StatusCode::Unavailable
                                                   : StatusCode::Internal,
                std::string("cuda: ") + what + ": " + cudaGetErrorName(error) +
                    " (" + cudaGetErrorString(error) + ")");
}

/// Whether a query (cudaStreamQuery, cudaEventQuery) found its work done.
/// A query of work still running is no error: the last error it set is
/// cleared.
inline bool finished(cudaError_t queried) {
  if (queried == cudaSuccess)
    return true;
  if (queried == cudaErrorNotReady)
    (void)cudaGetLastError();
  return false;
}

/// The cuBLAS entry points the backend uses, as function pointers (C's
/// signatures: cublasGemmEx is overloaded in C++).
struct Cublas {
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t,
                                    cublasOperation_t, int, int, int,
                                    const void *, const void *, cudaDataType,
                                    int, const void *, cudaDataType, int,
                                    const void *, void *, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
#define KVC_CUBLAS_ENTRY_POINTS(X)                                             \
  X(cublasCreate, decltype(&::cublasCreate))                                   \
  X(cublasDestroy, decltype(&::cublasDestroy))                                 \
  X(cublasSetStream, decltype(&::cublasSetStream))                             \
  X(cublasGemmEx, GemmEx)                                                      \
  X(cublasGetStatusName, decltype(&::cublasGetStatusName))
#define KVC_CUBLAS_FIELD(name, type) type name = nullptr;
  KVC_CUBLAS_ENTRY_POINTS(KVC_CUBLAS_FIELD)
#undef KVC_CUBLAS_FIELD

  /// libcublas, loaded once per process; Unavailable where it is missing.
  static StatusOr<const Cublas *> get();
};

/// Requires Cublas::get() to have succeeded (every lane's creation does).
inline Status blasStatus(cublasStatus_t status, const char *what) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return Status::ok();
  return internalError(std::string("cublas: ") + what + ": " +
                       (*Cublas::get())->cublasGetStatusName(status));
}

#define KVC_CUDA_RETURN_IF_ERROR(expr, what)                                   \
  KVC_RETURN_IF_ERROR(::kvc::cuda::cudaStatus((expr), (what)))

/// Device memory of one owner; freed on the backend's release stream, after
/// every call that used it has finished (each call waits for its stream).
class DeviceArray {
public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray &) = delete;
  DeviceArray &operator=(const DeviceArray &) = delete;
  DeviceArray(DeviceArray &&other) noexcept { swap(other); }
  DeviceArray &operator=(DeviceArray &&other) noexcept {
    swap(other);
    return *this;
  }
  ~DeviceArray() { reset(); }

  /// Makes it hold at least `bytes` (its contents are lost when it grows).
  Status reserve(size_t bytes) {
    if (bytes <= bytes_)
      return Status::ok();
    reset();
    void *p = nullptr;
    KVC_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, bytes, releaseStream()),
                             "allocating device memory");
    KVC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(releaseStream()),
                             "allocating device memory");
    data_ = p;
    bytes_ = bytes;
    return Status::ok();
  }
  /// Forgets the memory without freeing it: where its free cannot be
  /// ordered after its users, a leak is safer than a free under a reader.
  void abandon() {
    data_ = nullptr;
    bytes_ = 0;
  }
  void reset() {
    if (data_)
      cudaFreeAsync(data_, releaseStream());
    data_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void> T *get() const {
    return static_cast<T *>(data_);
  }
  size_t bytes() const { return bytes_; }

  /// The stream allocations and frees are ordered on: non-blocking, so it
  /// waits for no other stream.
  static cudaStream_t releaseStream();

private:
  void swap(DeviceArray &other) {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  void *data_ = nullptr;
  size_t bytes_ = 0;
};

/// What a lane's stream carries. A restore's loads (uploads, scatters,
/// generated kernels, projections) run beside its prefill on one GPU: their
/// streams are of the device's greatest priority, so that the block
/// scheduler runs a load's small kernels as SMs free up instead of behind
/// every prefill kernel queued before them; prefills and decodes keep the
/// default.
enum class LaneUse { Load, Compute };

/// A stream with its cuBLAS handle and a pinned host buffer for copies.
struct Lane {
  /// Which of the device's lanes (its queue in a trace's device spans).
  int id = 0;
  LaneUse use = LaneUse::Load;
  /// The thread whose call had it last: its next call takes it again.
  std::thread::id user;
  cudaStream_t stream = nullptr;
  const Cublas *cublas = nullptr;
  cublasHandle_t blas = nullptr;
  /// Pinned host memory, split in two halves that alternate as an upload's
  /// staging (cudaHostAlloc'd on the lane's first upload, a fixed size).
  void *pinned = nullptr;
  cudaEvent_t halves[2] = {nullptr, nullptr};
  /// A word of host-mapped memory that kernels writing an f16 cache on the
  /// stream set when a finite value is beyond f16's range
  /// (RowLayout::outOfRange: its device address); sync reports and clears
  /// it.
  volatile unsigned *outOfRange = nullptr;
  unsigned *outOfRangeOnDevice = nullptr;

  static StatusOr<std::unique_ptr<Lane>> create(int device, LaneUse use);
  ~Lane();
  /// Waits for everything enqueued on the stream: DataLoss when it wrote a
  /// value an f16 cache cannot hold (as the CPU's cache refuses it).
  Status sync(const char *what) const;
};

/// Device memory for one call, allocated on its lane's stream and freed
/// there when the call's Scratch goes.
class Scratch {
public:
  explicit Scratch(const Lane &lane) : stream_(lane.stream) {}
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  ~Scratch() {
    for (void *p : blocks_)
      cudaFreeAsync(p, stream_);
  }
  /// `count` elements of T.
  template <typename T> StatusOr<T *> take(int64_t count) {
    void *p = nullptr;
    KVC_CUDA_RETURN_IF_ERROR(
        cudaMallocAsync(&p, size_t(std::max<int64_t>(count, 1)) * sizeof(T),
                        stream_),
        "allocating scratch");
    blocks_.push_back(p);
    return static_cast<T *>(p);
  }
  /// A copy of host `values` on the device.
  template <typename T> StatusOr<T *> copy(const T *values, int64_t count) {
    KVC_ASSIGN_OR_RETURN(p, take<T>(count));
    KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p, values,
                                             size_t(count) * sizeof(T),
                                             cudaMemcpyHostToDevice, stream_),
                             "copying to the device");
    return p;
  }

private:
  cudaStream_t stream_;
  std::vector<void *> blocks_;
};

} // namespace kvc::cuda

#endif // KVC_LIB_RUNTIME_CUDA_CUDASUPPORT_H
