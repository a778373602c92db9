//===- ChunkStore.cpp - Encoded, checked chunks on a tier -----------------===//

#include "kvc/Runtime/Store/ChunkStore.h"

#include "kvc/Runtime/Base/Sha256.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

namespace kvc {

ChunkObjects::ChunkObjects(ModelConfig model, std::string fingerprint,
                           std::string salt, StoreLayout layout)
    : model_(std::move(model)), fingerprintHex_(fingerprint), salt_(salt),
      fingerprint_(digestFromHex(fingerprint)),
      keys_(fingerprint, std::move(salt), layout.chunkTokens), layout_(layout) {
}

ChunkStore::ChunkStore(std::shared_ptr<Tier> tier, ModelConfig model,
                       std::string fingerprint, std::string salt,
                       StoreLayout layout)
    : ChunkObjects(std::move(model), std::move(fingerprint), std::move(salt),
                   layout),
      tier_(std::move(tier)) {}

StatusOr<std::vector<StoreLayout>>
ChunkStore::otherLayouts(const int32_t *tokens, int64_t count, Form form) {
  std::vector<StoreLayout> found;
  for (int64_t chunkTokens : {64, 128, 256, 512, 1024, 2048}) {
    if (chunkTokens > count)
      break;
    const Digest key = PrefixKeys(fingerprint(), salt(), chunkTokens)
                           .keys(tokens, chunkTokens)
                           .front();
    for (int64_t layerGroup : {1, 2, 4, 8}) {
      if (chunkTokens == layout().chunkTokens &&
          layerGroup == layout().layerGroup)
        continue;
      KVC_ASSIGN_OR_RETURN(
          names, tier_->list(chunkObjectPrefix(
                     key, form, 0, std::min(model().numLayers, layerGroup))));
      if (!names.empty())
        found.push_back({chunkTokens, layerGroup});
    }
  }
  return found;
}

std::vector<ChunkRef> ChunkObjects::refs(const int32_t *tokens, int64_t count,
                                         Form form,
                                         const CodecSpec &codec) const {
  std::vector<ChunkRef> out;
  std::vector<Digest> keys = keys_.keys(tokens, count);
  for (size_t c = 0; c < keys.size(); ++c) {
    int64_t t0 = int64_t(c) * layout_.chunkTokens;
    int64_t t1 = std::min(count, t0 + layout_.chunkTokens);
    for (int64_t l0 = 0; l0 < model_.numLayers; l0 += layout_.layerGroup)
      out.push_back({keys[c], form, t0, t1, l0,
                     std::min(model_.numLayers, l0 + layout_.layerGroup),
                     codec});
  }
  return out;
}

ChunkShape ChunkObjects::shape(const ChunkRef &ref) const {
  return chunkShape(model_, ref.form, ref.tokenEnd - ref.tokenBegin,
                    ref.layerBegin, ref.layerEnd - ref.layerBegin);
}

ChunkHeader ChunkObjects::expected(const ChunkRef &ref) const {
  ChunkHeader h;
  h.form = ref.form;
  h.dtype = model_.dtype;
  h.tokenBegin = ref.tokenBegin;
  h.tokenEnd = ref.tokenEnd;
  h.layerBegin = ref.layerBegin;
  h.layerEnd = ref.layerEnd;
  h.fingerprint = fingerprint_;
  h.key = ref.key;
  h.codec = ref.codec;
  return h;
}

StatusOr<std::vector<CodecSpec>> ChunkStore::encodings(const ChunkRef &ref) {
  const std::string prefix =
      chunkObjectPrefix(ref.key, ref.form, ref.layerBegin, ref.layerEnd);
  KVC_ASSIGN_OR_RETURN(names, tier_->list(prefix));
  std::vector<CodecSpec> codecs;
  for (const std::string &name : names)
    // Whatever else a tier holds under the prefix is no chunk of ours.
    if (StatusOr<CodecSpec> codec =
            parseEncodingName(std::string_view(name).substr(prefix.size()));
        codec.isOk())
      codecs.push_back(*codec);
  return codecs;
}

StatusOr<std::string> ChunkObjects::encode(const ChunkRef &ref,
                                           const float *values) const {
  KVC_ASSIGN_OR_RETURN(
      payload, encodeChunk(values, shape(ref), ref.codec, model_.dtype));
  return packChunk(expected(ref), payload);
}

StatusOr<std::string>
ChunkObjects::encodePayload(const ChunkRef &ref,
                            std::string_view payload) const {
  KVC_ASSIGN_OR_RETURN(
      packed, compressPayload(payload, shape(ref), ref.codec, model_.dtype));
  return packChunk(expected(ref), packed);
}

bool ChunkObjects::holds(const ChunkRef &ref, std::string_view bytes) const {
  auto unpacked = unpackChunk(bytes);
  return unpacked.isOk() && checkChunk(unpacked->first, expected(ref)).isOk();
}

StatusOr<bool> ChunkStore::has(const ChunkRef &ref) {
  // One read: every tier reports an absent object as ChunkFault::Missing.
  std::string bytes;
  Status read = tier_->get(ref.name(), bytes);
  if (!read.isOk() && chunkFault(read) != ChunkFault::Missing)
    return read;
  return read.isOk() && holds(ref, bytes);
}

namespace {

/// Writes the object `encodeFn()` makes unless `store` holds a readable one
/// already (a corrupt one is written again).
template <typename EncodeFn>
Status putUnlessStored(ChunkStore &store, const ChunkRef &ref, bool *written,
                       EncodeFn encodeFn) {
  if (written)
    *written = false;
  KVC_ASSIGN_OR_RETURN(stored, store.has(ref));
  if (stored)
    return Status::ok();
  KVC_ASSIGN_OR_RETURN(object, encodeFn());
  KVC_RETURN_IF_ERROR(store.recordLayout());
  KVC_RETURN_IF_ERROR(store.tier().put(ref.name(), object));
  if (written)
    *written = true;
  return Status::ok();
}

} // namespace

namespace {

/// The folder of a model's and tenant's layout records.
std::string layoutFolder(const std::string &fingerprint,
                         const std::string &salt) {
  Sha256 hash;
  hash.update("kvc-layouts-v1")
      .update(fingerprint)
      .update(uint64_t(salt.size()))
      .update(salt);
  return "layouts/" + toHex(hash.finish(), 16) + "/";
}

} // namespace

StatusOr<std::vector<StoreLayout>> recordedLayouts(Tier &tier,
                                                   const std::string &fingerprint,
                                                   const std::string &salt) {
  KVC_ASSIGN_OR_RETURN(names, tier.list(layoutFolder(fingerprint, salt)));
  std::vector<StoreLayout> layouts;
  for (const std::string &name : names) {
    StoreLayout layout;
    char x = 0, rest = 0;
    std::istringstream in(name.substr(name.rfind('/') + 1));
    // Anything else under the folder is not a record: skipped.
    if (!(in >> layout.chunkTokens >> x >> layout.layerGroup) || x != 'x' ||
        in >> rest || layout.chunkTokens <= 0 || layout.layerGroup <= 0)
      continue;
    layouts.push_back(layout);
  }
  std::sort(layouts.begin(), layouts.end(),
            [](const StoreLayout &a, const StoreLayout &b) {
              return std::tie(a.chunkTokens, a.layerGroup) <
                     std::tie(b.chunkTokens, b.layerGroup);
            });
  return layouts;
}

Status ChunkStore::recordLayout() {
  if (*recorded_)
    return Status::ok();
  const std::string name = layoutFolder(fingerprint(), salt()) +
                           std::to_string(layout().chunkTokens) + "x" +
                           std::to_string(layout().layerGroup);
  KVC_ASSIGN_OR_RETURN(exists, tier_->exists(name));
  if (!exists)
    KVC_RETURN_IF_ERROR(tier_->put(
        name, "kvc-layout/1 chunk_tokens=" +
                  std::to_string(layout().chunkTokens) +
                  " layer_group=" + std::to_string(layout().layerGroup) + "\n"));
  *recorded_ = true;
  return Status::ok();
}

Status ChunkStore::put(const ChunkRef &ref, const float *values,
                       bool *written) {
  return putUnlessStored(*this, ref, written,
                         [&] { return encode(ref, values); });
}

Status ChunkStore::putEncoded(const ChunkRef &ref, std::string_view object,
                              bool *written) {
  return putUnlessStored(*this, ref, written,
                         [&] { return StatusOr<std::string_view>(object); });
}

namespace {

/// Checks `bytes` against what `ref` should hold and decodes them with
/// `decodeAs(payload, header)`; decoding errors are corrupt chunks.
template <typename DecodeFn>
Status checkAndDecode(const ChunkRef &ref, std::string_view bytes,
                      const ChunkHeader &expected, DType modelDType,
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
  Status decoded = decodeAs(payload, header);
  if (!decoded.isOk())
    return chunkError(ChunkFault::Corrupt,
                      ref.name() + ": " + decoded.message());
  return Status::ok();
}

/// DataLoss when `count` of a chunk's values are NaN or infinite: a chunk
/// whose checksums hold but whose values do not (written so, or by a model
/// whose weights hold them) is a corrupt chunk, recomputed, never served.
Status refuseNonFinite(const ChunkRef &ref, int64_t count) {
  if (count == 0)
    return Status::ok();
  return chunkError(ChunkFault::Corrupt,
                    ref.name() + ": holds " + std::to_string(count) +
                        " non-finite values (NaN or infinity)");
}

} // namespace

Status ChunkObjects::decode(const ChunkRef &ref, std::string_view bytes,
                            float *out) const {
  KVC_RETURN_IF_ERROR(checkAndDecode(
      ref, bytes, expected(ref), model_.dtype,
      [&](std::string_view payload, const ChunkHeader &header) {
        return decodeChunk(payload, shape(ref), header.codec, header.dtype,
                           out);
      }));
  const int64_t n = shape(ref).numel();
  return refuseNonFinite(
      ref, payloadNonFinite(std::string_view(reinterpret_cast<const char *>(out),
                                             size_t(n) * sizeof(float)),
                            shape(ref), CodecSpec(), DType::F32));
}

Status ChunkObjects::decode(const ChunkRef &ref, std::string_view bytes,
                            uint16_t *out) const {
  KVC_RETURN_IF_ERROR(checkAndDecode(
      ref, bytes, expected(ref), model_.dtype,
      [&](std::string_view payload, const ChunkHeader &header) {
        return decodeChunkToBf16(payload, shape(ref), header.codec,
                                 header.dtype, out);
      }));
  const int64_t n = shape(ref).numel();
  return refuseNonFinite(
      ref, payloadNonFinite(std::string_view(reinterpret_cast<const char *>(out),
                                             size_t(n) * sizeof(uint16_t)),
                            shape(ref), CodecSpec(), DType::BF16));
}

Status ChunkObjects::decode(const ChunkRef &ref, std::string_view bytes,
                            const std::vector<uint16_t *> &rows) const {
  const ChunkShape chunk = shape(ref);
  KVC_RETURN_IF_ERROR(
      checkAndDecode(ref, bytes, expected(ref), model_.dtype,
                     [&](std::string_view payload, const ChunkHeader &header) {
                       return decodeChunkToBf16Rows(
                           payload, chunk, header.codec, header.dtype, rows);
                     }));
  int64_t nonFinite = 0;
  for (const uint16_t *row : rows)
    nonFinite += payloadNonFinite(
        std::string_view(reinterpret_cast<const char *>(row),
                         std::size_t(chunk.width) * sizeof(uint16_t)),
        chunk, CodecSpec(), DType::BF16);
  return refuseNonFinite(ref, nonFinite);
}

Status
ChunkObjects::checkInPlace(const ChunkRef &ref, std::string_view header,
                           const std::vector<std::string_view> &payload) const {
  KVC_ASSIGN_OR_RETURN(h, readChunkHeader(header));
  if (!h.codec.isRaw())
    return internalError(ref.name() + ": checked in place, but stored as " +
                         h.codec.str());
  KVC_RETURN_IF_ERROR(checkChunk(h, expected(ref)).withContext(ref.name()));
  if (h.dtype != model_.dtype)
    return chunkError(ChunkFault::WrongModel,
                      ref.name() + ": chunk stores " + dtypeName(h.dtype) +
                          ", the model " + dtypeName(model_.dtype));
  size_t bytes = 0;
  for (std::string_view part : payload)
    bytes += part.size();
  if (bytes != h.payloadBytes)
    return chunkError(ChunkFault::Truncated,
                      ref.name() + ": chunk payload of " +
                          std::to_string(bytes) + " bytes, header says " +
                          std::to_string(h.payloadBytes));
  // A block is checksummed, then scanned while it is still in the cache.
  constexpr size_t kBlock = size_t(64) << 10;
  const ChunkShape chunk = shape(ref);
  uint32_t crc = 0;
  int64_t nonFinite = 0;
  for (std::string_view part : payload)
    for (size_t at = 0; at < part.size(); at += kBlock) {
      std::string_view block = part.substr(at, kBlock);
      crc = chunkCrc32(crc, block);
      nonFinite += payloadNonFinite(block, chunk, h.codec, h.dtype);
    }
  if (crc != h.payloadCrc)
    return chunkError(ChunkFault::Corrupt,
                      ref.name() + ": chunk payload checksum mismatch");
  return refuseNonFinite(ref, nonFinite);
}

Status ChunkObjects::payload(const ChunkRef &ref, std::string_view bytes,
                             std::string &out) const {
  CodecSpec codec;
  DType dtype = model_.dtype;
  KVC_RETURN_IF_ERROR(checkAndDecode(
      ref, bytes, expected(ref), model_.dtype,
      [&](std::string_view payload, const ChunkHeader &header) {
        codec = header.codec;
        dtype = header.dtype;
        return decompressChunk(payload, shape(ref), header.codec, header.dtype,
                               out);
      }));
  // Before a kernel reads it: its values, or its quantization's scales.
  return refuseNonFinite(ref, payloadNonFinite(out, shape(ref), codec, dtype));
}

StatusOr<std::vector<StoredExtent>>
ChunkStore::stored(const int32_t *tokens, int64_t count, Form form) {
  std::vector<StoredExtent> extents;
  std::vector<ChunkRef> objects = refs(tokens, count, form, CodecSpec());
  if (objects.empty())
    return extents;
  // The encodings the first object is stored in; when a listing finds none
  // and the first object's node does not answer (a cluster's master gone),
  // the next object's.
  std::vector<CodecSpec> codecs;
  for (const ChunkRef &ref : objects) {
    KVC_ASSIGN_OR_RETURN(found, encodings(ref));
    codecs = std::move(found);
    if (!codecs.empty())
      break;
    StatusOr<bool> answered = tier_->exists(ref.name());
    if (answered.isOk())
      break; // Not stored.
    if (answered.status().code() != StatusCode::Unavailable)
      return answered.status();
  }
  for (const CodecSpec &codec : codecs) {
    StoredExtent extent{0, codec};
    for (ChunkRef ref : objects) {
      ref.codec = codec;
      StatusOr<bool> exists = tier_->exists(ref.name());
      // An object whose node does not answer now is skipped: the extent
      // reaches past it to the objects found beyond, and a load that
      // cannot read it recomputes its chunk.
      if (!exists.isOk() && exists.status().code() == StatusCode::Unavailable)
        continue;
      KVC_RETURN_IF_ERROR(exists.status());
      if (!*exists) {
        extent.tokens = std::min(extent.tokens, ref.tokenBegin);
        break;
      }
      extent.tokens = std::max(extent.tokens, ref.tokenEnd);
    }
    extents.push_back(extent);
  }
  return extents;
}

Status ChunkStore::get(const ChunkRef &ref, float *out) {
  std::string bytes;
  KVC_RETURN_IF_ERROR(tier_->get(ref.name(), bytes));
  return decode(ref, bytes, out);
}

} // namespace kvc
