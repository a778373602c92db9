//===- ModelConfigTest.cpp - Tests for config.json parsing ----------------===//

#include "kvc/Runtime/Desc/ModelConfig.h"

#include <gtest/gtest.h>

using namespace kvc;

namespace {

std::string modelPath(const char *name) {
  return std::string(KVC_SOURCE_DIR) + "/examples/models/" + name;
}

std::string inputPath(const char *name) {
  return std::string(KVC_SOURCE_DIR) + "/test/Inputs/" + name;
}

/// A minimal valid config with `extra` appended; a repeated key overrides the
/// earlier one (the last duplicate wins when parsing).
std::string config(const std::string &extra) {
  return R"({"model_type": "llama", "num_hidden_layers": 4,
    "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
    "intermediate_size": 688, "vocab_size": 1000,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16", )" +
         extra + "}";
}

TEST(ModelConfig, Llama2_7B) {
  StatusOr<ModelConfig> model = loadModelConfig(modelPath("llama-2-7b/config.json"));
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->numLayers, 32);
  EXPECT_EQ(model->hiddenSize, 4096);
  EXPECT_EQ(model->numHeads, 32);
  EXPECT_EQ(model->numKvHeads, 32);
  EXPECT_EQ(model->headDim, 128);
  EXPECT_EQ(model->intermediateSize, 11008);
  EXPECT_EQ(model->dtype, DType::F16);
  EXPECT_DOUBLE_EQ(model->ropeTheta, 10000.0);
  EXPECT_EQ(model->kvBytesPerTokenLayer(), 2 * 32 * 128 * 2);
  EXPECT_EQ(model->name, "meta-llama/Llama-2-7b-hf");
}

TEST(ModelConfig, Llama31_8B_GQA) {
  StatusOr<ModelConfig> model =
      loadModelConfig(modelPath("llama-3.1-8b/config.json"));
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->numKvHeads, 8);
  EXPECT_EQ(model->headDim, 128);
  EXPECT_EQ(model->dtype, DType::BF16);
  EXPECT_DOUBLE_EQ(model->ropeTheta, 500000.0);
  EXPECT_EQ(model->ropeScaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_DOUBLE_EQ(model->ropeScaling.factor, 8.0);
  EXPECT_EQ(model->ropeScaling.originalMaxPositions, 8192);
  // With 8 of 32 KV heads, K+V is half the hidden state (MHA: twice it).
  EXPECT_EQ(model->hiddenBytesPerTokenLayer(), 2 * model->kvBytesPerTokenLayer());
}

TEST(ModelConfig, Qwen25_7B_BiasesQKVAndIgnoresItsUnusedWindow) {
  StatusOr<ModelConfig> model =
      loadModelConfig(modelPath("qwen2.5-7b/config.json"));
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->modelType, "qwen2");
  EXPECT_EQ(model->headDim, 128);
  EXPECT_EQ(model->numKvHeads, 4);
  EXPECT_DOUBLE_EQ(model->ropeTheta, 1000000.0);
  EXPECT_TRUE(model->qkvBias);
  EXPECT_FALSE(model->outputBias);
  EXPECT_FALSE(model->qkNorm);
}

TEST(ModelConfig, Qwen3_8B_NormsQAndK) {
  StatusOr<ModelConfig> model =
      loadModelConfig(modelPath("qwen3-8b/config.json"));
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->modelType, "qwen3");
  EXPECT_EQ(model->numLayers, 36);
  EXPECT_EQ(model->numKvHeads, 8);
  EXPECT_TRUE(model->qkNorm);
  EXPECT_FALSE(model->qkvBias);
  EXPECT_FALSE(model->outputBias);
}

TEST(ModelConfig, AttentionBiasBiasesEveryAttentionProjection) {
  StatusOr<ModelConfig> model =
      parseModelConfig(config(R"("attention_bias": true)"), "m");
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_TRUE(model->qkvBias);
  EXPECT_TRUE(model->outputBias);
}

/// transformers >= 5 writes RoPE's base and scaling in `rope_parameters`;
/// a Llama 3.1 saved so is the Llama 3.1 of the older spelling.
TEST(ModelConfig, RopeParametersOfTransformers5) {
  StatusOr<ModelConfig> model =
      parseModelConfig(config(R"("rope_parameters": {"rope_theta": 500000.0,
          "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192})"),
                       "m");
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  StatusOr<ModelConfig> older =
      loadModelConfig(modelPath("llama-3.1-8b/config.json"));
  ASSERT_TRUE(older.isOk()) << older.status().toString();
  EXPECT_DOUBLE_EQ(model->ropeTheta, 500000.0);
  EXPECT_EQ(model->ropeScaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_DOUBLE_EQ(model->ropeScaling.factor, older->ropeScaling.factor);
  EXPECT_DOUBLE_EQ(model->ropeScaling.lowFreqFactor,
                   older->ropeScaling.lowFreqFactor);
  EXPECT_DOUBLE_EQ(model->ropeScaling.highFreqFactor,
                   older->ropeScaling.highFreqFactor);
  EXPECT_EQ(model->ropeScaling.originalMaxPositions, 8192);

  StatusOr<ModelConfig> plain =
      parseModelConfig(config(R"("rope_parameters": {"rope_theta": 1000.0,
          "rope_type": "default"})"),
                       "m");
  ASSERT_TRUE(plain.isOk()) << plain.status().toString();
  EXPECT_DOUBLE_EQ(plain->ropeTheta, 1000.0);
  EXPECT_EQ(plain->ropeScaling.kind, RopeScaling::Kind::None);
}

/// A window no shorter than the context is full attention (transformers'
/// MistralConfig writes 4096 by default).
TEST(ModelConfig, AWindowAsLongAsTheContextIsFullAttention) {
  StatusOr<ModelConfig> model = parseModelConfig(
      config(R"("model_type": "mistral", "sliding_window": 4096)"), "m");
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_FALSE(model->qkvBias);
  EXPECT_EQ(model->slidingWindow, 0);
}

/// Mistral's window slides in every layer; kvc's attention slides it.
TEST(ModelConfig, AMistralWindowShorterThanTheContextSlides) {
  StatusOr<ModelConfig> model = parseModelConfig(
      config(R"("model_type": "mistral", "sliding_window": 1024)"), "m");
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->slidingWindow, 1024);
  StatusOr<ModelConfig> full = parseModelConfig(
      config(R"("model_type": "mistral", "sliding_window": 1024,
          "layer_types": ["full_attention", "full_attention"])"),
      "m");
  ASSERT_TRUE(full.isOk()) << full.status().toString();
  EXPECT_EQ(full->slidingWindow, 0);
}

TEST(ModelConfig, DefaultsFromMissingOptionalFields) {
  StatusOr<ModelConfig> model = parseModelConfig(
      R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "intermediate_size": 128,
          "vocab_size": 10, "max_position_embeddings": 128,
          "dtype": "float32"})",
      "tiny");
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ(model->name, "tiny");
  EXPECT_EQ(model->numKvHeads, 4);
  EXPECT_EQ(model->headDim, 16);
  EXPECT_EQ(model->dtype, DType::F32);
  EXPECT_DOUBLE_EQ(model->ropeTheta, 10000.0);
}

struct BadConfig {
  const char *name;
  std::string json;
  StatusCode code;
  const char *message;
};

/// How a failing case names itself (gtest's default is a hex dump).
void PrintTo(const BadConfig &c, std::ostream *os) { *os << c.name; }

class ModelConfigErrors : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ModelConfigErrors, RejectedWithFieldName) {
  const BadConfig &bad = GetParam();
  StatusOr<ModelConfig> model = parseModelConfig(bad.json, "m");
  ASSERT_FALSE(model.isOk());
  EXPECT_EQ(model.status().code(), bad.code) << model.status().toString();
  EXPECT_NE(model.status().message().find(bad.message), std::string::npos)
      << model.status().toString();
}

INSTANTIATE_TEST_SUITE_P(
    ModelConfig, ModelConfigErrors,
    ::testing::Values(
        BadConfig{"NotJson", "{\"model_type\": ", StatusCode::InvalidArgument,
                  "invalid JSON: parse error"},
        BadConfig{"NotObject", "[1, 2]", StatusCode::InvalidArgument,
                  "expected a JSON object"},
        BadConfig{"MissingLayers",
                  R"({"model_type": "llama", "hidden_size": 64})",
                  StatusCode::InvalidArgument,
                  "num_hidden_layers: missing required field"},
        BadConfig{"WrongType", config(R"("num_hidden_layers": "32")"),
                  StatusCode::InvalidArgument,
                  "num_hidden_layers: expected an integer, got string"},
        BadConfig{"UnknownModelType", config(R"("model_type": "gpt2")"),
                  StatusCode::Unimplemented, "model_type: \"gpt2\""},
        BadConfig{"UnknownDType", config(R"("torch_dtype": "int8")"),
                  StatusCode::InvalidArgument, "unknown dtype \"int8\""},
        BadConfig{"KvHeadsDoNotDivide", config(R"("num_key_value_heads": 3)"),
                  StatusCode::InvalidArgument,
                  "num_key_value_heads: 3 does not divide"},
        BadConfig{"HeadDimMismatch", config(R"("head_dim": 64)"),
                  StatusCode::InvalidArgument, "head_dim: num_attention_heads"},
        BadConfig{"ZeroLayers", config(R"("num_hidden_layers": 0)"),
                  StatusCode::InvalidArgument,
                  "num_hidden_layers: expected a positive integer"},
        BadConfig{"MlpBias", config(R"("mlp_bias": true)"),
                  StatusCode::Unimplemented, "mlp_bias"},
        BadConfig{"Gelu", config(R"("hidden_act": "gelu")"),
                  StatusCode::Unimplemented, "hidden_act"},
        BadConfig{"QwenSlidingWindow",
                  config(R"("model_type": "qwen2", "use_sliding_window": true,
                      "sliding_window": 1024)"),
                  StatusCode::Unimplemented, "sliding_window"},
        BadConfig{"SlidingLayers", config(R"("layer_types": ["full_attention",
                      "sliding_attention"])"),
                  StatusCode::Unimplemented, "layer_types"},
        BadConfig{"RopeParametersWithoutType",
                  config(R"("rope_parameters": {"rope_theta": 1000.0})"),
                  StatusCode::InvalidArgument,
                  "rope_parameters.type: missing required field"},
        BadConfig{"UnknownRopeParameters",
                  config(R"("rope_parameters": {"rope_type": "longrope",
                      "factor": 4})"),
                  StatusCode::Unimplemented,
                  "rope_parameters.rope_type: \"longrope\""},
        BadConfig{
            "UnknownRopeScaling",
            config(R"("rope_scaling": {"type": "longrope", "factor": 4})"),
            StatusCode::Unimplemented, "rope_scaling.type: \"longrope\""}),
    [](const ::testing::TestParamInfo<BadConfig> &info) {
      return std::string(info.param.name);
    });

TEST(ModelConfig, MalformedFile) {
  StatusOr<ModelConfig> model =
      loadModelConfig(inputPath("malformed/config.json"));
  ASSERT_FALSE(model.isOk());
  EXPECT_NE(model.status().message().find("malformed/config.json"),
            std::string::npos);
}

TEST(ModelConfig, MissingFile) {
  StatusOr<ModelConfig> model = loadModelConfig(inputPath("nope/config.json"));
  ASSERT_FALSE(model.isOk());
  EXPECT_EQ(model.status().code(), StatusCode::NotFound);
}

} // namespace
