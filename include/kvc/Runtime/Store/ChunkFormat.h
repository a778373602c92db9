//===- ChunkFormat.h - Stored chunks: keys and object format ----*- C++ -*-===//
//
// A stored chunk is one (prefix chunk of tokens, group of layers, form): a
// fixed 136-byte little-endian header followed by the encoded payload
// (docs/store-format.md), named by its key, range and encoding. Keys are
// chained SHA-256 digests over token chunks, so equal prefixes share chunks
// across processes and machines while different models or tenants never
// do. Every read is checked; a chunk that is missing, corrupt, truncated,
// from another model, filed under another key, or for another range or
// encoding is a typed error (ChunkFault), never data.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_STORE_CHUNKFORMAT_H
#define KVC_RUNTIME_STORE_CHUNKFORMAT_H

#include "kvc/Runtime/Base/Sha256.h"
#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"

#include <string>
#include <string_view>
#include <vector>

namespace kvc {

/// Why a chunk could not be used (Status::detail() of store errors).
enum class ChunkFault {
  None = 0,
  Missing,     ///< No object under the key (NotFound).
  Corrupt,     ///< Bad magic, header or payload checksum (DataLoss).
  Truncated,   ///< Shorter than its header says (DataLoss).
  WrongModel,  ///< Another model's fingerprint (FailedPrecondition).
  WrongKey,    ///< Filed under another prefix or tenant (FailedPrecondition).
  WrongRange,  ///< Other tokens, layers, form or codec (FailedPrecondition).
  Unavailable, ///< The tier cannot be reached (Unavailable).
};

/// The fault a store Status carries (None for other errors or ok).
ChunkFault chunkFault(const Status &status);
Status chunkError(ChunkFault fault, std::string message);

/// Chained prefix keys over token chunks.
class PrefixKeys {
public:
  /// `fingerprint` is the model's (hex); `salt` separates tenants.
  PrefixKeys(std::string fingerprint, std::string salt, int64_t chunkTokens);

  int64_t chunkTokens() const { return chunkTokens_; }
  /// One key per chunk of `tokens` (the last may be partial): key i hashes
  /// key i-1, chunk i's tokens, the fingerprint and the salt.
  std::vector<Digest> keys(const int32_t *tokens, int64_t count) const;

private:
  std::string fingerprint_, salt_;
  int64_t chunkTokens_;
};

/// The object name of a chunk's encoding with `codec`:
/// "<key hex>/<form>/<layer begin>-<layer end>/<encoding>", the encoding
/// being the codec's string with '/' written as '.' ("raw",
/// "int8.g32+zstd"). Encodings of one chunk sit side by side; a tier lists
/// them by the name up to the encoding (chunkObjectPrefix).
std::string chunkObjectName(const Digest &key, Form form, int64_t layerBegin,
                            int64_t layerEnd, const CodecSpec &codec);
/// "<key hex>/<form>/<layer begin>-<layer end>/".
std::string chunkObjectPrefix(const Digest &key, Form form, int64_t layerBegin,
                              int64_t layerEnd);
/// The codec of an encoding an object name ends in (what follows its
/// chunkObjectPrefix).
StatusOr<CodecSpec> parseEncodingName(std::string_view encoding);

inline constexpr uint16_t kChunkFormatVersion = 1;
inline constexpr size_t kChunkHeaderBytes = 136;

struct ChunkHeader {
  Form form = Form::KV;
  DType dtype = DType::BF16;
  CodecSpec codec;
  int64_t tokenBegin = 0, tokenEnd = 0;
  int64_t layerBegin = 0, layerEnd = 0;
  Digest fingerprint{}; ///< The model's, binary.
  Digest key{};         ///< The prefix key the chunk is filed under.
  uint64_t payloadBytes = 0;
  uint32_t payloadCrc = 0;
};

/// The CRC-32 (gzip's, reflected IEEE) of `bytes` continued from `crc` (0
/// to start): every checksum of the chunk format. ISA-L's folding with
/// carry-less multiplies (VPCLMULQDQ where the CPU has it): 68 GB/s on the
/// CI's AMD host, libdeflate's 17; a restore checks every byte it loads.
uint32_t chunkCrc32(uint32_t crc, std::string_view bytes);

/// Header + payload, checksums filled in.
std::string packChunk(ChunkHeader header, std::string_view payload);

/// Checks magic, version and header checksum; returns the header (which
/// chunk the bytes claim to be, before their payload is trusted).
StatusOr<ChunkHeader> readChunkHeader(std::string_view bytes);

/// Checks magic, version, header checksum, length and payload checksum;
/// returns the header and a view of the payload inside `bytes`.
StatusOr<std::pair<ChunkHeader, std::string_view>>
unpackChunk(std::string_view bytes);

/// Checks that a parsed header is the chunk the reader asked for, encoding
/// included.
Status checkChunk(const ChunkHeader &got, const ChunkHeader &want);

/// Binary digest of a 64-character hex fingerprint (zeros when malformed).
Digest digestFromHex(std::string_view hex);

} // namespace kvc

#endif // KVC_RUNTIME_STORE_CHUNKFORMAT_H
