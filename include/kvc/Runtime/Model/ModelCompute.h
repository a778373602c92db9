//===- ModelCompute.h - The model a restore computes with -------*- C++ -*-===//
//
// What a restore needs from a Llama-family model: prefill tokens into a KV
// context (Cake's computed front, HCache's recomputed layers, fallbacks) and
// project stored hidden states to K and V (HCache). kvc's reference model
// (LlamaModel) implements it on the CPU; a server hands kvc its own model's
// compute through the same interface, and backends run restores over
// whichever they are given.
//
// A model that can also decode (nextLogits) lets a caller check a restore
// by what the model says next. Prefill and projection produce K after RoPE
// and V rounded to bf16, as a paged cache holds them, so a restore that
// computes part of a request writes what a full prefill would.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_MODELCOMPUTE_H
#define KVC_RUNTIME_MODEL_MODELCOMPUTE_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Model/Attention.h"

#include <functional>
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
/// layer: fp32 vectors (ModelCompute::Cache), or a restore's paged cache.
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

class ModelCompute {
public:
  virtual ~ModelCompute() = default;

  virtual const ModelConfig &config() const = 0;
  /// SHA-256 (hex) over the architecture and every weight: two models share
  /// stored chunks only when this matches.
  virtual const std::string &fingerprint() const = 0;

  using LayerCallback = std::function<void(const LayerSnapshot &)>;

  /// Runs `n` tokens at positions position.. through the first `layers`
  /// layers (all when negative) over `context`, which holds tokens
  /// [0, position) of those layers: appends the new tokens' K and V to it,
  /// attends over it, and calls `onLayer` for each layer.
  virtual Status prefill(KVContext &context, int64_t position,
                         const int32_t *tokens, int64_t n,
                         const LayerCallback &onLayer = {},
                         int64_t layers = -1) const = 0;

  /// K (after RoPE) and V of `layer` for `n` tokens at positions
  /// position.. from the hidden states entering the layer, bf16-rounded as
  /// a prefill's are.
  virtual void project(int64_t layer, const float *hidden, int64_t n,
                       int64_t position, float *k, float *v) const = 0;

  /// Runs `n` tokens at positions position.. through every layer over
  /// `context` as prefill does, then the final norm and the output layer:
  /// the next-token logits ([vocab]) after the last of them. A decode step
  /// after a restore. Models that only restore (a server's own compute)
  /// may leave it Unimplemented.
  virtual Status nextLogits(KVContext & /*context*/, int64_t /*position*/,
                            const int32_t * /*tokens*/, int64_t /*n*/,
                            float * /*logits*/) const {
    return unimplemented("this model computes no logits");
  }

  int64_t kvDim() const { return config().numKvHeads * config().headDim; }

  /// FLOPs of prefilling `tokens` tokens through `layers` layers: the
  /// projections and the MLP (attention, which grows with the position, is
  /// left out, as in every FLOP count the runtime reports).
  double prefillFlops(int64_t tokens, int64_t layers) const {
    const ModelConfig &c = config();
    const double h = double(c.hiddenSize), kv = double(kvDim());
    return 2.0 * double(tokens) * double(layers) *
           (2 * h * h + 2 * h * kv + 3 * h * double(c.intermediateSize));
  }
  /// FLOPs of projecting `tokens` tokens' hidden states of `layers` layers
  /// to K and V (HCache).
  double projectFlops(int64_t tokens, int64_t layers) const {
    return 2.0 * double(tokens) * double(layers) * double(config().hiddenSize) *
           2 * double(kvDim());
  }

  /// The KV of every layer for the tokens prefilled so far, fp32: a full
  /// prefill's, which restores are verified against.
  struct Cache final : KVContext {
    int64_t tokens = 0;
    int64_t dim = 0;                      ///< kvDim.
    std::vector<std::vector<float>> k, v; ///< Per layer, [tokens][kvDim].

    Status append(int64_t layer, int64_t position, int64_t n, const float *k,
                  const float *v) override;
    Status rows(int64_t layer, int64_t first, int64_t count,
                KeyValueRows &out) override;
  };
  Cache newCache() const;

  /// Runs `n` tokens at positions cache.tokens.. through every layer (or
  /// the first `layers`), appending their KV to `cache`. Layers left out
  /// fall behind cache.tokens and must not be prefilled further.
  Status prefill(Cache &cache, const int32_t *tokens, int64_t n,
                 const LayerCallback &onLayer = {}, int64_t layers = -1) const;
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_MODELCOMPUTE_H
