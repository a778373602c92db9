//===- ChunkFormat.cpp - Stored chunks: keys and the object format --------===//

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

namespace kvc {

ChunkFault chunkFault(const Status &status) {
  return status.isOk() ? ChunkFault::None : ChunkFault(status.detail());
}

Status chunkError(ChunkFault fault, std::string message) {
  StatusCode code = StatusCode::FailedPrecondition;
  switch (fault) {
  case ChunkFault::None:
    return Status::ok();
  case ChunkFault::Missing:
    code = StatusCode::NotFound;
    break;
  case ChunkFault::Corrupt:
  case ChunkFault::Truncated:
    code = StatusCode::DataLoss;
    break;
  case ChunkFault::Unavailable:
    code = StatusCode::Unavailable;
    break;
  default:
    break;
  }
  return Status(code, std::move(message), int(fault));
}

PrefixKeys::PrefixKeys(std::string fingerprint, std::string salt,
                       int64_t chunkTokens)
    : fingerprint_(std::move(fingerprint)), salt_(std::move(salt)),
      chunkTokens_(chunkTokens) {}

std::vector<Digest> PrefixKeys::keys(const int32_t *tokens,
                                     int64_t count) const {
  std::vector<Digest> out;
  Digest parent{};
  for (int64_t begin = 0; begin < count; begin += chunkTokens_) {
    int64_t end = std::min(count, begin + chunkTokens_);
    Sha256 hash;
    hash.update("kvc-prefix-v1")
        .update(parent.data(), parent.size())
        .update(uint64_t(end - begin));
    for (int64_t i = begin; i < end; ++i)
      hash.update(uint64_t(uint32_t(tokens[i])));
    hash.update(fingerprint_).update(uint64_t(salt_.size())).update(salt_);
    parent = hash.finish();
    out.push_back(parent);
  }
  return out;
}

std::string chunkObjectPrefix(const Digest &key, Form form, int64_t layerBegin,
                              int64_t layerEnd) {
  return toHex(key) + "/" + name(form) + "/" + std::to_string(layerBegin) +
         "-" + std::to_string(layerEnd) + "/";
}

std::string chunkObjectName(const Digest &key, Form form, int64_t layerBegin,
                            int64_t layerEnd, const CodecSpec &codec) {
  std::string encoding = codec.str();
  std::replace(encoding.begin(), encoding.end(), '/', '.');
  return chunkObjectPrefix(key, form, layerBegin, layerEnd) + encoding;
}

StatusOr<CodecSpec> parseEncodingName(std::string_view encoding) {
  // Only the names chunkObjectName writes ('.' for every '/', the codec's
  // own spelling): "int8" or "int8.g032" would alias int8.g32's object.
  if (encoding.find('/') == std::string_view::npos) {
    std::string text(encoding);
    std::replace(text.begin(), text.end(), '.', '/');
    StatusOr<CodecSpec> codec = parseCodecSpec(text);
    if (codec.isOk() && codec->str() == text)
      return codec;
  }
  return invalidArgument("\"" + std::string(encoding) +
                         "\" names no encoding of a stored chunk");
}

Digest digestFromHex(std::string_view hex) {
  Digest d{};
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    return -1;
  };
  if (hex.size() != 64)
    return d;
  for (size_t i = 0; i < 32; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return Digest{};
    d[i] = uint8_t(hi * 16 + lo);
  }
  return d;
}

namespace {

constexpr char kMagic[8] = {'K', 'V', 'C', 'C', 'H', 'U', 'N', 'K'};
constexpr size_t kMaxBins = 8;

class Writer {
public:
  explicit Writer(std::string &out) : out_(out) {}
  void bytes(const void *p, size_t n) {
    out_.append(static_cast<const char *>(p), n);
  }
  template <typename T> void le(T value) {
    for (size_t i = 0; i < sizeof(T); ++i)
      out_.push_back(char(uint64_t(value) >> (8 * i)));
  }

private:
  std::string &out_;
};

class Reader {
public:
  explicit Reader(std::string_view in) : in_(in) {}
  void bytes(void *p, size_t n) {
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  template <typename T> T le() {
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= uint64_t(uint8_t(in_[at_ + i])) << (8 * i);
    at_ += sizeof(T);
    return T(v);
  }

private:
  std::string_view in_;
  size_t at_ = 0;
};

uint32_t crc32(std::string_view bytes) { return chunkCrc32(0, bytes); }

} // namespace

uint32_t chunkCrc32(uint32_t crc, std::string_view bytes) {
  return crc32_gzip_refl(
      crc, reinterpret_cast<const unsigned char *>(bytes.data()), bytes.size());
}

std::string packChunk(ChunkHeader h, std::string_view payload) {
  h.payloadBytes = payload.size();
  h.payloadCrc = crc32(payload);
  std::string out;
  out.reserve(kChunkHeaderBytes + payload.size());
  Writer w(out);
  w.bytes(kMagic, 8);
  w.le<uint16_t>(kChunkFormatVersion);
  w.le<uint16_t>(kChunkHeaderBytes);
  w.le<uint8_t>(uint8_t(h.form));
  w.le<uint8_t>(uint8_t(h.dtype));
  w.le<uint8_t>(uint8_t(h.codec.transform));
  w.le<uint8_t>(uint8_t(h.codec.quant));
  w.le<uint8_t>(uint8_t(h.codec.keyAxis));
  w.le<uint8_t>(uint8_t(h.codec.valueAxis));
  w.le<uint8_t>(uint8_t(h.codec.lossless));
  w.le<uint8_t>(uint8_t(std::min(h.codec.layerBits.size(), kMaxBins)));
  w.le<uint32_t>(uint32_t(h.codec.group));
  for (size_t i = 0; i < kMaxBins; ++i)
    w.le<uint8_t>(i < h.codec.layerBits.size() ? h.codec.layerBits[i] : 0);
  w.le<uint64_t>(h.tokenBegin);
  w.le<uint64_t>(h.tokenEnd);
  w.le<uint32_t>(h.layerBegin);
  w.le<uint32_t>(h.layerEnd);
  w.bytes(h.fingerprint.data(), 32);
  w.bytes(h.key.data(), 32);
  w.le<uint64_t>(h.payloadBytes);
  w.le<uint32_t>(h.payloadCrc);
  w.le<uint32_t>(crc32(std::string_view(out).substr(0, out.size())));
  out.append(payload);
  return out;
}

StatusOr<ChunkHeader> readChunkHeader(std::string_view bytes) {
  if (bytes.size() < kChunkHeaderBytes)
    return chunkError(ChunkFault::Truncated,
                      "chunk of " + std::to_string(bytes.size()) +
                          " bytes is shorter than its header");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0)
    return chunkError(ChunkFault::Corrupt, "not a kvc chunk (bad magic)");
  Reader r(bytes.substr(0, kChunkHeaderBytes));
  char magic[8];
  r.bytes(magic, 8);
  uint16_t version = r.le<uint16_t>();
  uint16_t headerBytes = r.le<uint16_t>();
  if (version != kChunkFormatVersion || headerBytes != kChunkHeaderBytes)
    return chunkError(ChunkFault::Corrupt,
                      "chunk format version " + std::to_string(version) +
                          " (this kvc reads version " +
                          std::to_string(kChunkFormatVersion) + ")");
  uint32_t headerCrc = 0;
  std::memcpy(&headerCrc, bytes.data() + kChunkHeaderBytes - 4, 4);
  if (crc32(bytes.substr(0, kChunkHeaderBytes - 4)) != headerCrc)
    return chunkError(ChunkFault::Corrupt, "chunk header checksum mismatch");
  ChunkHeader h;
  h.form = Form(r.le<uint8_t>());
  h.dtype = DType(r.le<uint8_t>());
  h.codec.transform = CodecSpec::Transform(r.le<uint8_t>());
  h.codec.quant = CodecSpec::Quant(r.le<uint8_t>());
  h.codec.keyAxis = CodecSpec::Axis(r.le<uint8_t>());
  h.codec.valueAxis = CodecSpec::Axis(r.le<uint8_t>());
  h.codec.lossless = CodecSpec::Lossless(r.le<uint8_t>());
  size_t bins = r.le<uint8_t>();
  h.codec.group = r.le<uint32_t>();
  for (size_t i = 0; i < kMaxBins; ++i) {
    uint8_t b = r.le<uint8_t>();
    if (i < bins)
      h.codec.layerBits.push_back(b);
  }
  h.tokenBegin = int64_t(r.le<uint64_t>());
  h.tokenEnd = int64_t(r.le<uint64_t>());
  h.layerBegin = r.le<uint32_t>();
  h.layerEnd = r.le<uint32_t>();
  r.bytes(h.fingerprint.data(), 32);
  r.bytes(h.key.data(), 32);
  h.payloadBytes = r.le<uint64_t>();
  h.payloadCrc = r.le<uint32_t>();
  // Enumerations out of range cannot pass the header checksum by accident,
  // but a forged header can: reject them too. A codec stage is one the
  // codec registry has.
  auto outOf = [](auto stage, StageKind kind) {
    return int(stage) > countStages(kind);
  };
  if (uint8_t(h.form) > 1 || uint8_t(h.dtype) > 2 ||
      outOf(h.codec.transform, StageKind::Transform) ||
      outOf(h.codec.quant, StageKind::Quant) ||
      uint8_t(h.codec.keyAxis) > 1 || uint8_t(h.codec.valueAxis) > 1 ||
      outOf(h.codec.lossless, StageKind::Lossless) || bins > kMaxBins)
    return chunkError(ChunkFault::Corrupt, "chunk header has invalid fields");
  return h;
}

StatusOr<std::pair<ChunkHeader, std::string_view>>
unpackChunk(std::string_view bytes) {
  KVC_ASSIGN_OR_RETURN(h, readChunkHeader(bytes));
  if (bytes.size() - kChunkHeaderBytes < h.payloadBytes)
    return chunkError(ChunkFault::Truncated,
                      "chunk payload of " +
                          std::to_string(bytes.size() - kChunkHeaderBytes) +
                          " bytes, header says " +
                          std::to_string(h.payloadBytes));
  if (bytes.size() - kChunkHeaderBytes > h.payloadBytes)
    return chunkError(ChunkFault::Corrupt, "chunk has trailing bytes");
  std::string_view payload = bytes.substr(kChunkHeaderBytes);
  if (crc32(payload) != h.payloadCrc)
    return chunkError(ChunkFault::Corrupt, "chunk payload checksum mismatch");
  return std::make_pair(h, payload);
}

Status checkChunk(const ChunkHeader &got, const ChunkHeader &want) {
  if (got.fingerprint != want.fingerprint)
    return chunkError(ChunkFault::WrongModel,
                      "chunk was saved by model " + toHex(got.fingerprint, 8) +
                          ", not " + toHex(want.fingerprint, 8));
  if (got.key != want.key)
    return chunkError(ChunkFault::WrongKey,
                      "chunk belongs to prefix " + toHex(got.key, 8) +
                          " (another prefix or tenant), not " +
                          toHex(want.key, 8));
  if (got.codec != want.codec)
    return chunkError(ChunkFault::WrongRange, "chunk was stored with codec " +
                                                  got.codec.str() + ", not " +
                                                  want.codec.str());
  if (got.form != want.form || got.tokenBegin != want.tokenBegin ||
      got.tokenEnd != want.tokenEnd || got.layerBegin != want.layerBegin ||
      got.layerEnd != want.layerEnd)
    return chunkError(ChunkFault::WrongRange,
                      "chunk holds " + std::string(name(got.form)) +
                          " tokens " + std::to_string(got.tokenBegin) + " to " +
                          std::to_string(got.tokenEnd) + " of layers " +
                          std::to_string(got.layerBegin) + " to " +
                          std::to_string(got.layerEnd) +
                          ", not the requested " + name(want.form) +
                          " tokens " + std::to_string(want.tokenBegin) +
                          " to " + std::to_string(want.tokenEnd) +
                          " of layers " + std::to_string(want.layerBegin) +
                          " to " + std::to_string(want.layerEnd));
  return Status::ok();
}

} // namespace kvc
