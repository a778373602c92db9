//===- Sha256.h - SHA-256 digests (OpenSSL) ---------------------*- C++ -*-===//

#ifndef KVC_RUNTIME_BASE_SHA256_H
#define KVC_RUNTIME_BASE_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kvc {

using Digest = std::array<uint8_t, 32>;

/// Incremental SHA-256.
class Sha256 {
public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256 &) = delete;
  Sha256 &operator=(const Sha256 &) = delete;

  Sha256 &update(const void *data, size_t size);
  Sha256 &update(std::string_view text) {
    return update(text.data(), text.size());
  }
  /// Hashes a little-endian 64-bit integer (lengths, token ids).
  Sha256 &update(uint64_t value);
  Digest finish();

private:
  struct Context;
  std::unique_ptr<Context> context_;
};

/// Lower-case hex of `digest` (its first `bytes` bytes).
std::string toHex(const Digest &digest, size_t bytes = 32);

} // namespace kvc

#endif // KVC_RUNTIME_BASE_SHA256_H
