//===- GenModel.h - Small random models in checkpoint format ----*- C++ -*-===//
//
// Writing Hugging Face model directories: random Llama models for tests and
// benchmarks (generateModel), and any model's config and tensors
// (writeModelDirectory, which the llama2.c importer uses too).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_GENMODEL_H
#define KVC_RUNTIME_MODEL_GENMODEL_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Model/Safetensors.h"

#include <cstdint>
#include <string>

namespace kvc {

struct GenModelOptions {
  int64_t layers = 4;
  int64_t hidden = 256;
  int64_t heads = 8;
  int64_t kvHeads = 2;
  int64_t ffn = 688;
  int64_t vocab = 1024;
  int64_t maxPositions = 32768;
  double ropeTheta = 10000;
  DType dtype = DType::BF16;
  uint64_t seed = 0;
};

/// Writes `dir` (created if missing): config.json describing `config` (a
/// Llama without rope scaling), with the JSON object `extraFields` merged
/// in, and model.safetensors holding `tensors` stored as config.dtype.
Status writeModelDirectory(const std::string &dir, const ModelConfig &config,
                           const TensorMap &tensors,
                           const std::string &extraFields = "{}");

/// Writes config.json and model.safetensors of a Llama model with weights
/// drawn from N(0, 0.02^2) (norms 1) by a generator seeded with `seed`: the
/// same options give the same bytes.
Status generateModel(const std::string &dir, const GenModelOptions &options);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_GENMODEL_H
