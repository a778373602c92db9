//===- LlamaModel.h - The CPU reference model -------------------*- C++ -*-===//
//
// A Llama-family model (RMSNorm, RoPE with the config's base and scaling,
// grouped-query attention with a causal mask over the prefix, SwiGLU MLP)
// read from a Hugging Face checkpoint and run in fp32 on the CPU, GEMMs in
// OpenBLAS. It prefills tokens chunk by chunk and hands each layer's input
// hidden states, K (after RoPE) and V to the caller; it also projects stored
// hidden states back to K and V (HCache), and gives next-token logits
// (tied or separate output layer) for decoding after a restore. It is the
// ground truth every restore is verified against, and the ModelCompute the CPU
// backend runs restores with.
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

#include "kvc/Runtime/Model/ModelCompute.h"
#include "kvc/Runtime/Model/Safetensors.h"

#include <memory>
#include <string>
#include <vector>

namespace kvc {

/// The fingerprint LlamaModel::load(dir) gives the model in `dir` (its
/// config.json and weights), read without converting any weight: what a
/// compiler names a bundle's model by. NotFound when `dir` holds no weights.
StatusOr<std::string> modelFingerprint(const std::string &dir);

class LlamaModel final : public ModelCompute {
public:
  /// Loads config.json and the safetensors weights of `dir`, checking every
  /// tensor's presence and shape.
  static StatusOr<std::unique_ptr<LlamaModel>> load(const std::string &dir);

  const ModelConfig &config() const override { return config_; }
  const std::string &fingerprint() const override { return fingerprint_; }

  using ModelCompute::prefill;
  Status prefill(KVContext &context, int64_t position, const int32_t *tokens,
                 int64_t n, const LayerCallback &onLayer = {},
                 int64_t layers = -1) const override;
  void project(int64_t layer, const float *hidden, int64_t n, int64_t position,
               float *k, float *v) const override;
  Status nextLogits(KVContext &context, int64_t position, const int32_t *tokens,
                    int64_t n, float *logits) const override;

  /// Rows position .. position + n of the model's RoPE table (Rope.h):
  /// what its rotations use, and what a generated kernel reads.
  void ropeTable(int64_t position, int64_t n, float *out) const;

  /// The weights, fp32 as loaded (Hugging Face's shapes, [out][in]): what
  /// a backend computing on another device copies there.
  struct Layer {
    std::vector<float> attnNorm, q, k, v, o, mlpNorm, gate, up, down;
  };
  const Layer &layer(int64_t l) const { return layers_[l]; }
  const std::vector<float> &embedding() const { return embed_; }
  const std::vector<float> &finalNorm() const { return finalNorm_; }
  /// The output layer ([vocab][hidden]): the embedding when tied.
  const std::vector<float> &outputLayer() const {
    return lmHead_.empty() ? embed_ : lmHead_;
  }

private:
  LlamaModel() = default;
  void rmsNorm(const float *x, const std::vector<float> &weight, int64_t n,
               float *out) const;
  /// prefill, leaving the hidden states leaving the last layer in `x`
  /// ([n][hidden]) when every layer runs.
  Status forward(KVContext &context, int64_t position, const int32_t *tokens,
                 int64_t n, const LayerCallback &onLayer, int64_t layers,
                 std::vector<float> &x) const;

  ModelConfig config_;
  std::string fingerprint_;
  std::vector<float> embed_;
  std::vector<float> finalNorm_;
  std::vector<float> lmHead_; ///< Empty when tied to embed_.
  std::vector<Layer> layers_;
  std::vector<float> invFreq_; ///< RoPE frequencies, head_dim / 2.
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_LLAMAMODEL_H
