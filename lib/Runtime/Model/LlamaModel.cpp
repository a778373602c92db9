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

/// y[n][out] += bias[out], for a projection that has one (empty: none).
void addBias(const std::vector<float> &bias, int64_t n, float *y) {
  const int64_t out = int64_t(bias.size());
  for (int64_t i = 0; i < n && out; ++i)
    for (int64_t j = 0; j < out; ++j)
      y[i * out + j] += bias[j];
}

/// The rope scaling's fields, as text: a model rotated otherwise computes
/// other keys.
std::string ropeScalingKey(const RopeScaling &s) {
  std::string key = std::to_string(int(s.kind));
  for (double field : {s.factor, s.lowFreqFactor, s.highFreqFactor,
                       double(s.originalMaxPositions), s.betaFast, s.betaSlow,
                       double(s.truncate), s.attentionFactor})
    key += "," + std::to_string(field);
  return key;
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
      .update(uint64_t(c.qkvBias) | uint64_t(c.outputBias) << 1 |
              uint64_t(c.qkNorm) << 2)
      .update(ropeScalingKey(c.ropeScaling))
      .update(uint64_t(c.slidingWindow))
      .update(weightsDigest);
  return toHex(hash.finish());
}

/// Rounds `n` values to bf16, the element type of the KV cache.
void roundToBf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = bf16ToFloat(floatToBf16(x[i]));
}

/// The checkpoint's tensor `name`, checked against `shape`.
Status view(const Checkpoint &checkpoint, const std::string &name,
            const std::vector<int64_t> &shape, TensorView &out) {
  KVC_ASSIGN_OR_RETURN(found, checkpoint.tensor(name));
  if (found.shape != shape) {
    auto str = [](const std::vector<int64_t> &s) {
      std::string text = "[";
      for (size_t i = 0; i < s.size(); ++i)
        text += (i ? ", " : "") + std::to_string(s[i]);
      return text + "]";
    };
    return invalidArgument("tensor " + name + " has shape " + str(found.shape) +
                           ", config.json implies " + str(shape));
  }
  out = found;
  return Status::ok();
}

/// `view` as fp32; empty for a tensor the model does not have.
std::vector<float> floatsOf(const TensorView &view) {
  if (!view.data)
    return {};
  std::vector<float> out(size_t(view.numel()));
  view.toFloats(0, view.numel(), out.data());
  return out;
}

} // namespace

LlamaModel::LlamaModel() = default;
LlamaModel::~LlamaModel() = default;

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string &dir,
                                                       LoadOptions options) {
  StatusOr<ModelConfig> config =
      loadModelConfig((std::filesystem::path(dir) / "config.json").string());
  if (!config.isOk())
    return config.status();
  KVC_ASSIGN_OR_RETURN(checkpoint, Checkpoint::open(dir));

  std::unique_ptr<LlamaModel> model(new LlamaModel());
  ModelConfig &c = model->config_;
  c = *config;
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
                kv = c.numKvHeads * c.headDim, f = c.intermediateSize;
  const Checkpoint &t = *checkpoint;
  KVC_RETURN_IF_ERROR(view(t, "model.embed_tokens.weight", {c.vocabSize, h},
                           model->storedEmbed_));
  model->stored_.resize(c.numLayers);
  for (int64_t l = 0; l < c.numLayers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    StoredLayer &L = model->stored_[l];
    KVC_RETURN_IF_ERROR(view(t, p + "input_layernorm.weight", {h}, L.attnNorm));
    KVC_RETURN_IF_ERROR(view(t, p + "self_attn.q_proj.weight", {q, h}, L.q));
    KVC_RETURN_IF_ERROR(view(t, p + "self_attn.k_proj.weight", {kv, h}, L.k));
    KVC_RETURN_IF_ERROR(view(t, p + "self_attn.v_proj.weight", {kv, h}, L.v));
    KVC_RETURN_IF_ERROR(view(t, p + "self_attn.o_proj.weight", {h, q}, L.o));
    KVC_RETURN_IF_ERROR(
        view(t, p + "post_attention_layernorm.weight", {h}, L.mlpNorm));
    KVC_RETURN_IF_ERROR(view(t, p + "mlp.gate_proj.weight", {f, h}, L.gate));
    KVC_RETURN_IF_ERROR(view(t, p + "mlp.up_proj.weight", {f, h}, L.up));
    KVC_RETURN_IF_ERROR(view(t, p + "mlp.down_proj.weight", {h, f}, L.down));
    if (c.qkvBias) {
      KVC_RETURN_IF_ERROR(view(t, p + "self_attn.q_proj.bias", {q}, L.qBias));
      KVC_RETURN_IF_ERROR(view(t, p + "self_attn.k_proj.bias", {kv}, L.kBias));
      KVC_RETURN_IF_ERROR(view(t, p + "self_attn.v_proj.bias", {kv}, L.vBias));
    }
    if (c.outputBias)
      KVC_RETURN_IF_ERROR(view(t, p + "self_attn.o_proj.bias", {h}, L.oBias));
    if (c.qkNorm) {
      KVC_RETURN_IF_ERROR(
          view(t, p + "self_attn.q_norm.weight", {c.headDim}, L.qNorm));
      KVC_RETURN_IF_ERROR(
          view(t, p + "self_attn.k_norm.weight", {c.headDim}, L.kNorm));
    }
  }
  KVC_RETURN_IF_ERROR(
      view(t, "model.norm.weight", {h}, model->storedFinalNorm_));
  if (!c.tieWordEmbeddings || t.has("lm_head.weight"))
    KVC_RETURN_IF_ERROR(
        view(t, "lm_head.weight", {c.vocabSize, h}, model->storedOutput_));
  else
    model->storedOutput_ = model->storedEmbed_;
  model->invFreq_ = ropeFrequencies(c);
  model->fingerprint_ = fingerprintOf(c, t.digest());
  model->checkpoint_ = std::move(checkpoint);
  if (options.hostWeights)
    model->hostWeights();
  return model;
}

const LlamaModel &LlamaModel::hostWeights() const {
  std::call_once(hostOnce_, [this] {
    embed_ = floatsOf(storedEmbed_);
    finalNorm_ = floatsOf(storedFinalNorm_);
    if (storedOutput_.data != storedEmbed_.data)
      lmHead_ = floatsOf(storedOutput_);
    layers_.resize(stored_.size());
    for (size_t l = 0; l < stored_.size(); ++l) {
      const StoredLayer &from = stored_[l];
      Layer &to = layers_[l];
      for (auto [out, in] : {std::pair{&to.attnNorm, &from.attnNorm},
                             {&to.q, &from.q},
                             {&to.k, &from.k},
                             {&to.v, &from.v},
                             {&to.o, &from.o},
                             {&to.mlpNorm, &from.mlpNorm},
                             {&to.gate, &from.gate},
                             {&to.up, &from.up},
                             {&to.down, &from.down},
                             {&to.qBias, &from.qBias},
                             {&to.kBias, &from.kBias},
                             {&to.vBias, &from.vBias},
                             {&to.oBias, &from.oBias},
                             {&to.qNorm, &from.qNorm},
                             {&to.kNorm, &from.kNorm}})
        *out = floatsOf(*in);
    }
    hasHostWeights_ = true;
  });
  return *this;
}

bool LlamaModel::hasHostWeights() const { return hasHostWeights_; }

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

void LlamaModel::keys(const Layer &L, const float *normed, int64_t n,
                      const float *rotations, float *k, float *v) const {
  const int64_t h = config_.hiddenSize;
  linear(normed, L.k, n, h, kvDim(), k);
  linear(normed, L.v, n, h, kvDim(), v);
  addBias(L.kBias, n, k);
  addBias(L.vBias, n, v);
  if (!L.kNorm.empty())
    kvc::rmsNorm(k, n * config_.numKvHeads, config_.headDim,
                 float(config_.rmsNormEps), L.kNorm.data(), k);
  applyRope(k, n, config_.numKvHeads, config_.headDim, rotations);
  roundToBf16(k, n * kvDim());
  roundToBf16(v, n * kvDim());
}

void LlamaModel::ropeTable(int64_t position, int64_t n, float *out) const {
  ropeCosSin(invFreq_, position, n, out, ropeAttentionScale(config_));
}

void LlamaModel::project(int64_t layer, const float *hidden, int64_t n,
                         int64_t position, float *k, float *v) const {
  const Layer &L = this->layer(layer);
  const int64_t h = config_.hiddenSize;
  std::vector<float> normed(n * h);
  rmsNorm(hidden, L.attnNorm, n, normed.data());
  std::vector<float> rotations(n * config_.headDim);
  ropeTable(position, n, rotations.data());
  keys(L, normed.data(), n, rotations.data(), k, v);
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
  rmsNorm(&x[(n - 1) * h], finalNorm(), 1, normed.data());
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
  hostWeights();
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
  CausalAttention attention(heads, kvHeads, c.headDim, c.slidingWindow);
  // The chunk's RoPE rows, shared by every layer's queries and keys.
  std::vector<float> rotations(n * c.headDim);
  ropeTable(pos0, n, rotations.data());
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(&embed_[int64_t(tokens[i]) * h], h, &x[i * h]);

  for (int64_t l = 0; l < layers; ++l) {
    const Layer &L = layers_[l];
    rmsNorm(x.data(), L.attnNorm, n, normed.data());
    linear(normed.data(), L.q, n, h, q, qs.data());
    addBias(L.qBias, n, qs.data());
    if (!L.qNorm.empty())
      kvc::rmsNorm(qs.data(), n * heads, c.headDim, float(c.rmsNormEps),
                   L.qNorm.data(), qs.data());
    applyRope(qs.data(), n, heads, c.headDim, rotations.data());
    keys(L, normed.data(), n, rotations.data(), k.data(), v.data());
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
    addBias(L.oBias, n, tmp.data());
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
