//===- CudaModel.h - A Llama model on the GPU -------------------*- C++ -*-===//
//
// A Llama model with its weights in device memory: kvc's reference model
// (LlamaModel) uploaded, or the weights a server already holds there
// (CudaLlamaWeights, borrowed), with the same prefill, projection and
// logits: the GEMMs in cuBLAS (cublasGemmEx, fp32 accumulation) and the
// rest in the backend's kernels (Kernels.h), attending over a paged cache
// in device memory.
//
// Precision: the weights and GEMM inputs are fp32 (F32: the CPU model's
// arithmetic, up to summation order) or bf16 (BF16: a server's, the GEMM
// inputs rounded to bf16, attention on the tensor cores with Q and the
// softmax weights in bf16), chosen per model; activations, norms, RoPE and
// softmax are fp32 either way, and K and V are rounded to bf16 where they
// are produced, as the CPU model does.
//
// Thread-safe: the weights are read-only after create, and every call runs
// on the lane it is given.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_CUDA_CUDAMODEL_H
#define KVC_LIB_RUNTIME_CUDA_CUDAMODEL_H

#include "CudaSupport.h"
#include "Kernels.h"

#include "kvc/Runtime/Cuda/CudaDevice.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/Rope.h"

#include <functional>
#include <mutex>

namespace kvc::cuda {

enum class GemmPrecision { F32, BF16 };

class CudaModel {
public:
  /// Whether the GPU's forward and generated projections compute a model
  /// of `config`: Qwen2's biases and Qwen3's q/k norms they do, sliding
  /// windows not (the CPU backend computes those), Unimplemented naming
  /// what is missing.
  static Status supports(const ModelConfig &config);
  /// Copies `model`'s weights to the current device, from its checkpoint
  /// as stored (its fp32 host weights are neither used nor made).
  static StatusOr<std::unique_ptr<CudaModel>> create(const LlamaModel &model,
                                                     GemmPrecision precision);
  /// A model of `config` over `weights` the caller holds on the current
  /// device (bf16; they must outlive it): only the norms are copied, to
  /// fp32. Refuses weights it cannot address, and models with biases or
  /// per-head norms (the server's weights carry none).
  static StatusOr<std::unique_ptr<CudaModel>>
  borrow(const ModelConfig &config, const CudaLlamaWeights &weights);

  const ModelConfig &config() const { return config_; }

  /// Called after a layer's K and V are in the cache, with the layer's
  /// input hidden states (device, fp32 [n][hidden]), enqueued work pending.
  using LayerHook = std::function<Status(int64_t layer, const float *hidden)>;

  /// Runs `n` tokens (host memory) at positions position.. through the
  /// first `layers` layers over `cache` (one layout per layer, holding
  /// tokens [0, position)), writing their K and V there. With `logits`
  /// (device, [vocab]) and every layer, also the next-token logits after
  /// the last token; with `onLayer`, shows each layer to it.
  Status forward(Lane &lane, const int32_t *tokens, int64_t position, int64_t n,
                 int64_t layers, const std::vector<RowLayout> &cache,
                 float *logits = nullptr, const LayerHook &onLayer = {}) const;

  /// K (after RoPE) and V of `layer` for `n` tokens at positions position..
  /// from their hidden states (device, fp32 [n][hidden]), bf16 into `out`.
  Status project(Lane &lane, int64_t layer, const float *hidden, int64_t n,
                 int64_t position, RowLayout out) const;

  /// Whether the GEMMs take bf16 inputs.
  bool bf16() const { return precision_ == GemmPrecision::BF16; }

  /// What a generated projection (an RmsNorm prologue and a RopeScatter
  /// epilogue, ModelRunner::launchProject) reads of the model: each layer's
  /// input RMSNorm weight, fp32 [layers][hidden] on the device ...
  const float *attnNorms() const { return attnNorms_.get<float>(); }
  /// ... the RoPE table of positions [0, max positions), fp32
  /// [position][head_dim] on the device, made on first use ...
  StatusOr<const float *> fullRopeTable() const;
  /// ... and the projection's GEMMs: K and V ([n][kv width] fp32 each) of
  /// `layer` from `n` normalized rows `x` (bf16; bf16 GEMMs only).
  Status projectKV(Lane &lane, int64_t layer, const uint16_t *x, int64_t n,
                   float *k, float *v) const;

private:
  /// A matrix [rows][columns] in the GEMM precision: its own, or one the
  /// caller holds.
  struct Matrix {
    DeviceArray data;
    const void *borrowed = nullptr;
    int64_t rows = 0, columns = 0;
    const char *get() const {
      return borrowed ? static_cast<const char *>(borrowed) : data.get<char>();
    }
  };
  struct Layer {
    DeviceArray attnNorm, mlpNorm; ///< fp32.
    /// fp32, empty where the model has none: [q | k | v]'s biases, the
    /// output projection's, Qwen3's per-head q and k norms.
    DeviceArray qkvBias, oBias, qNorm, kNorm;
    Matrix qkv; ///< [q | k | v] rows.
    Matrix o;
    Matrix gateUp; ///< [gate | up] rows.
    Matrix down;
  };

  /// Columns from.. from + width of a projection's [q | k | v] rows (`n`
  /// rows `stride` floats apart, the columns from their start) biased, and
  /// Q's and K's heads among them normed, where the model has them (before
  /// RoPE): the forward pass's whole rows, a projection's K and V.
  Status biasAndNormHeads(const Layer &L, float *rows, int64_t n,
                          int64_t stride, int64_t from, int64_t width,
                          cudaStream_t stream) const;

  CudaModel(const ModelConfig &config, GemmPrecision precision)
      : config_(config), invFreq_(ropeFrequencies(config)),
        precision_(precision) {}
  /// `parts` (stored tensors, rows back to back) into `to` in the GEMM
  /// precision.
  Status upload(const std::vector<const TensorView *> &parts, int64_t columns,
                Matrix &to) const;
  /// y[n][rows] = x[n][columns] * W^T (+ y when `accumulate`), over rows
  /// [row0, row0 + rows) of `w`.
  Status gemm(Lane &lane, const void *x, const Matrix &w, int64_t row0,
              int64_t rows, int64_t n, float *y, bool accumulate) const;
  /// RoPE rows position.. position + n of fullRopeTable: the host
  /// model's cos and sin, computed and copied once per model rather than
  /// per call (per layer, in a projection).
  StatusOr<const float *> ropeRows(int64_t position, int64_t n) const;

  ModelConfig config_;
  std::vector<float> invFreq_; ///< RoPE frequencies, head_dim / 2.
  GemmPrecision precision_;
  DeviceArray embedding_, finalNorm_, attnNorms_; ///< fp32.
  /// A borrowed embedding ([vocab][hidden] bf16), in place of embedding_.
  const uint16_t *borrowedEmbedding_ = nullptr;
  Matrix output_;
  std::vector<Layer> layers_;
  mutable std::mutex ropeMutex_; ///< Guards ropeTable_.
  mutable DeviceArray ropeTable_;
};

} // namespace kvc::cuda

#endif // KVC_LIB_RUNTIME_CUDA_CUDAMODEL_H
