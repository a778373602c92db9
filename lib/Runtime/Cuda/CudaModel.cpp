//===- CudaModel.cpp - A Llama model on the GPU ---------------------------===//

#include "CudaModel.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Base/HostWorkers.h"

#include <algorithm>
#include <cstring>

namespace kvc::cuda {

namespace {

/// Elements a conversion on the host handles at once: the host never holds
/// a whole converted tensor.
constexpr int64_t kPiece = int64_t(1) << 22;

/// Copies `parts` (stored tensors, back to back) to `to` as fp32 (`bf16`
/// false) or bf16, from the mapped checkpoint: bf16 stored as bf16 goes
/// straight; anything else is converted a piece at a time.
Status copyStored(const std::vector<const TensorView *> &parts, bool bf16,
                  char *to) {
  const size_t element = bf16 ? 2 : 4;
  std::vector<char> piece;
  size_t at = 0;
  for (const TensorView *part : parts) {
    const int64_t n = part->numel();
    if ((bf16 && part->dtype == DType::BF16) ||
        (!bf16 && part->dtype == DType::F32)) {
      KVC_CUDA_RETURN_IF_ERROR(cudaMemcpy(to + at, part->data,
                                          size_t(n) * element,
                                          cudaMemcpyHostToDevice),
                               "copying weights to the device");
      at += size_t(n) * element;
      continue;
    }
    piece.resize(size_t(std::min(n, kPiece)) * element);
    for (int64_t first = 0; first < n; first += kPiece) {
      const int64_t count = std::min(kPiece, n - first);
      if (bf16)
        part->toBf16(first, count, reinterpret_cast<uint16_t *>(piece.data()));
      else
        part->toFloats(first, count, reinterpret_cast<float *>(piece.data()));
      KVC_CUDA_RETURN_IF_ERROR(cudaMemcpy(to + at, piece.data(),
                                          size_t(count) * element,
                                          cudaMemcpyHostToDevice),
                               "copying weights to the device");
      at += size_t(count) * element;
    }
  }
  return Status::ok();
}

/// `parts` as fp32 in `to`, grown to fit.
Status uploadFloats(const std::vector<const TensorView *> &parts,
                    DeviceArray &to) {
  int64_t n = 0;
  for (const TensorView *part : parts)
    n += part->numel();
  KVC_RETURN_IF_ERROR(to.reserve(size_t(n) * sizeof(float)));
  return copyStored(parts, /*bf16=*/false, to.get<char>());
}

} // namespace

Status CudaModel::upload(const std::vector<const TensorView *> &parts,
                         int64_t columns, Matrix &to) const {
  to.columns = columns;
  to.rows = 0;
  for (const TensorView *part : parts)
    to.rows += part->numel() / columns;
  const size_t element = bf16() ? sizeof(uint16_t) : sizeof(float);
  KVC_RETURN_IF_ERROR(to.data.reserve(size_t(to.rows * columns) * element));
  return copyStored(parts, bf16(), to.data.get<char>());
}

Status CudaModel::supports(const ModelConfig &c) {
  if (c.slidingWindow > 0)
    return unimplemented("cuda backend: sliding-window attention (a window "
                         "of " +
                         std::to_string(c.slidingWindow) +
                         ") is computed on the CPU backend only");
  return Status::ok();
}

StatusOr<std::unique_ptr<CudaModel>>
CudaModel::create(const LlamaModel &model, GemmPrecision precision) {
  // From the checkpoint as stored: the model's fp32 host weights are
  // neither used nor made.
  const ModelConfig &c = model.config();
  KVC_RETURN_IF_ERROR(supports(c));
  std::unique_ptr<CudaModel> gpu(new CudaModel(model.config(), precision));
  const int64_t h = c.hiddenSize;
  KVC_RETURN_IF_ERROR(
      uploadFloats({&model.storedEmbedding()}, gpu->embedding_));
  KVC_RETURN_IF_ERROR(
      uploadFloats({&model.storedFinalNorm()}, gpu->finalNorm_));
  KVC_RETURN_IF_ERROR(gpu->upload({&model.storedOutput()}, h, gpu->output_));
  std::vector<const TensorView *> attnNorms;
  for (int64_t l = 0; l < c.numLayers; ++l)
    attnNorms.push_back(&model.storedLayer(l).attnNorm);
  KVC_RETURN_IF_ERROR(uploadFloats(attnNorms, gpu->attnNorms_));
  gpu->layers_.resize(c.numLayers);
  for (int64_t l = 0; l < c.numLayers; ++l) {
    const LlamaModel::StoredLayer &from = model.storedLayer(l);
    Layer &to = gpu->layers_[l];
    KVC_RETURN_IF_ERROR(uploadFloats({&from.attnNorm}, to.attnNorm));
    KVC_RETURN_IF_ERROR(uploadFloats({&from.mlpNorm}, to.mlpNorm));
    if (c.qkvBias)
      KVC_RETURN_IF_ERROR(
          uploadFloats({&from.qBias, &from.kBias, &from.vBias}, to.qkvBias));
    if (c.outputBias)
      KVC_RETURN_IF_ERROR(uploadFloats({&from.oBias}, to.oBias));
    if (c.qkNorm) {
      KVC_RETURN_IF_ERROR(uploadFloats({&from.qNorm}, to.qNorm));
      KVC_RETURN_IF_ERROR(uploadFloats({&from.kNorm}, to.kNorm));
    }
    KVC_RETURN_IF_ERROR(gpu->upload({&from.q, &from.k, &from.v}, h, to.qkv));
    KVC_RETURN_IF_ERROR(gpu->upload({&from.o}, c.numHeads * c.headDim, to.o));
    KVC_RETURN_IF_ERROR(gpu->upload({&from.gate, &from.up}, h, to.gateUp));
    KVC_RETURN_IF_ERROR(gpu->upload({&from.down}, c.intermediateSize, to.down));
  }
  return gpu;
}

StatusOr<std::unique_ptr<CudaModel>>
CudaModel::borrow(const ModelConfig &c, const CudaLlamaWeights &weights) {
  KVC_RETURN_IF_ERROR(supports(c));
  if (c.qkvBias || c.outputBias || c.qkNorm)
    return unimplemented("cuda runner: " + c.modelType + "'s " +
                         (c.qkNorm ? "per-head q/k norms" : "biases") +
                         " are not among a server's weights kvc borrows");
  if (int64_t(weights.layers.size()) != c.numLayers)
    return invalidArgument(
        "cuda runner: weights of " + std::to_string(weights.layers.size()) +
        " layers for a model of " + std::to_string(c.numLayers));
  // Each tensor must be the current device's memory: a host pointer, or
  // another GPU's, would fault inside a kernel instead of failing here.
  int device = 0;
  KVC_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "finding the device");
  auto check = [&](const void *p, const std::string &what) -> Status {
    cudaPointerAttributes attributes{};
    if (!p || cudaPointerGetAttributes(&attributes, p) != cudaSuccess ||
        (attributes.type != cudaMemoryTypeDevice &&
         attributes.type != cudaMemoryTypeManaged) ||
        attributes.device != device) {
      cudaGetLastError(); // Clear a failed query's error.
      return invalidArgument("cuda runner: " + what +
                             " is not in the memory of GPU " +
                             std::to_string(device));
    }
    return Status::ok();
  };
  KVC_RETURN_IF_ERROR(check(weights.embedding, "the embedding"));
  KVC_RETURN_IF_ERROR(check(weights.finalNorm, "the final norm"));
  KVC_RETURN_IF_ERROR(check(weights.output, "the output layer"));
  for (int64_t l = 0; l < c.numLayers; ++l) {
    const CudaLlamaWeights::Layer &L = weights.layers[l];
    const std::string at = "layer " + std::to_string(l) + "'s ";
    for (auto [p, what] : {std::pair{L.inputNorm, "input norm"},
                           {L.postAttentionNorm, "post-attention norm"},
                           {L.qkv, "QKV projection"},
                           {L.o, "output projection"},
                           {L.gateUp, "gate/up projection"},
                           {L.down, "down projection"}})
      KVC_RETURN_IF_ERROR(check(p, at + what));
  }

  std::unique_ptr<CudaModel> gpu(new CudaModel(c, GemmPrecision::BF16));
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
                kv = c.numKvHeads * c.headDim, f = c.intermediateSize;
  const cudaStream_t s = DeviceArray::releaseStream();
  // Norms are fp32 in the kernels: widened copies of the caller's.
  auto widened = [&](const void *from, int64_t n, float *to) {
    return cudaStatus(
        widen(static_cast<const uint16_t *>(from), false, n, to, s),
        "widening a norm");
  };
  KVC_RETURN_IF_ERROR(gpu->finalNorm_.reserve(size_t(h) * sizeof(float)));
  KVC_RETURN_IF_ERROR(
      widened(weights.finalNorm, h, gpu->finalNorm_.get<float>()));
  KVC_RETURN_IF_ERROR(
      gpu->attnNorms_.reserve(size_t(c.numLayers * h) * sizeof(float)));
  gpu->layers_.resize(c.numLayers);
  for (int64_t l = 0; l < c.numLayers; ++l) {
    const CudaLlamaWeights::Layer &from = weights.layers[l];
    Layer &to = gpu->layers_[l];
    KVC_RETURN_IF_ERROR(to.attnNorm.reserve(size_t(h) * sizeof(float)));
    KVC_RETURN_IF_ERROR(to.mlpNorm.reserve(size_t(h) * sizeof(float)));
    KVC_RETURN_IF_ERROR(widened(from.inputNorm, h, to.attnNorm.get<float>()));
    KVC_RETURN_IF_ERROR(
        widened(from.inputNorm, h, gpu->attnNorms_.get<float>() + l * h));
    KVC_RETURN_IF_ERROR(
        widened(from.postAttentionNorm, h, to.mlpNorm.get<float>()));
    to.qkv = {{}, from.qkv, q + 2 * kv, h};
    to.o = {{}, from.o, h, q};
    to.gateUp = {{}, from.gateUp, 2 * f, h};
    to.down = {{}, from.down, h, f};
  }
  gpu->output_ = {{}, weights.output, c.vocabSize, h};
  gpu->borrowedEmbedding_ = static_cast<const uint16_t *>(weights.embedding);
  KVC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "widening the norms");
  return gpu;
}

Status CudaModel::gemm(Lane &lane, const void *x, const Matrix &w, int64_t row0,
                       int64_t rows, int64_t n, float *y,
                       bool accumulate) const {
  // Row-major y[n][rows] is column-major y^T[rows][n] = W[rows][k] x^T.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType type = bf16() ? CUDA_R_16BF : CUDA_R_32F;
  const size_t element = bf16() ? sizeof(uint16_t) : sizeof(float);
  const char *weights = w.get() + size_t(row0 * w.columns) * element;
  return blasStatus(lane.cublas->cublasGemmEx(
                        lane.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n),
                        int(w.columns), &alpha, weights, type, int(w.columns),
                        x, type, int(w.columns), &beta, y, CUDA_R_32F,
                        int(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
}

StatusOr<const float *> CudaModel::ropeRows(int64_t position, int64_t n) const {
  if (position < 0 || position + n > config_.maxPositions)
    return invalidArgument("RoPE rows up to position " +
                           std::to_string(position + n) +
                           " exceed the model's context of " +
                           std::to_string(config_.maxPositions));
  KVC_ASSIGN_OR_RETURN(table, fullRopeTable());
  return table + position * config_.headDim;
}

StatusOr<const float *> CudaModel::fullRopeTable() const {
  std::lock_guard<std::mutex> lock(ropeMutex_);
  if (!ropeTable_.get()) {
    const ModelConfig &c = config_;
    std::vector<float> table(size_t(c.maxPositions * c.headDim));
    // The host's cos and sin in double (as the CPU model's), 4096
    // positions per worker: a 128K-position table in a fraction of a
    // second.
    constexpr int64_t kRows = 4096;
    hostWorkers().forEach(
        size_t((c.maxPositions + kRows - 1) / kRows), [&](size_t block) {
          const int64_t first = int64_t(block) * kRows;
          ropeCosSin(invFreq_, first, std::min(kRows, c.maxPositions - first),
                     table.data() + first * c.headDim, ropeAttentionScale(c));
        });
    KVC_RETURN_IF_ERROR(ropeTable_.reserve(table.size() * sizeof(float)));
    KVC_CUDA_RETURN_IF_ERROR(cudaMemcpy(ropeTable_.get(), table.data(),
                                        table.size() * sizeof(float),
                                        cudaMemcpyHostToDevice),
                             "copying the RoPE table");
  }
  return ropeTable_.get<const float>();
}

Status CudaModel::projectKV(Lane &lane, int64_t layer, const uint16_t *x,
                            int64_t n, float *k, float *v) const {
  if (!bf16())
    return failedPrecondition("projectKV: the model's GEMMs take fp32 inputs");
  const ModelConfig &c = config_;
  const int64_t q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
  const Layer &L = layers_[layer];
  KVC_RETURN_IF_ERROR(gemm(lane, x, L.qkv, q, kv, n, k, false));
  KVC_RETURN_IF_ERROR(gemm(lane, x, L.qkv, q + kv, kv, n, v, false));
  KVC_RETURN_IF_ERROR(biasAndNormHeads(L, k, n, kv, q, kv, lane.stream));
  return biasAndNormHeads(L, v, n, kv, q + kv, kv, lane.stream);
}

Status CudaModel::biasAndNormHeads(const Layer &L, float *rows, int64_t n,
                                   int64_t stride, int64_t from, int64_t width,
                                   cudaStream_t stream) const {
  const ModelConfig &c = config_;
  const int64_t q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
  if (L.qkvBias.get())
    KVC_CUDA_RETURN_IF_ERROR(
        addBias(rows, n, stride, L.qkvBias.get<float>() + from, width, stream),
        "the projection's biases");
  const float eps = float(c.rmsNormEps);
  if (L.qNorm.get() && from == 0 && width >= q)
    KVC_CUDA_RETURN_IF_ERROR(headNorm(rows, n, stride, c.numHeads, c.headDim,
                                      L.qNorm.get<float>(), eps, stream),
                             "Q's per-head norm");
  if (L.kNorm.get() && from <= q && from + width >= q + kv)
    KVC_CUDA_RETURN_IF_ERROR(headNorm(rows + (q - from), n, stride,
                                      c.numKvHeads, c.headDim,
                                      L.kNorm.get<float>(), eps, stream),
                             "K's per-head norm");
  return Status::ok();
}

Status CudaModel::forward(Lane &lane, const int32_t *tokens, int64_t position,
                          int64_t n, int64_t layers,
                          const std::vector<RowLayout> &cache, float *logits,
                          const LayerHook &onLayer) const {
  const ModelConfig &c = config_;
  if (n <= 0)
    return Status::ok();
  if (position < 0 || position + n > c.maxPositions)
    return invalidArgument("prefilling to " + std::to_string(position + n) +
                           " tokens exceeds the model's context of " +
                           std::to_string(c.maxPositions));
  if (layers < 0 || layers > c.numLayers || int64_t(cache.size()) < layers)
    return invalidArgument("prefilling " + std::to_string(layers) +
                           " layers of a " + std::to_string(c.numLayers) +
                           "-layer model");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocabSize)
      return invalidArgument("token " + std::to_string(tokens[i]) +
                             " is outside the vocabulary of " +
                             std::to_string(c.vocabSize));
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
                kv = c.numKvHeads * c.headDim, f = c.intermediateSize,
                width = q + 2 * kv;
  const float eps = float(c.rmsNormEps);
  const cudaStream_t s = lane.stream;
  const bool low = bf16();
  Scratch scratch(lane);
  KVC_ASSIGN_OR_RETURN(ids, scratch.copy(tokens, n));
  KVC_ASSIGN_OR_RETURN(rotations, ropeRows(position, n));
  KVC_ASSIGN_OR_RETURN(x, scratch.take<float>(n * h));
  // GEMM inputs, fp32 or bf16: the normed states, attention's output and
  // the MLP's activation, each at most max(h, q, f) wide.
  KVC_ASSIGN_OR_RETURN(in, scratch.take<float>(n * std::max({h, q, f})));
  KVC_ASSIGN_OR_RETURN(qkv, scratch.take<float>(n * width));
  KVC_ASSIGN_OR_RETURN(gateUp, scratch.take<float>(n * 2 * f));

  KVC_CUDA_RETURN_IF_ERROR(
      borrowedEmbedding_ ? embedBf16(ids, n, borrowedEmbedding_, h, x, s)
                         : embed(ids, n, embedding_.get<float>(), h, x, s),
      "embedding");
  for (int64_t l = 0; l < layers; ++l) {
    const Layer &L = layers_[l];
    KVC_CUDA_RETURN_IF_ERROR(
        rmsNorm(x, L.attnNorm.get<float>(), n, h, eps, in, low, s), "RMSNorm");
    KVC_RETURN_IF_ERROR(gemm(lane, in, L.qkv, 0, width, n, qkv, false));
    KVC_RETURN_IF_ERROR(biasAndNormHeads(L, qkv, n, width, 0, width, s));
    KVC_CUDA_RETURN_IF_ERROR(
        rope(qkv, n, width, c.numHeads, c.headDim, rotations, s), "RoPE");
    KVC_CUDA_RETURN_IF_ERROR(storeKV(qkv, n, width, q, q + kv, c.numKvHeads,
                                     c.headDim, rotations, cache[l], position,
                                     s),
                             "storing K and V");
    if (onLayer)
      KVC_RETURN_IF_ERROR(onLayer(l, x));
    KVC_CUDA_RETURN_IF_ERROR(attention(qkv, width, cache[l], position, n,
                                       c.numHeads, c.numKvHeads, c.headDim, in,
                                       low, /*tensorCores=*/low, s),
                             "attention");
    KVC_RETURN_IF_ERROR(gemm(lane, in, L.o, 0, h, n, x, true));
    if (L.oBias.get())
      KVC_CUDA_RETURN_IF_ERROR(addBias(x, n, h, L.oBias.get<float>(), h, s),
                               "the output projection's bias");
    KVC_CUDA_RETURN_IF_ERROR(
        rmsNorm(x, L.mlpNorm.get<float>(), n, h, eps, in, low, s), "RMSNorm");
    KVC_RETURN_IF_ERROR(gemm(lane, in, L.gateUp, 0, 2 * f, n, gateUp, false));
    KVC_CUDA_RETURN_IF_ERROR(swiglu(gateUp, n, f, in, low, s), "SwiGLU");
    KVC_RETURN_IF_ERROR(gemm(lane, in, L.down, 0, h, n, x, true));
  }
  if (!logits)
    return Status::ok();
  if (layers != c.numLayers)
    return invalidArgument("logits need every layer");
  KVC_CUDA_RETURN_IF_ERROR(
      rmsNorm(x + (n - 1) * h, finalNorm_.get<float>(), 1, h, eps, in, low, s),
      "RMSNorm");
  return gemm(lane, in, output_, 0, c.vocabSize, 1, logits, false);
}

Status CudaModel::project(Lane &lane, int64_t layer, const float *hidden,
                          int64_t n, int64_t position, RowLayout out) const {
  const ModelConfig &c = config_;
  if (n <= 0)
    return Status::ok();
  const int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
                kv = c.numKvHeads * c.headDim;
  const Layer &L = layers_[layer];
  Scratch scratch(lane);
  KVC_ASSIGN_OR_RETURN(rotations, ropeRows(position, n));
  KVC_ASSIGN_OR_RETURN(normed, scratch.take<float>(n * h));
  KVC_ASSIGN_OR_RETURN(y, scratch.take<float>(n * 2 * kv));
  KVC_CUDA_RETURN_IF_ERROR(rmsNorm(hidden, L.attnNorm.get<float>(), n, h,
                                   float(c.rmsNormEps), normed, bf16(),
                                   lane.stream),
                           "RMSNorm");
  // W_k and W_v are adjacent rows of the fused QKV matrix: one GEMM.
  KVC_RETURN_IF_ERROR(gemm(lane, normed, L.qkv, q, 2 * kv, n, y, false));
  KVC_RETURN_IF_ERROR(
      biasAndNormHeads(L, y, n, 2 * kv, q, 2 * kv, lane.stream));
  return cudaStatus(storeKV(y, n, 2 * kv, 0, kv, c.numKvHeads, c.headDim,
                            rotations, out, 0, lane.stream),
                    "storing K and V");
}

} // namespace kvc::cuda
