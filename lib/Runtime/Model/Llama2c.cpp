//===- Llama2c.cpp - Importing llama2.c checkpoints -----------------------===//

#include "kvc/Runtime/Model/Llama2c.h"

#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/Tokenizer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace kvc {

namespace {

/// The rows of a [heads * head_dim, cols] projection reordered from
/// interleaved RoPE pairs to rotated halves: within each head, row 2i + j
/// moves to j * head_dim / 2 + i (Meta's converter's
/// view(heads, head_dim / 2, 2, cols).transpose(1, 2)).
std::vector<float> interleavedToHalves(const float *w, int64_t heads,
                                       int64_t headDim, int64_t cols) {
  std::vector<float> out(size_t(heads * headDim * cols));
  const int64_t half = headDim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(&out[((h * headDim) + j * half + i) * cols],
                    &w[((h * headDim) + 2 * i + j) * cols],
                    size_t(cols) * sizeof(float));
  return out;
}

} // namespace

StatusOr<ModelConfig> importLlama2c(const std::string &checkpoint,
                                    const std::string &tokenizer,
                                    const std::string &dir) {
  std::ifstream in(checkpoint, std::ios::binary);
  if (!in)
    return notFound(checkpoint + ": cannot open the checkpoint");
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  int32_t header[7];
  if (bytes.size() < sizeof(header))
    return dataLoss(checkpoint + ": " + std::to_string(bytes.size()) +
                    " bytes, shorter than a llama2.c header");
  std::memcpy(header, bytes.data(), sizeof(header));
  const char *names[] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                         "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i)
    if (header[i] == 0 || (header[i] < 0 && i != 5))
      return invalidArgument(checkpoint + ": header " + names[i] + " is " +
                             std::to_string(header[i]));
  const bool tied = header[5] > 0;
  ModelConfig c;
  c.name = std::filesystem::path(checkpoint).stem().string();
  c.modelType = "llama";
  c.hiddenSize = header[0];
  c.intermediateSize = header[1];
  c.numLayers = header[2];
  c.numHeads = header[3];
  c.numKvHeads = header[4];
  c.vocabSize = tied ? header[5] : -int64_t(header[5]);
  c.maxPositions = header[6];
  c.tieWordEmbeddings = tied;
  c.dtype = DType::F32;
  if (c.hiddenSize % c.numHeads || c.numHeads % c.numKvHeads ||
      (c.hiddenSize / c.numHeads) % 2)
    return invalidArgument(
        checkpoint + ": " + std::to_string(c.numHeads) + " heads and " +
        std::to_string(c.numKvHeads) + " KV heads do not divide dim " +
        std::to_string(c.hiddenSize) + " into even head dimensions");
  c.headDim = c.hiddenSize / c.numHeads;
  KVC_RETURN_IF_ERROR(c.validate());

  const int64_t d = c.hiddenSize, f = c.intermediateSize, L = c.numLayers,
                kv = c.numKvHeads * c.headDim, v = c.vocabSize;
  // The body, in file order; "" marks what is skipped.
  struct Part {
    std::string name; ///< Per layer when it contains '#'.
    std::vector<int64_t> shape;
    bool perLayer;
  };
  const std::vector<Part> parts = {
      {"model.embed_tokens.weight", {v, d}, false},
      {"model.layers.#.input_layernorm.weight", {d}, true},
      {"model.layers.#.self_attn.q_proj.weight", {d, d}, true},
      {"model.layers.#.self_attn.k_proj.weight", {kv, d}, true},
      {"model.layers.#.self_attn.v_proj.weight", {kv, d}, true},
      {"model.layers.#.self_attn.o_proj.weight", {d, d}, true},
      {"model.layers.#.post_attention_layernorm.weight", {d}, true},
      {"model.layers.#.mlp.gate_proj.weight", {f, d}, true},
      {"model.layers.#.mlp.down_proj.weight", {d, f}, true},
      {"model.layers.#.mlp.up_proj.weight", {f, d}, true},
      {"model.norm.weight", {d}, false},
      {"", {c.maxPositions * c.headDim}, false}, // Legacy RoPE tables.
      {"lm_head.weight", {v, d}, false},
  };
  auto numel = [](const std::vector<int64_t> &shape) {
    int64_t n = 1;
    for (int64_t x : shape)
      n *= x;
    return n;
  };
  int64_t floats = 0;
  for (const Part &part : parts)
    if (part.name != "lm_head.weight" || !tied)
      floats += numel(part.shape) * (part.perLayer ? L : 1);
  const uint64_t expected = sizeof(header) + uint64_t(floats) * 4;
  if (bytes.size() != expected)
    return dataLoss(checkpoint + ": " + std::to_string(bytes.size()) +
                    " bytes, the header's dimensions need " +
                    std::to_string(expected) + " (truncated, or not a " +
                    "llama2.c checkpoint)");

  TensorMap tensors;
  const float *at =
      reinterpret_cast<const float *>(bytes.data() + sizeof(header));
  std::vector<float> aligned; // The body is 4-byte aligned only by luck.
  aligned.assign(size_t(floats), 0.0f);
  std::memcpy(aligned.data(), at, size_t(floats) * 4);
  const float *next = aligned.data();
  for (const Part &part : parts) {
    if (part.name == "lm_head.weight" && tied)
      continue;
    const int64_t n = numel(part.shape);
    for (int64_t l = 0; l < (part.perLayer ? L : 1); ++l, next += n) {
      if (part.name.empty())
        continue;
      std::string name = part.name;
      if (size_t hash = name.find('#'); hash != std::string::npos)
        name.replace(hash, 1, std::to_string(l));
      Tensor t{part.shape, {next, next + n}};
      if (name.find("q_proj") != std::string::npos)
        t.data = interleavedToHalves(next, c.numHeads, c.headDim, d);
      else if (name.find("k_proj") != std::string::npos)
        t.data = interleavedToHalves(next, c.numKvHeads, c.headDim, d);
      tensors[name] = std::move(t);
    }
  }
  // The tokenizer is checked before anything is written: a model with
  // another vocabulary's tokenizer decodes to nonsense.
  if (!tokenizer.empty())
    KVC_RETURN_IF_ERROR(Tokenizer::load(tokenizer, c.vocabSize).status());
  KVC_RETURN_IF_ERROR(writeModelDirectory(dir, c, tensors));
  if (!tokenizer.empty()) {
    std::error_code error;
    std::filesystem::copy_file(
        tokenizer, std::filesystem::path(dir) / "tokenizer.bin",
        std::filesystem::copy_options::overwrite_existing, error);
    if (error)
      return unavailable(dir +
                         ": cannot copy the tokenizer: " + error.message());
  }
  return c;
}

std::string tokenizerPath(const std::string &modelDir) {
  std::filesystem::path path =
      std::filesystem::path(modelDir) / "tokenizer.bin";
  return std::filesystem::exists(path) ? path.string() : "";
}

} // namespace kvc
