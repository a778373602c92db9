//===- ModelConfig.cpp - Llama-family model descriptions ------------------===//

#include "kvc/Runtime/Desc/ModelConfig.h"

#include "Json.h"

#include <cmath>
#include <filesystem>
#include <utility>

namespace kvc {

using namespace json_detail;

const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::F32:
    return "f32";
  }
  return "unknown";
}

int64_t dtypeBytes(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

Status ModelConfig::validate() const {
  struct {
    const char *field;
    int64_t value;
  } sizes[] = {{"num_hidden_layers", numLayers},
               {"hidden_size", hiddenSize},
               {"num_attention_heads", numHeads},
               {"num_key_value_heads", numKvHeads},
               {"head_dim", headDim},
               {"intermediate_size", intermediateSize},
               {"vocab_size", vocabSize},
               {"max_position_embeddings", maxPositions}};
  for (const auto &size : sizes)
    if (size.value <= 0)
      return invalidArgument(std::string(size.field) +
                             ": expected a positive integer, got " +
                             std::to_string(size.value));
  if (numHeads % numKvHeads != 0)
    return invalidArgument("num_key_value_heads: " +
                           std::to_string(numKvHeads) +
                           " does not divide num_attention_heads " +
                           std::to_string(numHeads));
  if (numHeads * headDim != hiddenSize)
    return invalidArgument(
        "head_dim: num_attention_heads * head_dim = " +
        std::to_string(numHeads) + " * " + std::to_string(headDim) +
        " differs from hidden_size " + std::to_string(hiddenSize));
  KVC_RETURN_IF_ERROR(checkPositive(ropeTheta, "rope_theta"));
  KVC_RETURN_IF_ERROR(checkPositive(rmsNormEps, "rms_norm_eps"));
  return Status::ok();
}

namespace {

bool isSupportedModelType(const std::string &type) {
  return type == "llama" || type == "mistral" || type == "qwen2" ||
         type == "qwen3";
}

Status parseDType(const Json &obj, ModelConfig &config) {
  // Transformers >= 4.56 writes `dtype`; older releases `torch_dtype`.
  const char *key = obj.contains("dtype") ? "dtype" : "torch_dtype";
  std::string name;
  KVC_RETURN_IF_ERROR(readString(obj, "", key, name, Presence::Required));
  if (name == "bfloat16")
    config.dtype = DType::BF16;
  else if (name == "float16")
    config.dtype = DType::F16;
  else if (name == "float32")
    config.dtype = DType::F32;
  else
    return invalidArgument(std::string(key) + ": unknown dtype \"" + name +
                           "\" (expected bfloat16, float16 or float32)");
  return Status::ok();
}

/// YaRN's fields (transformers' _compute_yarn_parameters): the context
/// it was trained for (the model's when absent), the ramp's bounds, and the
/// factor the cosines and sines are scaled by (given, or from `factor`,
/// `mscale` and `mscale_all_dim`).
Status parseYarn(const Json &scaling, const char *key, ModelConfig &config) {
  RopeScaling &rope = config.ropeScaling;
  rope.kind = RopeScaling::Kind::Yarn;
  rope.originalMaxPositions = config.maxPositions;
  KVC_RETURN_IF_ERROR(readInt(scaling, key, "original_max_position_embeddings",
                              rope.originalMaxPositions, Presence::Optional));
  for (auto [field, out] : {std::pair{"beta_fast", &rope.betaFast},
                            std::pair{"beta_slow", &rope.betaSlow}})
    if (scaling.contains(field) && !scaling[field].is_null())
      KVC_RETURN_IF_ERROR(
          readNumber(scaling, key, field, *out, Presence::Required));
  KVC_RETURN_IF_ERROR(
      readBool(scaling, key, "truncate", rope.truncate, Presence::Optional));
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  double m = 0, mAll = 0;
  for (auto [field, out] :
       {std::pair{"mscale", &m}, std::pair{"mscale_all_dim", &mAll}})
    if (scaling.contains(field) && !scaling[field].is_null())
      KVC_RETURN_IF_ERROR(
          readNumber(scaling, key, field, *out, Presence::Required));
  rope.attentionFactor =
      m != 0 && mAll != 0 ? mscale(rope.factor, m) / mscale(rope.factor, mAll)
                          : mscale(rope.factor, 1);
  if (scaling.contains("attention_factor") &&
      !scaling["attention_factor"].is_null())
    KVC_RETURN_IF_ERROR(readNumber(scaling, key, "attention_factor",
                                   rope.attentionFactor, Presence::Required));
  KVC_RETURN_IF_ERROR(
      checkPositive(double(rope.originalMaxPositions),
                    std::string(key) + ".original_max_position_embeddings"));
  return checkPositive(rope.attentionFactor,
                       std::string(key) + ".attention_factor");
}

/// RoPE's base and scaling: transformers >= 5 writes both in
/// `rope_parameters` ({"rope_theta", "rope_type", and the type's fields});
/// older releases `rope_theta` beside `rope_scaling` ({"type" or
/// "rope_type", ...}, or null). A file with either is read the same way.
Status parseRope(const Json &obj, ModelConfig &config) {
  const char *key =
      obj.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  KVC_RETURN_IF_ERROR(
      readNumber(obj, "", "rope_theta", config.ropeTheta, Presence::Optional));
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return checkPositive(config.ropeTheta, "rope_theta");
  KVC_RETURN_IF_ERROR(expectObject(*it, key));
  const Json &scaling = *it;
  KVC_RETURN_IF_ERROR(readNumber(scaling, key, "rope_theta", config.ropeTheta,
                                 Presence::Optional));
  KVC_RETURN_IF_ERROR(checkPositive(config.ropeTheta, "rope_theta"));
  std::string type;
  const char *typeKey = scaling.contains("rope_type") ? "rope_type" : "type";
  KVC_RETURN_IF_ERROR(
      readString(scaling, key, typeKey, type, Presence::Required));
  RopeScaling &rope = config.ropeScaling;
  if (type == "default") {
    rope.kind = RopeScaling::Kind::None;
    return Status::ok();
  }
  KVC_RETURN_IF_ERROR(
      readNumber(scaling, key, "factor", rope.factor, Presence::Required));
  if (type == "linear") {
    rope.kind = RopeScaling::Kind::Linear;
  } else if (type == "llama3") {
    rope.kind = RopeScaling::Kind::Llama3;
    KVC_RETURN_IF_ERROR(readNumber(scaling, key, "low_freq_factor",
                                   rope.lowFreqFactor, Presence::Required));
    KVC_RETURN_IF_ERROR(readNumber(scaling, key, "high_freq_factor",
                                   rope.highFreqFactor, Presence::Required));
    KVC_RETURN_IF_ERROR(readInt(scaling, key,
                                "original_max_position_embeddings",
                                rope.originalMaxPositions, Presence::Required));
  } else if (type == "yarn") {
    KVC_RETURN_IF_ERROR(parseYarn(scaling, key, config));
  } else {
    return unimplemented(std::string(key) + "." + typeKey + ": \"" + type +
                         "\" is not supported (kvc implements linear, llama3 "
                         "and yarn)");
  }
  return checkPositive(rope.factor, std::string(key) + ".factor");
}

/// The attention's extras by family: Qwen2 biases q, k and v; Llama's,
/// Mistral's and Qwen3's `attention_bias` biases q, k, v and o; Qwen3
/// normalizes each head of q and k.
Status parseAttention(const Json &obj, ModelConfig &config) {
  bool bias = false;
  KVC_RETURN_IF_ERROR(
      readBool(obj, "", "attention_bias", bias, Presence::Optional));
  config.qkvBias = bias || config.modelType == "qwen2";
  config.outputBias = bias && config.modelType != "qwen2";
  config.qkNorm = config.modelType == "qwen3";
  return Status::ok();
}

/// Rejects architecture features that the Llama data path does not model,
/// and reads the window every layer's attention slides (Mistral's).
Status rejectUnsupported(const Json &obj, ModelConfig &config) {
  std::string act = "silu";
  KVC_RETURN_IF_ERROR(readString(obj, "", "hidden_act", act,
                                 Presence::Optional));
  if (act != "silu")
    return unimplemented("hidden_act: \"" + act +
                         "\" is not supported (Llama-family models use silu)");
  bool bias = false;
  KVC_RETURN_IF_ERROR(readBool(obj, "", "mlp_bias", bias, Presence::Optional));
  if (bias)
    return unimplemented("mlp_bias: biased MLP projections are not supported");
  // Qwen's configs name a window their attention does not use unless
  // `use_sliding_window`, and then only in some layers.
  bool windowed = true;
  KVC_RETURN_IF_ERROR(
      readBool(obj, "", "use_sliding_window", windowed, Presence::Optional));
  if (windowed && obj.contains("use_sliding_window") &&
      config.modelType.rfind("qwen", 0) == 0)
    return unimplemented("use_sliding_window: " + config.modelType +
                         "'s sliding windows, which differ by layer, are not "
                         "supported");
  int64_t window = 0;
  if (windowed)
    KVC_RETURN_IF_ERROR(
        readInt(obj, "", "sliding_window", window, Presence::Optional));
  auto types = obj.find("layer_types");
  if (windowed && types != obj.end() && types->is_array()) {
    bool full = false, sliding = false;
    for (const Json &type : *types) {
      const std::string name = type.is_string() ? type.get<std::string>() : "";
      full |= name == "full_attention";
      sliding |= name == "sliding_attention";
      if (name != "full_attention" && name != "sliding_attention")
        return unimplemented("layer_types: \"" + name +
                             "\" layers are not supported (kvc implements "
                             "full_attention and sliding_attention)");
    }
    if (full && sliding)
      return unimplemented("layer_types: models mixing full-attention and "
                           "sliding-window layers are not supported");
    if (!sliding)
      window = 0;
  }
  // A window as long as the context changes nothing.
  config.slidingWindow =
      window > 0 && window < config.maxPositions ? window : 0;
  return Status::ok();
}

} // namespace

StatusOr<ModelConfig> parseModelConfig(std::string_view text,
                                       std::string_view defaultName) {
  StatusOr<Json> parsed = parseJson(text);
  if (!parsed.isOk())
    return parsed.status();
  const Json &obj = *parsed;
  KVC_RETURN_IF_ERROR(expectObject(obj, ""));

  ModelConfig config;
  config.name = std::string(defaultName);
  KVC_RETURN_IF_ERROR(
      readString(obj, "", "_name_or_path", config.name, Presence::Optional));
  KVC_RETURN_IF_ERROR(
      readString(obj, "", "model_type", config.modelType, Presence::Required));
  if (!isSupportedModelType(config.modelType))
    return unimplemented("model_type: \"" + config.modelType +
                         "\" is not a supported Llama-family model (expected "
                         "llama, mistral, qwen2 or qwen3)");

  struct {
    const char *key;
    int64_t *out;
  } required[] = {{"num_hidden_layers", &config.numLayers},
                  {"hidden_size", &config.hiddenSize},
                  {"num_attention_heads", &config.numHeads},
                  {"intermediate_size", &config.intermediateSize},
                  {"vocab_size", &config.vocabSize},
                  {"max_position_embeddings", &config.maxPositions}};
  for (const auto &field : required)
    KVC_RETURN_IF_ERROR(
        readInt(obj, "", field.key, *field.out, Presence::Required));

  config.numKvHeads = config.numHeads;
  KVC_RETURN_IF_ERROR(readInt(obj, "", "num_key_value_heads",
                              config.numKvHeads, Presence::Optional));
  if (config.numHeads > 0)
    config.headDim = config.hiddenSize / config.numHeads;
  KVC_RETURN_IF_ERROR(
      readInt(obj, "", "head_dim", config.headDim, Presence::Optional));
  config.rmsNormEps = 1e-6; // LlamaConfig's default.
  KVC_RETURN_IF_ERROR(readNumber(obj, "", "rms_norm_eps", config.rmsNormEps,
                                 Presence::Optional));
  KVC_RETURN_IF_ERROR(readBool(obj, "", "tie_word_embeddings",
                               config.tieWordEmbeddings, Presence::Optional));
  KVC_RETURN_IF_ERROR(parseDType(obj, config));
  KVC_RETURN_IF_ERROR(parseRope(obj, config));
  KVC_RETURN_IF_ERROR(parseAttention(obj, config));
  KVC_RETURN_IF_ERROR(rejectUnsupported(obj, config));
  KVC_RETURN_IF_ERROR(config.validate());
  return config;
}

StatusOr<ModelConfig> loadModelConfig(const std::string &path) {
  std::string text;
  KVC_RETURN_IF_ERROR(readFile(path, text));
  std::filesystem::path dir =
      std::filesystem::absolute(std::filesystem::path(path)).parent_path();
  StatusOr<ModelConfig> config =
      parseModelConfig(text, dir.filename().string());
  if (!config.isOk())
    return config.status().withContext(path);
  return config;
}

} // namespace kvc
