//===- Tokenizer.h - The llama2.c tokenizer ---------------------*- C++ -*-===//
//
// The byte-level BPE of llama2.c checkpoints (tokenizer.bin: the longest
// piece's length, then per id a float score, a length and the piece's
// bytes; ids 0 <unk>, 1 BOS, 2 EOS, then one piece "<0xXX>" per byte). It
// encodes as llama2.c's `encode` does — BOS, a dummy-prefix space, each
// UTF-8 code point as its piece or its bytes, then repeatedly the adjacent
// pair whose merge has the highest score — and decodes ids back to text.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_TOKENIZER_H
#define KVC_RUNTIME_MODEL_TOKENIZER_H

#include "kvc/Runtime/Base/Status.h"

#include <cstdint>
#include <memory>
#include <string>
#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvc {

class Tokenizer {
public:
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;

  /// Reads `path`; a truncated file, a negative length or a vocabulary
  /// other than `vocabSize` (when positive) is an error.
  static StatusOr<std::unique_ptr<Tokenizer>> load(const std::string &path,
                                                   int64_t vocabSize = 0);

  int64_t vocabSize() const { return int64_t(pieces_.size()); }

  /// The ids of `text`, after BOS when `bos`. Merging takes time quadratic
  /// in the text's length: check fewestTokens first.
  std::vector<int32_t> encode(std::string_view text, bool bos = true) const;
  /// A lower bound on encode(text).size(), known without encoding: BOS, and
  /// the text with its dummy-prefix space in pieces of the longest length.
  int64_t fewestTokens(std::string_view text) const {
    const int64_t bytes = int64_t(text.size()) + 1;
    return 1 + (bytes + longestPiece_ - 1) / std::max<int64_t>(longestPiece_, 1);
  }
  /// The text of `id` following `previous` (the leading space of the first
  /// piece after BOS dropped; byte pieces as their byte; BOS and EOS as
  /// nothing).
  std::string decode(int32_t previous, int32_t id) const;
  /// The text of `ids`, `previous` being the id before them.
  std::string decode(const std::vector<int32_t> &ids,
                     int32_t previous = kBos) const;

private:
  Tokenizer() = default;
  int32_t lookup(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;
  int64_t longestPiece_ = 1;
};

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_TOKENIZER_H
