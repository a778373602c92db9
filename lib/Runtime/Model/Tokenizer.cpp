//===- Tokenizer.cpp - The llama2.c tokenizer -----------------------------===//

#include "kvc/Runtime/Model/Tokenizer.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace kvc {

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string &path,
                                                     int64_t vocabSize) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound(path + ": cannot open the tokenizer");
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  size_t at = 0;
  auto read = [&](void *out, size_t n) {
    if (bytes.size() - at < n)
      return false;
    std::memcpy(out, bytes.data() + at, n);
    at += n;
    return true;
  };
  auto corrupt = [&](const std::string &what) {
    return dataLoss(path + ": " + what + " (not a llama2.c tokenizer?)");
  };
  int32_t maxLength = 0;
  if (!read(&maxLength, 4) || maxLength <= 0)
    return corrupt("no positive longest-piece length");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  while (at < bytes.size()) {
    float score = 0;
    int32_t length = 0;
    if (!read(&score, 4) || !read(&length, 4))
      return corrupt("truncated after " + std::to_string(t->pieces_.size()) +
                     " pieces");
    if (length < 0 || length > maxLength)
      return corrupt("piece " + std::to_string(t->pieces_.size()) +
                     " has length " + std::to_string(length));
    std::string piece(size_t(length), '\0');
    if (!read(piece.data(), size_t(length)))
      return corrupt("truncated in piece " + std::to_string(t->pieces_.size()));
    t->ids_.emplace(piece, int32_t(t->pieces_.size())); // First id wins.
    t->longestPiece_ = std::max(t->longestPiece_, int64_t(piece.size()));
    t->pieces_.push_back(std::move(piece));
    t->scores_.push_back(score);
  }
  if (t->pieces_.size() < 3 + 256)
    return corrupt("only " + std::to_string(t->pieces_.size()) +
                   " pieces, fewer than the special and byte pieces");
  if (vocabSize > 0 && t->vocabSize() != vocabSize)
    return invalidArgument(
        path + ": a vocabulary of " + std::to_string(t->vocabSize()) +
        " pieces, the model's has " + std::to_string(vocabSize));
  return t;
}

int32_t Tokenizer::lookup(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool bos) const {
  std::vector<int32_t> ids;
  if (bos)
    ids.push_back(kBos);
  if (!text.empty())
    if (int32_t space = lookup(" "); space >= 0)
      ids.push_back(space); // SentencePiece's dummy prefix.
  // Code points as their pieces, or as their bytes (ids 3 + byte).
  for (size_t i = 0; i < text.size();) {
    size_t end = i + 1;
    while (end < text.size() && end - i < 4 &&
           (uint8_t(text[end]) & 0xC0) == 0x80)
      ++end;
    std::string_view point = text.substr(i, end - i);
    if (int32_t id = lookup(point); id >= 0) {
      ids.push_back(id);
    } else {
      for (char byte : point)
        ids.push_back(int32_t(uint8_t(byte)) + 3);
    }
    i = end;
  }
  // Merge the adjacent pair whose merge scores highest until none merges.
  std::string pair;
  while (true) {
    float best = -1e10f;
    int32_t bestId = -1;
    size_t bestAt = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      pair = pieces_[ids[i]];
      pair += pieces_[ids[i + 1]];
      int32_t id = lookup(pair);
      if (id >= 0 && scores_[id] > best) {
        best = scores_[id];
        bestId = id;
        bestAt = i;
      }
    }
    if (bestId < 0)
      break;
    ids[bestAt] = bestId;
    ids.erase(ids.begin() + bestAt + 1);
  }
  return ids;
}

std::string Tokenizer::decode(int32_t previous, int32_t id) const {
  if (id == kBos || id == kEos)
    return "";
  if (id < 0 || id >= vocabSize())
    return "<" + std::to_string(id) + ">";
  std::string_view piece = pieces_[id];
  if (previous == kBos && !piece.empty() && piece.front() == ' ')
    piece.remove_prefix(1);
  unsigned byte = 0;
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
      std::sscanf(std::string(piece.substr(3, 2)).c_str(), "%02X", &byte) == 1)
    return std::string(1, char(byte));
  return std::string(piece);
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids,
                              int32_t previous) const {
  std::string text;
  for (int32_t id : ids) {
    text += decode(previous, id);
    previous = id;
  }
  return text;
}

} // namespace kvc
