//===- LlamaModel.h - The CPU reference model -------------------*- C++ -*-===//
//
// A Llama-family model (RMSNorm, RoPE with the config's base and scaling,
// grouped-query attention with a causal mask over the prefix, SwiGLU MLP;
// Qwen2's q/k/v biases, Qwen3's per-head q/k norms, `attention_bias`)
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
// Weights: the checkpoint stays mapped (Checkpoint, Safetensors.h) and its
// tensors are viewed as stored (stored*(): what a device copies to its
// memory without an fp32 copy on the host). The fp32 weights the host's
// compute uses are made from them on load, or, loaded with
// hostWeights = false, on the first host-side use (a model that computes
// on a GPU never makes them).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_LLAMAMODEL_H
#define KVC_RUNTIME_MODEL_LLAMAMODEL_H

#include "kvc/Runtime/Model/ModelCompute.h"
#include "kvc/Runtime/Model/Safetensors.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvc {

/// The fingerprint LlamaModel::load(dir) gives the model in `dir` (its
/// config.json and weights), read without converting any weight: what a
/// compiler names a bundle's model by. NotFound when `dir` holds no weights.
StatusOr<std::string> modelFingerprint(const std::string &dir);

class LlamaModel final : public ModelCompute {
public:
  struct LoadOptions {
    /// Whether the fp32 weights are made on load; when false, on the first
    /// host-side use (compute, or layer(), embedding(), ...).
    bool hostWeights = true;
  };
  /// Loads config.json and the safetensors weights of `dir`, checking every
  /// tensor's presence and shape.
  static StatusOr<std::unique_ptr<LlamaModel>> load(const std::string &dir,
                                                    LoadOptions options);
  static StatusOr<std::unique_ptr<LlamaModel>> load(const std::string &dir) {
    return load(dir, LoadOptions());
  }
  ~LlamaModel() override;

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

  /// The weights as fp32 on the host (Hugging Face's shapes, [out][in]),
  /// made on first use when loaded without them.
  struct Layer {
    std::vector<float> attnNorm, q, k, v, o, mlpNorm, gate, up, down;
    /// Empty where the model has none (ModelConfig::qkvBias, outputBias,
    /// qkNorm): the projections' biases, q's and k's per-head norms.
    std::vector<float> qBias, kBias, vBias, oBias, qNorm, kNorm;
  };
  const Layer &layer(int64_t l) const { return hostWeights().layers_[l]; }
  const std::vector<float> &embedding() const { return hostWeights().embed_; }
  const std::vector<float> &finalNorm() const {
    return hostWeights().finalNorm_;
  }
  /// The output layer ([vocab][hidden]): the embedding when tied.
  const std::vector<float> &outputLayer() const {
    const LlamaModel &w = hostWeights();
    return w.lmHead_.empty() ? w.embed_ : w.lmHead_;
  }
  /// Whether the fp32 weights have been made.
  bool hasHostWeights() const;

  /// The weights as the checkpoint stores them, in the mapped files (the
  /// same shapes; BF16, F16 or F32): what a device copies to its memory.
  struct StoredLayer {
    TensorView attnNorm, q, k, v, o, mlpNorm, gate, up, down;
    /// No data where the model has none.
    TensorView qBias, kBias, vBias, oBias, qNorm, kNorm;
  };
  const StoredLayer &storedLayer(int64_t l) const { return stored_[l]; }
  const TensorView &storedEmbedding() const { return storedEmbed_; }
  const TensorView &storedFinalNorm() const { return storedFinalNorm_; }
  /// The output layer as stored: the embedding's when tied.
  const TensorView &storedOutput() const { return storedOutput_; }

private:
  LlamaModel();
  /// This model, its fp32 weights made if they were not.
  const LlamaModel &hostWeights() const;
  void rmsNorm(const float *x, const std::vector<float> &weight, int64_t n,
               float *out) const;
  /// Layer `L`'s K (biased, normed per head, rotated) and V (biased) of `n`
  /// tokens' normed hidden states, rounded to bf16 as the cache holds them.
  void keys(const Layer &L, const float *normed, int64_t n,
            const float *rotations, float *k, float *v) const;
  /// prefill, leaving the hidden states leaving the last layer in `x`
  /// ([n][hidden]) when every layer runs.
  Status forward(KVContext &context, int64_t position, const int32_t *tokens,
                 int64_t n, const LayerCallback &onLayer, int64_t layers,
                 std::vector<float> &x) const;

  ModelConfig config_;
  std::string fingerprint_;
  std::vector<float> invFreq_; ///< RoPE frequencies, head_dim / 2.
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<StoredLayer> stored_;
  /// The output layer's view is the embedding's when they are tied.
  TensorView storedEmbed_, storedFinalNorm_, storedOutput_;
  /// Made from the stored weights once (hostOnce_).
  mutable std::once_flag hostOnce_;
  mutable std::atomic<bool> hasHostWeights_{false};
  mutable std::vector<float> embed_;
  mutable std::vector<float> finalNorm_;
  mutable std::vector<float> lmHead_; ///< Empty when tied to embed_.
  mutable std::vector<Layer> layers_;
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_LLAMAMODEL_H
