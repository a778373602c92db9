//===- Safetensors.h - Hugging Face safetensors files -----------*- C++ -*-===//
//
// Reads a checkpoint directory (model.safetensors, or shards listed in
// model.safetensors.index.json) into fp32 tensors, and writes tensors in the
// same format. Every header is checked: offsets inside the file, sizes that
// match shape x dtype, known dtypes.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_SAFETENSORS_H
#define KVC_RUNTIME_MODEL_SAFETENSORS_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvc {

/// A dense fp32 tensor, row-major.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
};

using TensorMap = std::map<std::string, Tensor>;

/// Loads every tensor of the checkpoint in `dir`, converted to fp32.
/// `digest`, when given, receives a SHA-256 over the tensors' names, shapes,
/// dtypes and bytes (the weights part of a model fingerprint).
StatusOr<TensorMap> loadSafetensors(const std::string &dir,
                                    std::string *digest = nullptr);

/// loadSafetensors' digest alone, from the mapped files, without converting
/// any tensor.
StatusOr<std::string> safetensorsDigest(const std::string &dir);

/// Writes `tensors` to `path` stored as `dtype`.
Status writeSafetensors(const std::string &path, const TensorMap &tensors,
                        DType dtype);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_SAFETENSORS_H
