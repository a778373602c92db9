//===- ChunkStore.cpp - Encoded, checked chunks on a tier -----------------===//

#include "kvc/Runtime/Store/ChunkStore.h"

namespace kvc {

ChunkStore::ChunkStore(std::shared_ptr<Tier> tier, ModelConfig model,
                       std::string fingerprint, std::string salt,
                       StoreLayout layout)
    : tier_(std::move(tier)), model_(std::move(model)),
      fingerprintHex_(fingerprint), salt_(salt),
      fingerprint_(digestFromHex(fingerprint)),
      keys_(fingerprint, std::move(salt), layout.chunkTokens), layout_(layout) {
}

StatusOr<std::vector<StoreLayout>>
ChunkStore::otherLayouts(const int32_t *tokens, int64_t count, Form form) {
  std::vector<StoreLayout> found;
  for (int64_t chunkTokens : {64, 128, 256, 512, 1024, 2048}) {
    if (chunkTokens > count)
      break;
    const Digest key = PrefixKeys(fingerprintHex_, salt_, chunkTokens)
                           .keys(tokens, chunkTokens)
                           .front();
    for (int64_t layerGroup : {1, 2, 4, 8}) {
      if (chunkTokens == layout_.chunkTokens &&
          layerGroup == layout_.layerGroup)
        continue;
      ChunkRef first{key,         form, 0,
                     chunkTokens, 0,    std::min(model_.numLayers, layerGroup)};
      KVC_ASSIGN_OR_RETURN(exists, tier_->exists(first.name()));
      if (exists)
        found.push_back({chunkTokens, layerGroup});
    }
  }
  return found;
}

std::vector<ChunkRef> ChunkStore::refs(const int32_t *tokens, int64_t count,
                                       Form form) const {
  std::vector<ChunkRef> out;
  std::vector<Digest> keys = keys_.keys(tokens, count);
  for (size_t c = 0; c < keys.size(); ++c) {
    int64_t t0 = int64_t(c) * layout_.chunkTokens;
    int64_t t1 = std::min(count, t0 + layout_.chunkTokens);
    for (int64_t l0 = 0; l0 < model_.numLayers; l0 += layout_.layerGroup)
      out.push_back({keys[c], form, t0, t1, l0,
                     std::min(model_.numLayers, l0 + layout_.layerGroup)});
  }
  return out;
}

ChunkShape ChunkStore::shape(const ChunkRef &ref) const {
  return chunkShape(model_, ref.form, ref.tokenEnd - ref.tokenBegin,
                    ref.layerBegin, ref.layerEnd - ref.layerBegin);
}

ChunkHeader ChunkStore::expected(const ChunkRef &ref) const {
  ChunkHeader h;
  h.form = ref.form;
  h.dtype = model_.dtype;
  h.tokenBegin = ref.tokenBegin;
  h.tokenEnd = ref.tokenEnd;
  h.layerBegin = ref.layerBegin;
  h.layerEnd = ref.layerEnd;
  h.fingerprint = fingerprint_;
  h.key = ref.key;
  return h;
}

StatusOr<std::optional<CodecSpec>>
ChunkStore::storedCodec(const ChunkRef &ref) {
  // One read: every tier reports an absent object as ChunkFault::Missing.
  std::string bytes;
  Status read = tier_->get(ref.name(), bytes);
  if (chunkFault(read) == ChunkFault::Missing)
    return std::optional<CodecSpec>();
  KVC_RETURN_IF_ERROR(read);
  auto unpacked = unpackChunk(bytes);
  if (!unpacked.isOk() || !checkChunk(unpacked->first, expected(ref)).isOk())
    return std::optional<CodecSpec>();
  return std::optional<CodecSpec>(unpacked->first.codec);
}

Status ChunkStore::put(const ChunkRef &ref, const float *values,
                       const CodecSpec &codec, bool *written, bool replace) {
  if (written)
    *written = false;
  KVC_ASSIGN_OR_RETURN(stored, storedCodec(ref));
  if (stored && *stored == codec)
    return Status::ok();
  if (stored && !replace)
    return chunkError(ChunkFault::WrongRange,
                      ref.name() + ": already stored with codec " +
                          stored->str() + ", not " + codec.str());
  StatusOr<std::string> payload =
      encodeChunk(values, shape(ref), codec, model_.dtype);
  if (!payload.isOk())
    return payload.status();
  ChunkHeader header = expected(ref);
  header.codec = codec;
  KVC_RETURN_IF_ERROR(tier_->put(ref.name(), packChunk(header, *payload)));
  if (written)
    *written = true;
  return Status::ok();
}

namespace {

/// Checks `bytes` against what `ref` should hold and decodes them with
/// `decodeAs(payload, header)`; decoding errors are corrupt chunks.
template <typename DecodeFn>
Status checkAndDecode(const ChunkRef &ref, std::string_view bytes,
                      const ChunkHeader &expected, DType modelDType,
                      CodecSpec *codec, const CodecSpec *planned,
                      DecodeFn decodeAs) {
  auto unpacked = unpackChunk(bytes);
  if (!unpacked.isOk())
    return unpacked.status().withContext(ref.name());
  const auto &[header, payload] = *unpacked;
  KVC_RETURN_IF_ERROR(checkChunk(header, expected).withContext(ref.name()));
  if (header.dtype != modelDType)
    return chunkError(ChunkFault::WrongModel,
                      ref.name() + ": chunk stores " + dtypeName(header.dtype) +
                          ", the model " + dtypeName(modelDType));
  if (planned && !(header.codec == *planned))
    return chunkError(ChunkFault::WrongRange,
                      ref.name() + ": chunk was stored with codec " +
                          header.codec.str() + ", the plan loads " +
                          planned->str());
  Status decoded = decodeAs(payload, header);
  if (!decoded.isOk())
    return chunkError(ChunkFault::Corrupt,
                      ref.name() + ": " + decoded.message());
  if (codec)
    *codec = header.codec;
  return Status::ok();
}

} // namespace

Status ChunkStore::decode(const ChunkRef &ref, std::string_view bytes,
                          float *out, CodecSpec *codec,
                          const CodecSpec *planned) const {
  return checkAndDecode(
      ref, bytes, expected(ref), model_.dtype, codec, planned,
      [&](std::string_view payload, const ChunkHeader &header) {
        return decodeChunk(payload, shape(ref), header.codec, header.dtype,
                           out);
      });
}

Status ChunkStore::decode(const ChunkRef &ref, std::string_view bytes,
                          uint16_t *out, CodecSpec *codec,
                          const CodecSpec *planned) const {
  return checkAndDecode(
      ref, bytes, expected(ref), model_.dtype, codec, planned,
      [&](std::string_view payload, const ChunkHeader &header) {
        return decodeChunkToBf16(payload, shape(ref), header.codec,
                                 header.dtype, out);
      });
}

StatusOr<StoredExtent> ChunkStore::stored(const int32_t *tokens, int64_t count,
                                          Form form) {
  StoredExtent extent;
  std::vector<ChunkRef> objects = refs(tokens, count, form);
  for (const ChunkRef &ref : objects) {
    StatusOr<bool> exists = tier_->exists(ref.name());
    if (!exists.isOk())
      return exists.status();
    if (!*exists) {
      extent.tokens = std::min(extent.tokens, ref.tokenBegin);
      break;
    }
    extent.tokens = std::max(extent.tokens, ref.tokenEnd);
  }
  if (extent.tokens > 0) {
    std::vector<float> values(shape(objects.front()).numel());
    KVC_RETURN_IF_ERROR(get(objects.front(), values.data(), &extent.codec));
  }
  return extent;
}

Status ChunkStore::get(const ChunkRef &ref, float *out, CodecSpec *codec) {
  std::string bytes;
  KVC_RETURN_IF_ERROR(tier_->get(ref.name(), bytes));
  return decode(ref, bytes, out, codec);
}

} // namespace kvc
