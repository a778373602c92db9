//===- LlamaModel.h - The CPU reference model -------------------*- C++ -*-===//
//
// A Llama-family model (RMSNorm, RoPE with the config's base and scaling,
// grouped-query attention with a causal mask over the prefix, SwiGLU MLP)
// read from a Hugging Face checkpoint and run in fp32 on the CPU, GEMMs in
// OpenBLAS. It prefills tokens chunk by chunk and hands each layer's input
// hidden states, K (after RoPE) and V to the caller; it also projects stored
// hidden states back to K and V (HCache). It is the ground truth every
// restore is verified against.
//
// K and V are rounded to bf16 where they are produced, as the paged cache
// holds them (vLLM's kv_cache_dtype): attention reads them in that
// precision, as a server's attention reads its cache. So a prefill that
// attends over a restore's paged cache (KVContext) computes what one over
// its own vectors (Cache) does, and a restore that computes part of the
// request needs no private copy of the context.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_LLAMAMODEL_H
#define KVC_RUNTIME_MODEL_LLAMAMODEL_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Model/Attention.h"
#include "kvc/Runtime/Model/Safetensors.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvc {

/// One layer's view of a prefilled chunk of `tokens` tokens at `position`.
struct LayerSnapshot {
  int64_t layer = 0;
  int64_t position = 0;
  int64_t tokens = 0;
  const float *hidden = nullptr; ///< [tokens][hidden]: the layer's input.
  const float *k = nullptr;      ///< [tokens][kv_heads * head_dim], RoPE'd.
  const float *v = nullptr;      ///< [tokens][kv_heads * head_dim].
};

/// Where a prefill keeps the K and V its attention reads back, layer by
/// layer: the model's own fp32 vectors (LlamaModel::Cache), or a restore's
/// paged cache.
class KVContext {
public:
  virtual ~KVContext() = default;
  /// Keeps K and V ([n][kvDim], bf16-representable) of `layer` for the
  /// tokens at position..position + n.
  virtual Status append(int64_t layer, int64_t position, int64_t n,
                        const float *k, const float *v) = 0;
  /// Keys and values of tokens [first, first + count) of `layer` as fp32,
  /// valid until the next call.
  virtual Status rows(int64_t layer, int64_t first, int64_t count,
                      KeyValueRows &out) = 0;
};

/// Threads the CPU backend's GEMMs use, process-wide (OpenBLAS's pool).
/// kvc-run sets 1 unless told otherwise: the compute "device" is then one
/// core and the host-side workers (IO lanes, decoding, copies) have the
/// others, as a GPU's host has its CPU. Spread over every core, GEMMs
/// competed with those workers (OpenBLAS's idle threads spin in
/// sched_yield) and their speed swung with the second vCPU's availability
/// on a shared VM: docs/executor.md, "The CPU backend's compute device".
void setComputeThreads(int threads);

class LlamaModel {
public:
  /// Loads config.json and the safetensors weights of `dir`, checking every
  /// tensor's presence and shape.
  static StatusOr<std::unique_ptr<LlamaModel>> load(const std::string &dir);

  const ModelConfig &config() const { return config_; }
  /// SHA-256 (hex) over the architecture and every weight: two models share
  /// stored chunks only when this matches.
  const std::string &fingerprint() const { return fingerprint_; }
  int64_t kvDim() const { return config_.numKvHeads * config_.headDim; }

  /// FLOPs of prefilling `tokens` tokens through `layers` layers: the
  /// projections and the MLP (attention, which grows with the position, is
  /// left out, as in every FLOP count the runtime reports).
  double prefillFlops(int64_t tokens, int64_t layers) const {
    const double h = double(config_.hiddenSize), kv = double(kvDim());
    return 2.0 * double(tokens) * double(layers) *
           (2 * h * h + 2 * h * kv + 3 * h * double(config_.intermediateSize));
  }
  /// FLOPs of projecting `tokens` tokens' hidden states of `layers` layers
  /// to K and V (HCache).
  double projectFlops(int64_t tokens, int64_t layers) const {
    return 2.0 * double(tokens) * double(layers) *
           double(config_.hiddenSize) * 2 * double(kvDim());
  }

  /// The KV of every layer for the tokens prefilled so far, fp32.
  struct Cache final : KVContext {
    int64_t tokens = 0;
    int64_t dim = 0; ///< kvDim.
    std::vector<std::vector<float>> k, v; ///< Per layer, [tokens][kvDim].

    Status append(int64_t layer, int64_t position, int64_t n, const float *k,
                  const float *v) override;
    Status rows(int64_t layer, int64_t first, int64_t count,
                KeyValueRows &out) override;
  };
  Cache newCache() const;

  using LayerCallback = std::function<void(const LayerSnapshot &)>;

  /// Runs `n` tokens at positions cache.tokens.. through every layer (or
  /// the first `layers`), appending their KV to `cache` and calling
  /// `onLayer` for each layer. Layers left out fall behind cache.tokens and
  /// must not be prefilled further.
  Status prefill(Cache &cache, const int32_t *tokens, int64_t n,
                 const LayerCallback &onLayer = {}, int64_t layers = -1) const;

  /// The same over any context that holds tokens [0, position) of the
  /// first `layers` layers: appends the new tokens' K and V to `context`
  /// and attends over it.
  Status prefill(KVContext &context, int64_t position, const int32_t *tokens,
                 int64_t n, const LayerCallback &onLayer = {},
                 int64_t layers = -1) const;

  /// K (after RoPE) and V of `layer` for `n` tokens at positions
  /// position.. from the hidden states entering the layer, bf16-rounded as
  /// a prefill's are.
  void project(int64_t layer, const float *hidden, int64_t n,
               int64_t position, float *k, float *v) const;

  /// Rows position .. position + n of the model's RoPE table (Rope.h):
  /// what its rotations use, and what a generated kernel reads.
  void ropeTable(int64_t position, int64_t n, float *out) const;

private:
  struct Layer {
    std::vector<float> attnNorm, q, k, v, o, mlpNorm, gate, up, down;
  };
  LlamaModel() = default;
  void rmsNorm(const float *x, const std::vector<float> &weight, int64_t n,
               float *out) const;

  ModelConfig config_;
  std::string fingerprint_;
  std::vector<float> embed_;
  std::vector<Layer> layers_;
  std::vector<float> invFreq_; ///< RoPE frequencies, head_dim / 2.
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_LLAMAMODEL_H
