//===- Llama2c.h - Importing llama2.c checkpoints ---------------*- C++ -*-===//
//
// A llama2.c checkpoint is a header of seven int32 (dim, hidden_dim,
// n_layers, n_heads, n_kv_heads, vocab_size — negative when the output
// layer is its own matrix — and seq_len), then the weights as float32,
// matrices [out, in] row-major: the token embedding, every layer's
// attention norms, wq, wk, wv, wo, FFN norms, w1, w2, w3, the final norm,
// two legacy RoPE tables, and the output layer when it is not tied.
//
// importLlama2c writes the same model as a Hugging Face directory
// (config.json, model.safetensors in float32) that LlamaModel and
// transformers read. llama2.c rotates interleaved pairs (x[2i], x[2i+1]);
// Hugging Face's Llama rotates halves (x[i], x[i + head_dim/2]), so the rows
// of wq and wk are permuted per head as Meta's converter does. The
// tokenizer, when given, is copied beside them as tokenizer.bin.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_LLAMA2C_H
#define KVC_RUNTIME_MODEL_LLAMA2C_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"

#include <string>

namespace kvc {

/// Converts `checkpoint` (and `tokenizer`, when not empty) into `dir`.
/// Returns the model's configuration. A header with a non-positive size, a
/// file whose size is not the header's, or heads that do not divide the
/// dimensions is an error naming what is wrong.
StatusOr<ModelConfig> importLlama2c(const std::string &checkpoint,
                                    const std::string &tokenizer,
                                    const std::string &dir);

/// The tokenizer file of a model directory (tokenizer.bin), or "" when it
/// has none.
std::string tokenizerPath(const std::string &modelDir);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_LLAMA2C_H
