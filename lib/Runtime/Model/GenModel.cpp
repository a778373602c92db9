//===- GenModel.cpp - Small random models in checkpoint format ------------===//

#include "kvc/Runtime/Model/GenModel.h"

#include "kvc/Runtime/Base/Memory.h"

#include "kvc/Runtime/Model/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

namespace kvc {

Status generateModel(const std::string &dir, const GenModelOptions &o) {
  ModelConfig check;
  check.modelType = "llama";
  check.numLayers = o.layers;
  check.hiddenSize = o.hidden;
  check.numHeads = o.heads;
  check.numKvHeads = o.kvHeads;
  check.headDim = o.heads > 0 ? o.hidden / o.heads : 0;
  check.intermediateSize = o.ffn;
  check.vocabSize = o.vocab;
  check.maxPositions = o.maxPositions;
  check.ropeTheta = o.ropeTheta;
  check.dtype = o.dtype;
  KVC_RETURN_IF_ERROR(check.validate());
  if (o.hidden % o.heads)
    return invalidArgument("hidden (" + std::to_string(o.hidden) +
                           ") must be a multiple of heads (" +
                           std::to_string(o.heads) + ")");

  // Sizes are checked against memory before anything is allocated: the
  // weights are held in fp32 and then written out in the model's dtype.
  const double h = double(o.hidden), d = h / double(o.heads);
  const double perLayer = 2 * h + 2 * h * double(o.heads) * d +
                          2 * h * double(o.kvHeads) * d + 3 * h * double(o.ffn);
  const double parameters =
      2 * double(o.vocab) * h + h + double(o.layers) * perLayer;
  const double needed = parameters * double(4 + dtypeBytes(o.dtype));
  if (const int64_t available = availableMemoryBytes();
      available > 0 && needed > double(available)) {
    char text[256];
    std::snprintf(text, sizeof(text),
                  "a model of %.3g parameters needs about %.1f GiB of memory "
                  "to generate; %.1f GiB is available",
                  parameters, needed / double(1 << 30),
                  double(available) / double(1 << 30));
    return failedPrecondition(text);
  }

  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  TensorMap tensors;
  auto random = [&](const std::string &name, std::vector<int64_t> shape) {
    Tensor t{shape, {}};
    t.data.resize(t.numel());
    for (float &x : t.data)
      x = normal(rng);
    tensors[name] = std::move(t);
  };
  auto ones = [&](const std::string &name, int64_t size) {
    tensors[name] = Tensor{{size}, std::vector<float>(size, 1.0f)};
  };
  const int64_t hidden = o.hidden, headDim = o.hidden / o.heads;
  random("model.embed_tokens.weight", {o.vocab, hidden});
  for (int64_t l = 0; l < o.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    ones(p + "input_layernorm.weight", hidden);
    random(p + "self_attn.q_proj.weight", {o.heads * headDim, hidden});
    random(p + "self_attn.k_proj.weight", {o.kvHeads * headDim, hidden});
    random(p + "self_attn.v_proj.weight", {o.kvHeads * headDim, hidden});
    random(p + "self_attn.o_proj.weight", {hidden, o.heads * headDim});
    ones(p + "post_attention_layernorm.weight", hidden);
    random(p + "mlp.gate_proj.weight", {o.ffn, hidden});
    random(p + "mlp.up_proj.weight", {o.ffn, hidden});
    random(p + "mlp.down_proj.weight", {hidden, o.ffn});
  }
  ones("model.norm.weight", hidden);
  random("lm_head.weight", {o.vocab, hidden});

  return writeModelDirectory(
      dir, check, tensors,
      nlohmann::json{{"kvc_generator_seed", o.seed}}.dump());
}

Status writeModelDirectory(const std::string &dir, const ModelConfig &c,
                           const TensorMap &tensors,
                           const std::string &extraFields) {
  KVC_RETURN_IF_ERROR(c.validate());
  if (c.ropeScaling.kind != RopeScaling::Kind::None)
    return unimplemented("writing a config with rope scaling");
  nlohmann::json extra = nlohmann::json::parse(extraFields, nullptr, false);
  if (!extra.is_object())
    return invalidArgument("extra config fields are not a JSON object");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    return unavailable(dir + ": " + error.message());
  const char *dtypeName = c.dtype == DType::BF16  ? "bfloat16"
                          : c.dtype == DType::F16 ? "float16"
                                                  : "float32";
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_act", "silu"},
                           {"num_hidden_layers", c.numLayers},
                           {"hidden_size", c.hiddenSize},
                           {"num_attention_heads", c.numHeads},
                           {"num_key_value_heads", c.numKvHeads},
                           {"head_dim", c.headDim},
                           {"intermediate_size", c.intermediateSize},
                           {"vocab_size", c.vocabSize},
                           {"max_position_embeddings", c.maxPositions},
                           {"rope_theta", c.ropeTheta},
                           {"rms_norm_eps", c.rmsNormEps},
                           {"tie_word_embeddings", c.tieWordEmbeddings},
                           {"torch_dtype", dtypeName}};
  config.update(extra);
  std::filesystem::path root(dir);
  {
    std::ofstream out(root / "config.json");
    out << config.dump(2) << "\n";
    if (!out)
      return unavailable(dir + ": cannot write config.json");
  }
  return writeSafetensors((root / "model.safetensors").string(), tensors,
                          c.dtype);
}

} // namespace kvc
