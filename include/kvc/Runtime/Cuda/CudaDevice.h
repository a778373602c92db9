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

#include <memory>
#include <vector>

namespace kvc {

struct CudaDeviceOptions {
  int device = 0;
  /// The GEMMs' input precision: the checkpoint's (fp32 for f32 models,
  /// bf16 for bf16 and f16 ones) unless forced.
  enum class Gemm { Auto, F32, BF16 } gemm = Gemm::Auto;
};

/// A CUDA device on `options.device`; Unavailable without a usable GPU.
/// The runners it makes (Device::createRunner) compute with kvc's
/// LlamaModel, its weights uploaded once; a server's own Llama computes
/// over the weights it already holds on the GPU (createCudaRunner, below;
/// RestoreTarget::runner). Any other model restores through loads only:
/// its runner's compute refuses.
StatusOr<std::unique_ptr<Device>>
createCudaDevice(const CudaDeviceOptions &options = {});

class ModelCompute;
class ModelRunner;

/// A Llama model's weights that a caller (a server) holds in a GPU's
/// memory, as vLLM's LlamaForCausalLM holds them: bf16, each projection
/// row-major [out][in], the fused ones as vLLM fuses them.
struct CudaLlamaWeights {
  struct Layer {
    const void *inputNorm = nullptr;         ///< [hidden]
    const void *postAttentionNorm = nullptr; ///< [hidden]
    /// [(heads + 2 * kv_heads) * head_dim][hidden]: Q's rows, K's, V's
    /// (qkv_proj).
    const void *qkv = nullptr;
    const void *o = nullptr; ///< [hidden][heads * head_dim] (o_proj)
    /// [2 * intermediate][hidden]: gate's rows, then up's (gate_up_proj).
    const void *gateUp = nullptr;
    const void *down = nullptr; ///< [hidden][intermediate] (down_proj)
  };
  std::vector<Layer> layers;
  const void *embedding = nullptr; ///< [vocab][hidden] (embed_tokens)
  const void *finalNorm = nullptr; ///< [hidden] (norm)
  /// [vocab][hidden] (lm_head; the embedding's when they are tied).
  const void *output = nullptr;
};

/// A runner (kvc/Runtime/Model/ModelRunner.h) of `model` — its config; its
/// own compute is not used — on `device`, a CUDA device, over `weights`
/// the caller holds on that GPU, which must outlive the runner: its GEMMs
/// read them in place (bf16) and only the norms are copied (to fp32).
/// Refuses another device, or a tensor outside that GPU's memory, with why.
StatusOr<std::unique_ptr<ModelRunner>>
createCudaRunner(Device &device, const ModelCompute &model,
                 const CudaLlamaWeights &weights);

} // namespace kvc

#endif // KVC_RUNTIME_CUDA_CUDADEVICE_H
