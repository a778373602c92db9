//===- Sha256.cpp - SHA-256 digests (OpenSSL) -----------------------------===//

#include "kvc/Runtime/Base/Sha256.h"

#include <openssl/evp.h>

namespace kvc {

struct Sha256::Context {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  ~Context() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  EVP_DigestInit_ex(context_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() = default;

Sha256 &Sha256::update(const void *data, size_t size) {
  EVP_DigestUpdate(context_->ctx, data, size);
  return *this;
}

Sha256 &Sha256::update(uint64_t value) {
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i)
    bytes[i] = uint8_t(value >> (8 * i));
  return update(bytes, sizeof(bytes));
}

Digest Sha256::finish() {
  Digest digest;
  unsigned int size = 0;
  EVP_DigestFinal_ex(context_->ctx, digest.data(), &size);
  return digest;
}

std::string toHex(const Digest &digest, size_t bytes) {
  static const char hex[] = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < bytes && i < digest.size(); ++i) {
    text += hex[digest[i] >> 4];
    text += hex[digest[i] & 15];
  }
  return text;
}

} // namespace kvc
