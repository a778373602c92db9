//===- LlamaModel.cpp - The CPU reference model ---------------------------===//

#include "kvc/Runtime/Model/LlamaModel.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Base/Sha256.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace kvc {

namespace {

/// y[n][out] = x[n][in] * W[out][in]^T.
void linear(const float *x, const std::vector<float> &w, int64_t n,
            int64_t in, int64_t out, float *y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out),
              int(in), 1.0f, x, int(in), w.data(), int(in), 0.0f, y, int(out));
}

/// A model's fingerprint: its shape and the digest of its weights.
std::string fingerprintOf(const ModelConfig &c,
                          const std::string &weightsDigest) {
  Sha256 hash;
  hash.update(c.modelType)
      .update(uint64_t(c.numLayers))
      .update(uint64_t(c.hiddenSize))
      .update(uint64_t(c.numHeads))
      .update(uint64_t(c.numKvHeads))
      .update(uint64_t(c.headDim))
      .update(uint64_t(c.intermediateSize))
      .update(std::to_string(c.ropeTheta))
      .update(weightsDigest);
  return toHex(hash.finish());
}

/// Rounds `n` values to bf16, the element type of the KV cache.
void roundToBf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = bf16ToFloat(floatToBf16(x[i]));
}

/// Moves tensor `name` out of `tensors` after checking its shape.
Status take(TensorMap &tensors, const std::string &name,
            std::vector<int64_t> shape, std::vector<float> &out) {
  auto it = tensors.find(name);
  if (it == tensors.end())
    return invalidArgument("checkpoint has no tensor " + name);
  if (it->second.shape != shape) {
    auto str = [](const std::vector<int64_t> &s) {
      std::string text = "[";
      for (size_t i = 0; i < s.size(); ++i)
        text += (i ? ", " : "") + std::to_string(s[i]);
      return text + "]";
    };
    return invalidArgument("tensor " + name + " has shape " +
                           str(it->second.shape) + ", config.json implies " +
                           str(shape));
  }
  out = std::move(it->second.data);
  return Status::ok();
}

} // namespace

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string &dir) {
  StatusOr<ModelConfig> config =
      loadModelConfig((std::filesystem::path(dir) / "config.json").string());
  if (!config.isOk())
    return config.status();
  std::string weightsDigest;
  StatusOr<TensorMap> tensors = loadSafetensors(dir, &weightsDigest);
  if (!tensors.isOk())
    return tensors.status();

  std::unique_ptr<LlamaModel> model(new LlamaModel());
  ModelConfig &c = model->config_;
  c = *config;
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
                kv = c.numKvHeads * c.headDim, f = c.intermediateSize;
  TensorMap &t = *tensors;
  KVC_RETURN_IF_ERROR(
      take(t, "model.embed_tokens.weight", {c.vocabSize, h}, model->embed_));
  model->layers_.resize(c.numLayers);
  for (int64_t l = 0; l < c.numLayers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    Layer &L = model->layers_[l];
    KVC_RETURN_IF_ERROR(take(t, p + "input_layernorm.weight", {h}, L.attnNorm));
    KVC_RETURN_IF_ERROR(take(t, p + "self_attn.q_proj.weight", {q, h}, L.q));
    KVC_RETURN_IF_ERROR(take(t, p + "self_attn.k_proj.weight", {kv, h}, L.k));
    KVC_RETURN_IF_ERROR(take(t, p + "self_attn.v_proj.weight", {kv, h}, L.v));
    KVC_RETURN_IF_ERROR(take(t, p + "self_attn.o_proj.weight", {h, q}, L.o));
    KVC_RETURN_IF_ERROR(
        take(t, p + "post_attention_layernorm.weight", {h}, L.mlpNorm));
    KVC_RETURN_IF_ERROR(take(t, p + "mlp.gate_proj.weight", {f, h}, L.gate));
    KVC_RETURN_IF_ERROR(take(t, p + "mlp.up_proj.weight", {f, h}, L.up));
    KVC_RETURN_IF_ERROR(take(t, p + "mlp.down_proj.weight", {h, f}, L.down));
  }
  KVC_RETURN_IF_ERROR(take(t, "model.norm.weight", {h}, model->finalNorm_));
  if (!c.tieWordEmbeddings || t.count("lm_head.weight"))
    KVC_RETURN_IF_ERROR(
        take(t, "lm_head.weight", {c.vocabSize, h}, model->lmHead_));
  model->invFreq_ = ropeFrequencies(c);
  model->fingerprint_ = fingerprintOf(c, weightsDigest);
  return model;
}

StatusOr<std::string> modelFingerprint(const std::string &dir) {
  KVC_ASSIGN_OR_RETURN(
      config,
      loadModelConfig((std::filesystem::path(dir) / "config.json").string()));
  KVC_ASSIGN_OR_RETURN(digest, safetensorsDigest(dir));
  return fingerprintOf(config, digest);
}

void LlamaModel::rmsNorm(const float *x, const std::vector<float> &weight,
                         int64_t n, float *out) const {
  kvc::rmsNorm(x, n, config_.hiddenSize, float(config_.rmsNormEps),
               weight.data(), out);
}

void LlamaModel::ropeTable(int64_t position, int64_t n, float *out) const {
  ropeCosSin(invFreq_, position, n, out);
}

void LlamaModel::project(int64_t layer, const float *hidden, int64_t n,
                         int64_t position, float *k, float *v) const {
  const Layer &L = layers_[layer];
  const int64_t h = config_.hiddenSize;
  std::vector<float> normed(n * h);
  rmsNorm(hidden, L.attnNorm, n, normed.data());
  linear(normed.data(), L.k, n, h, kvDim(), k);
  linear(normed.data(), L.v, n, h, kvDim(), v);
  std::vector<float> rotations(n * config_.headDim);
  ropeTable(position, n, rotations.data());
  applyRope(k, n, config_.numKvHeads, config_.headDim, rotations.data());
  roundToBf16(k, n * kvDim());
  roundToBf16(v, n * kvDim());
}

Status LlamaModel::prefill(KVContext &context, int64_t position,
                           const int32_t *tokens, int64_t n,
                           const LayerCallback &onLayer,
                           int64_t layers) const {
  std::vector<float> x;
  return forward(context, position, tokens, n, onLayer, layers, x);
}

Status LlamaModel::nextLogits(KVContext &context, int64_t position,
                              const int32_t *tokens, int64_t n,
                              float *logits) const {
  if (n <= 0)
    return invalidArgument("logits need at least one token");
  std::vector<float> x;
  KVC_RETURN_IF_ERROR(forward(context, position, tokens, n, {}, -1, x));
  const int64_t h = config_.hiddenSize;
  std::vector<float> normed(h);
  rmsNorm(&x[(n - 1) * h], finalNorm_, 1, normed.data());
  linear(normed.data(), outputLayer(), 1, h, config_.vocabSize, logits);
  return Status::ok();
}

Status LlamaModel::forward(KVContext &context, int64_t position,
                           const int32_t *tokens, int64_t n,
                           const LayerCallback &onLayer, int64_t layers,
                           std::vector<float> &x) const {
  const ModelConfig &c = config_;
  if (n <= 0)
    return Status::ok();
  if (layers < 0)
    layers = c.numLayers;
  if (layers > c.numLayers)
    return invalidArgument("prefilling " + std::to_string(layers) +
                           " layers of a " + std::to_string(c.numLayers) +
                           "-layer model");
  const int64_t pos0 = position, total = pos0 + n;
  if (pos0 < 0)
    return invalidArgument("prefilling at a negative position");
  if (total > c.maxPositions)
    return invalidArgument("prefilling to " + std::to_string(total) +
                           " tokens exceeds the model's context of " +
                           std::to_string(c.maxPositions));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocabSize)
      return invalidArgument("token " + std::to_string(tokens[i]) +
                             " is outside the vocabulary of " +
                             std::to_string(c.vocabSize));
  const int64_t h = c.hiddenSize, heads = c.numHeads, kvHeads = c.numKvHeads,
                kv = kvDim(), q = heads * c.headDim, f = c.intermediateSize;

  x.assign(n * h, 0.0f);
  std::vector<float> normed(n * h), qs(n * q), k(n * kv), v(n * kv),
      attn(n * q), tmp(n * h), gate(n * f), up(n * f);
  CausalAttention attention(heads, kvHeads, c.headDim);
  // The chunk's RoPE rows, shared by every layer's queries and keys.
  std::vector<float> rotations(n * c.headDim);
  ropeTable(pos0, n, rotations.data());
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(&embed_[int64_t(tokens[i]) * h], h, &x[i * h]);

  for (int64_t l = 0; l < layers; ++l) {
    const Layer &L = layers_[l];
    rmsNorm(x.data(), L.attnNorm, n, normed.data());
    linear(normed.data(), L.q, n, h, q, qs.data());
    linear(normed.data(), L.k, n, h, kv, k.data());
    linear(normed.data(), L.v, n, h, kv, v.data());
    applyRope(qs.data(), n, heads, c.headDim, rotations.data());
    applyRope(k.data(), n, kvHeads, c.headDim, rotations.data());
    roundToBf16(k.data(), n * kv);
    roundToBf16(v.data(), n * kv);
    if (onLayer)
      onLayer({l, pos0, n, x.data(), k.data(), v.data()});
    KVC_RETURN_IF_ERROR(context.append(l, pos0, n, k.data(), v.data()));
    KVC_RETURN_IF_ERROR(attention.run(
        qs.data(), pos0, n,
        [&](int64_t first, int64_t count, KeyValueRows &rows) {
          return context.rows(l, first, count, rows);
        },
        attn.data()));
    linear(attn.data(), L.o, n, q, h, tmp.data());
    for (int64_t i = 0; i < n * h; ++i)
      x[i] += tmp[i];

    rmsNorm(x.data(), L.mlpNorm, n, normed.data());
    linear(normed.data(), L.gate, n, h, f, gate.data());
    linear(normed.data(), L.up, n, h, f, up.data());
    for (int64_t i = 0; i < n * f; ++i) {
      float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    linear(gate.data(), L.down, n, f, h, tmp.data());
    for (int64_t i = 0; i < n * h; ++i)
      x[i] += tmp[i];
  }
  return Status::ok();
}

} // namespace kvc
