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
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_LLAMAMODEL_H
#define KVC_RUNTIME_MODEL_LLAMAMODEL_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
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
  struct Cache {
    int64_t tokens = 0;
    std::vector<std::vector<float>> k, v; ///< Per layer, [tokens][kvDim].
  };
  Cache newCache() const;

  using LayerCallback = std::function<void(const LayerSnapshot &)>;

  /// Runs `n` tokens at positions cache.tokens.. through every layer (or
  /// the first `layers`), appending their KV to `cache` and calling
  /// `onLayer` for each layer. Layers left out fall behind cache.tokens and
  /// must not be prefilled further.
  Status prefill(Cache &cache, const int32_t *tokens, int64_t n,
                 const LayerCallback &onLayer = {}, int64_t layers = -1) const;

  /// K (after RoPE) and V of `layer` for `n` tokens at positions
  /// position.. from the hidden states entering the layer.
  void project(int64_t layer, const float *hidden, int64_t n,
               int64_t position, float *k, float *v) const;

private:
  struct Layer {
    std::vector<float> attnNorm, q, k, v, o, mlpNorm, gate, up, down;
  };
  LlamaModel() = default;
  void rmsNorm(const float *x, const std::vector<float> &weight, int64_t n,
               float *out) const;
  void rope(float *x, int64_t n, int64_t heads, int64_t position) const;

  ModelConfig config_;
  std::string fingerprint_;
  std::vector<float> embed_;
  std::vector<Layer> layers_;
  std::vector<float> invFreq_; ///< RoPE frequencies, head_dim / 2.
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_LLAMAMODEL_H
