//===- CudaDevice.h - Restores into a GPU's memory --------------*- C++ -*-===//
//
// The device that servers run: the paged KV cache in device memory
// (vLLM's layout; kvc's own or a view of a caller's device tensors), chunk
// uploads through pinned staging, scatter and row copies in the backend's
// kernels, and its runners' model compute (HCache's projection, chunked
// prefill, decode) on the GPU with cuBLAS (CudaModel.h).
//
// Streams: each call in flight gets a lane (a stream and its cuBLAS handle)
// and returns when its work on that stream is done, so that the executor's
// order (upload before scatter, a layer's scatter before its completion is
// reported) holds on the device too. Calls from different threads run on
// different streams: a restore's IO and compute lanes overlap copies with
// kernels, and concurrent restores do not wait for each other. Nothing
// synchronizes the whole device during a restore.
//
// The CUDA runtime is linked statically and finds the driver at run time:
// where there is no GPU (or no driver), create() returns Unavailable, which
// a GPU test turns into "skipped" and a server into the CPU backend.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_CUDA_CUDADEVICE_H
#define KVC_RUNTIME_CUDA_CUDADEVICE_H

#include "kvc/Runtime/Device/Device.h"

namespace kvc {

struct CudaDeviceOptions {
  int device = 0;
  /// The GEMMs' input precision: the checkpoint's (fp32 for f32 models,
  /// bf16 for bf16 and f16 ones) unless forced.
  enum class Gemm { Auto, F32, BF16 } gemm = Gemm::Auto;
};

/// A CUDA device on `options.device`; Unavailable without a usable GPU.
/// Its runners compute with kvc's LlamaModel (a model a server computes
/// with itself restores through loads only: its runner's compute refuses).
StatusOr<std::unique_ptr<Device>>
createCudaDevice(const CudaDeviceOptions &options = {});

} // namespace kvc

#endif // KVC_RUNTIME_CUDA_CUDADEVICE_H
