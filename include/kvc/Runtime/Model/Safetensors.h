//===- Safetensors.h - Hugging Face safetensors files -----------*- C++ -*-===//
//
// Reads a checkpoint directory (model.safetensors, or shards listed in
// model.safetensors.index.json), and writes tensors in the same format.
// Checkpoint maps the files and views each tensor in place, as stored
// (what a device copies from without an fp32 copy on the host);
// loadSafetensors converts every tensor to fp32. Every header is checked:
// offsets inside the file, sizes that match shape x dtype, known dtypes.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_SAFETENSORS_H
#define KVC_RUNTIME_MODEL_SAFETENSORS_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/ModelConfig.h"

#include <cstdint>
#include <map>
#include <memory>
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

/// One tensor of a mapped checkpoint, in place: its bytes as stored.
struct TensorView {
  DType dtype = DType::F32; ///< BF16, F16 or F32.
  std::vector<int64_t> shape;
  const char *data = nullptr; ///< numel() elements of dtype.
  int64_t numel() const;
  /// Elements [first, first + n) as fp32, into `out`.
  void toFloats(int64_t first, int64_t n, float *out) const;
  /// Elements [first, first + n) as bf16 (a copy when stored so), into
  /// `out`.
  void toBf16(int64_t first, int64_t n, uint16_t *out) const;
};

/// A checkpoint directory's files, mapped read-only (the page cache holds
/// them once read; nothing is copied), every header checked on open.
/// Thread-safe; views live as long as it does.
class Checkpoint {
public:
  static StatusOr<std::unique_ptr<Checkpoint>> open(const std::string &dir);
  ~Checkpoint();

  /// The tensor `name`; InvalidArgument when the checkpoint has none.
  StatusOr<TensorView> tensor(const std::string &name) const;
  bool has(const std::string &name) const { return tensors_.count(name); }
  /// Every tensor, by name.
  const std::map<std::string, TensorView> &tensors() const { return tensors_; }
  /// A SHA-256 over the tensors' names, dtypes, shapes and bytes, in the
  /// files' order (reads every byte).
  std::string digest() const;

private:
  struct File;
  Checkpoint();
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, TensorView> tensors_;
  /// Tensor names per file, in header order: the digest's order.
  std::vector<std::vector<std::string>> order_;
};

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
