//===- ModelConfig.h - Llama-family model descriptions ----------*- C++ -*-===//
//
// A `ModelConfig` is the architecture of a Llama-family model as read from a
// Hugging Face `config.json`. The compiler turns it into `#kvc.model`; the
// runtime uses it to size caches and run the reference forward pass. This is
// the one parser of config.json in kvc.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DESC_MODELCONFIG_H
#define KVC_RUNTIME_DESC_MODELCONFIG_H

#include "kvc/Runtime/Base/Status.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace kvc {

/// Element types of weights and caches.
enum class DType { BF16, F16, F32 };

/// "bf16", "f16", "f32" (the MLIR spelling).
const char *dtypeName(DType dtype);
/// Bytes per element.
int64_t dtypeBytes(DType dtype);

/// RoPE frequency scaling (`rope_scaling` in config.json).
struct RopeScaling {
  enum class Kind { None, Linear, Llama3, Yarn };
  Kind kind = Kind::None;
  double factor = 1.0;
  double lowFreqFactor = 1.0;            // llama3 only
  double highFreqFactor = 1.0;           // llama3 only
  int64_t originalMaxPositions = 0;      // llama3 and yarn
  double betaFast = 32, betaSlow = 1;    // yarn only
  bool truncate = true;                  // yarn only
  /// What yarn multiplies the cosines and sines by (1 otherwise).
  double attentionFactor = 1.0;
};

struct ModelConfig {
  std::string name;      ///< `_name_or_path`, or the caller's default.
  std::string modelType; ///< llama | mistral | qwen2 | qwen3
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  int64_t intermediateSize = 0;
  int64_t vocabSize = 0;
  int64_t maxPositions = 0;
  double ropeTheta = 10000.0;
  double rmsNormEps = 1e-5;
  DType dtype = DType::BF16;
  RopeScaling ropeScaling;
  bool tieWordEmbeddings = false;
  /// Biases on the q, k and v projections (Qwen2; `attention_bias`).
  bool qkvBias = false;
  /// A bias on the output projection (`attention_bias` outside Qwen2).
  bool outputBias = false;
  /// RMSNorm over each head of q and k before RoPE (Qwen3's q_norm, k_norm).
  bool qkNorm = false;
  /// The keys each token attends to, itself included, in every layer
  /// (Mistral's `sliding_window`); 0: all before it.
  int64_t slidingWindow = 0;

  /// Checks that the shape is one kvc can run: positive sizes, kv_heads
  /// dividing heads, heads * head_dim == hidden. Messages name the fields.
  Status validate() const;

  /// Bytes of K and V for one token in one layer.
  int64_t kvBytesPerTokenLayer() const {
    return 2 * numKvHeads * headDim * dtypeBytes(dtype);
  }
  /// Bytes of the hidden state entering a layer, for one token.
  int64_t hiddenBytesPerTokenLayer() const {
    return hiddenSize * dtypeBytes(dtype);
  }
};

/// Parses the text of a Hugging Face config.json. `defaultName` names the
/// model when the file has no `_name_or_path`. Missing required fields, wrong
/// JSON types and features kvc does not implement (MLP biases, windows
/// that differ by layer, unknown rope scaling, non-SiLU activations) are
/// InvalidArgument or Unimplemented errors naming the field.
/// RoPE's base and scaling are read from transformers 5's `rope_parameters`
/// or the older `rope_theta` and `rope_scaling`.
StatusOr<ModelConfig> parseModelConfig(std::string_view json,
                                       std::string_view defaultName);

/// Reads and parses `path`; the default name is the parent directory's name.
StatusOr<ModelConfig> loadModelConfig(const std::string &path);

} // namespace kvc

#endif // KVC_RUNTIME_DESC_MODELCONFIG_H
