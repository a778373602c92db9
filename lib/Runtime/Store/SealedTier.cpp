//===- SealedTier.cpp - Objects sealed under a deployment key -------------===//

#include "SealedTier.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <iterator>

namespace kvc {

namespace {

/// HMAC-SHA256 of `name` (with its length, so that name and bytes cannot
/// trade places) and `bytes` under `key`.
Status seal(const std::string &key, std::string_view name,
            std::string_view bytes, unsigned char (&mac)[kSealBytes]) {
  EVP_MAC *hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX *context = hmac ? EVP_MAC_CTX_new(hmac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end()};
  const uint64_t nameBytes = name.size();
  size_t written = 0;
  const bool ok =
      context &&
      EVP_MAC_init(context, reinterpret_cast<const unsigned char *>(key.data()),
                   key.size(), params) == 1 &&
      EVP_MAC_update(context, reinterpret_cast<const unsigned char *>(&nameBytes),
                     sizeof(nameBytes)) == 1 &&
      EVP_MAC_update(context,
                     reinterpret_cast<const unsigned char *>(name.data()),
                     name.size()) == 1 &&
      EVP_MAC_update(context,
                     reinterpret_cast<const unsigned char *>(bytes.data()),
                     bytes.size()) == 1 &&
      EVP_MAC_final(context, mac, &written, kSealBytes) == 1 &&
      written == kSealBytes;
  EVP_MAC_CTX_free(context);
  EVP_MAC_free(hmac);
  return ok ? Status::ok() : internalError("HMAC-SHA256 failed (OpenSSL)");
}

class SealedTier final : public ForwardingTier {
public:
  SealedTier(std::unique_ptr<Tier> inner, std::string key)
      : ForwardingTier(std::move(inner)), key_(std::move(key)) {}
  ~SealedTier() override { OPENSSL_cleanse(key_.data(), key_.size()); }

  Status put(const std::string &name, std::string_view bytes) override {
    unsigned char mac[kSealBytes];
    KVC_RETURN_IF_ERROR(seal(key_, name, bytes, mac));
    std::string sealed;
    sealed.reserve(bytes.size() + kSealBytes);
    sealed.append(bytes);
    sealed.append(reinterpret_cast<const char *>(mac), kSealBytes);
    return inner().put(name, sealed);
  }

  Status get(const std::string &name, std::string &buffer) override {
    KVC_RETURN_IF_ERROR(inner().get(name, buffer));
    return open(name, buffer);
  }

  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    std::vector<Status> out = inner().getMany(names, buffers);
    for (size_t i = 0; i < names.size(); ++i)
      if (out[i].isOk())
        out[i] = open(names[i], buffers[i]);
    return out;
  }

private:
  /// Checks `buffer`'s seal and drops it; Corrupt when it does not hold.
  Status open(const std::string &name, std::string &buffer) const {
    if (buffer.size() < kSealBytes)
      return refused(name, "too short to carry one");
    const size_t size = buffer.size() - kSealBytes;
    unsigned char mac[kSealBytes];
    KVC_RETURN_IF_ERROR(
        seal(key_, name, std::string_view(buffer).substr(0, size), mac));
    if (CRYPTO_memcmp(mac, buffer.data() + size, kSealBytes) != 0)
      return refused(name, "its MAC does not hold");
    buffer.resize(size);
    return Status::ok();
  }

  Status refused(const std::string &name, const char *why) const {
    return chunkError(ChunkFault::Corrupt,
                      url() + ": object " + name +
                          " is not sealed under the deployment key (" + why +
                          "): written without the key, or altered");
  }

  std::string key_;
};

} // namespace

StatusOr<std::unique_ptr<Tier>> sealTier(std::unique_ptr<Tier> inner,
                                         std::string key) {
  if (key.size() < 16)
    return invalidArgument(inner->url() +
                           ": a deployment key needs at least 16 bytes");
  return std::unique_ptr<Tier>(
      std::make_unique<SealedTier>(std::move(inner), std::move(key)));
}

StatusOr<std::string> readDeploymentKey(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound("cannot read the deployment key file " + path);
  std::string key((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r'))
    key.pop_back();
  return key;
}

} // namespace kvc
