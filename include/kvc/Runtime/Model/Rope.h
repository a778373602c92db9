//===- Rope.h - Rotary position embedding -----------------------*- C++ -*-===//
//
// RoPE as the model, the executor and the generated kernels all apply it:
// a cos/sin table per position (vLLM's cos_sin_cache: head_dim / 2 cosines,
// then as many sines), computed in double and rounded to float once, and a
// rotation of each head's pairs (j, j + head_dim / 2) in float. A GPU kernel
// that reads the same table and rotates in the same order writes the same
// bits.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_ROPE_H
#define KVC_RUNTIME_MODEL_ROPE_H

#include "kvc/Runtime/Desc/ModelConfig.h"

#include <cstdint>
#include <vector>

namespace kvc {

/// The head_dim / 2 inverse frequencies of `config`, with its rope scaling
/// (Hugging Face's rope_init functions).
std::vector<float> ropeFrequencies(const ModelConfig &config);

/// What `config`'s rope scaling multiplies the cosines and sines by
/// (YaRN's attention factor; 1 for the others).
float ropeAttentionScale(const ModelConfig &config);

/// Rows position .. position + n of the table: `out` holds n rows of
/// 2 * invFreq.size() floats, the cosines then the sines, each times
/// `scale` (ropeAttentionScale).
void ropeCosSin(const std::vector<float> &invFreq, int64_t position, int64_t n,
                float *out, float scale = 1.0f);

/// Rotates `n` tokens of `heads` heads of `headDim` values in place, token i
/// by table row i (`cosSin`, as ropeCosSin writes it):
///   x[j], x[j + h] = x[j] * cos - x[j + h] * sin, x[j + h] * cos + x[j] * sin
/// for j < h = headDim / 2.
void applyRope(float *x, int64_t n, int64_t heads, int64_t headDim,
               const float *cosSin);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_ROPE_H
