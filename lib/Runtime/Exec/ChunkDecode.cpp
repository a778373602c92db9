//===- ChunkDecode.cpp - Decoding a fetched chunk on the host -------------===//
//
// The host's steps between a chunk's fetch and its upload or its rows in a
// host cache: decompressing and dequantizing into staging or straight into
// the cache's rows, checking what was read in place, removing an object a
// check found damaged, and converting elements to the cache's type.
//
//===----------------------------------------------------------------------===//

#include "ChunkSteps.h"

#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Base/HostWorkers.h"

#include <algorithm>
#include <cstring>

namespace kvc::exec_detail {

namespace {

/// Decodes `ref`'s stored `bytes` into `out` as elements of `dtype`.
Status decodeAs(const ChunkStore &store, const ChunkRef &ref,
                std::string_view bytes, DType dtype, uint16_t *out) {
  if (dtype == DType::BF16)
    return store.decode(ref, bytes, out);
  const int64_t n = store.shape(ref).numel();
  std::vector<float> values(n);
  KVC_RETURN_IF_ERROR(store.decode(ref, bytes, values.data()));
  if (dtype == DType::F32)
    std::memcpy(out, values.data(), size_t(n) * sizeof(float));
  else
    for (int64_t i = 0; i < n; ++i)
      out[i] = floatToF16(values[i]);
  return Status::ok();
}

/// The chunk's objects by layer when they tile its box as one payload: each
/// holds exactly its tokens, and together exactly its layers, so that their
/// payloads back to back are the chunk's (ChunkCodec.h lays a chunk out
/// matrix by matrix, layer-major). Else why not.
std::string payloadOrder(const ChunkValue &value,
                         std::vector<std::size_t> &order) {
  order.resize(value.objectCount);
  for (std::size_t o = 0; o < order.size(); ++o)
    order[o] = o;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return value.objects[a].first.layerBegin <
           value.objects[b].first.layerBegin;
  });
  int64_t layer = value.layers.begin;
  for (std::size_t o : order) {
    const ChunkRef &ref = value.objects[o].first;
    if (ref.tokenBegin != value.tokens.begin ||
        ref.tokenEnd != value.tokens.end)
      return "the stored objects' tokens do not match the chunk's (its "
             "chunks are off the store's grid)";
    if (ref.layerBegin != layer)
      break;
    layer = ref.layerEnd;
  }
  if (layer != value.layers.end)
    return "the stored objects' layer groups straddle the chunk's layers";
  return "";
}

/// InternalError unless `bytes`, what the chunk holds for its kernel, are
/// the payload the kernel reads.
Status holdsPayload(const ChunkValue &value, int64_t bytes) {
  if (bytes == value.kernel->payloadBytes)
    return Status::ok();
  return internalError("restore: kernel \"" + value.kernel->name + "\" reads " +
                       std::to_string(value.kernel->payloadBytes) +
                       " payload bytes; the chunk's objects hold " +
                       std::to_string(bytes));
}

} // namespace

Status ChunkSteps::decode(ChunkValue &value) {
  if (value.intoCache)
    return checkInCache(value);
  if (value.kernel && value.readInPlace) {
    // A raw chunk read in place is its kernel's payload already: checked
    // where it landed, nothing copied (an object read whole is decoded to
    // its place, or found damaged).
    KVC_RETURN_IF_ERROR(decodeElements(value));
    KVC_RETURN_IF_ERROR(
        holdsPayload(value, int64_t(value.data.size() * sizeof(uint16_t))));
    value.payload = true;
    return Status::ok();
  }
  if (value.kernel) {
    std::vector<std::size_t> order;
    std::string why = payloadOrder(value, order);
    if (why.empty())
      return decodePayload(value, order);
    kernelNotLaunched(value.kernel->name + ": " + why);
  }
  std::vector<const ChunkRef *> refs;
  for (std::size_t o = 0; o < value.objectCount; ++o)
    refs.push_back(&value.objects[o].first);
  if (writesCacheRows(value) && tiles(value, refs))
    return decodeIntoCache(value);
  return decodeElements(value);
}

namespace {

/// What a decode of `ref` wrote into `traffic`: a copy of a raw payload in
/// the chunk's own type, or values it decoded.
void countDecode(HostTraffic &traffic, const ChunkStore &store,
                 const ChunkRef &ref, DType dtype, int64_t bytes) {
  (ref.codec.isRaw() && store.model().dtype == dtype ? traffic.copied
                                                     : traffic.decoded) +=
      bytes;
}

} // namespace

Status ChunkSteps::decodeIntoCache(ChunkValue &value) {
  ChunkStore &store = *stores_.at(value.tier);
  std::vector<Status> decoded(value.objectCount, Status::ok());
  hostWorkers().forEach(value.objectCount, [&](std::size_t o) {
    const auto &[ref, bytes] = value.objects[o];
    StatusOr<std::vector<ByteSpan>> spans = cacheRows(ref);
    if (!spans) {
      decoded[o] = spans.status();
      return;
    }
    // Row r of matrix m at rows[m * tokens + r], as the decoder writes.
    const std::size_t rowBytes = std::size_t(cache_.kvDim()) * sizeof(uint16_t);
    std::vector<uint16_t *> rows;
    for (const ByteSpan &span : *spans)
      for (std::size_t at = 0; at < span.size; at += rowBytes)
        rows.push_back(reinterpret_cast<uint16_t *>(span.data + at));
    decoded[o] = store.decode(ref, bytes, rows);
  });
  HostTraffic traffic;
  for (std::size_t o = 0; o < value.objectCount; ++o) {
    const ChunkRef &ref = value.objects[o].first;
    KVC_RETURN_IF_ERROR(noteDamage(value, ref, decoded[o]));
    countDecode(traffic, store, ref, DType::BF16,
                store.shape(ref).numel() * int64_t(sizeof(uint16_t)));
  }
  value.encoded = false;
  value.intoCache = true;
  value.inCache = true;
  traffic.delivered = cacheBytes(value.box());
  account(value, traffic);
  return Status::ok();
}

Status ChunkSteps::checkInCache(ChunkValue &value) {
  // Each object that landed was checked as it was read (fetchIntoCache).
  ChunkStore &store = *stores_.at(value.tier);
  for (std::size_t o = 0; o < value.objectCount; ++o) {
    const auto &[ref, bytes] = value.objects[o];
    if (value.landed[o])
      continue;
    // Read whole: its size is no raw object's, which decode says.
    std::vector<uint16_t> scratch(std::size_t(store.shape(ref).numel()));
    KVC_RETURN_IF_ERROR(
        noteDamage(value, ref, store.decode(ref, bytes, scratch.data())));
    return noteDamage(value, ref,
                      chunkError(ChunkFault::Corrupt,
                                 ref.name() + ": not the size of its chunk"));
  }
  value.encoded = false;
  value.inCache = true;
  HostTraffic traffic;
  traffic.delivered = cacheBytes(value.box());
  account(value, traffic);
  return Status::ok();
}

Status ChunkSteps::noteDamage(ChunkValue &value, const ChunkRef &ref,
                              Status status) {
  const ChunkFault fault = chunkFault(status);
  if (fault == ChunkFault::Corrupt || fault == ChunkFault::Truncated)
    value.damaged.push_back(ref);
  return status;
}

std::string ChunkSteps::removeDamaged(ChunkValue &value) {
  if (value.damaged.empty())
    return "";
  Tier &tier = stores_.at(value.tier)->tier();
  std::string failed;
  for (const ChunkRef &ref : value.damaged)
    if (Status removed = tier.remove(ref.name()); !removed.isOk())
      failed = removed.toString();
  value.damaged.clear();
  return failed.empty() ? " (removed from the store, for a save to write "
                          "again)"
                        : " (not removed from the store: " + failed + ")";
}

Status ChunkSteps::decodePayload(ChunkValue &value,
                                 const std::vector<std::size_t> &order) {
  ChunkStore &store = *stores_.at(value.tier);
  std::string inner;
  size_t bytes = 0;
  value.data.clear();
  value.data.reserve(size_t(value.kernel->payloadBytes + 1) / 2);
  HostTraffic traffic;
  for (std::size_t o : order) {
    auto &[ref, stored] = value.objects[o];
    KVC_RETURN_IF_ERROR(
        noteDamage(value, ref, store.payload(ref, stored, inner)));
    // Out of the object (its lossless stage undone, or copied), then here.
    (ref.codec.lossless == CodecSpec::Lossless::None ? traffic.copied
                                                     : traffic.decoded) +=
        int64_t(inner.size());
    traffic.copied += int64_t(inner.size());
    value.data.resizeForOverwrite((bytes + inner.size() + 1) / 2);
    value.data[value.data.size() - 1] = 0; // An odd byte's pad.
    std::memcpy(reinterpret_cast<char *>(value.data.data()) + bytes,
                inner.data(), inner.size());
    bytes += inner.size();
  }
  KVC_RETURN_IF_ERROR(holdsPayload(value, int64_t(bytes)));
  value.encoded = false;
  value.payload = true;
  account(value, traffic);
  return Status::ok();
}

Status ChunkSteps::decodeElements(ChunkValue &value) {
  ChunkStore &store = *stores_.at(value.tier);
  const int64_t w = width(value.form);
  const int64_t mats = value.form == Form::KV ? 2 : 1;
  const int64_t tokens = value.tokens.size();
  const DType dtype = dtypeOf(value.form);
  const int64_t words = wordsPer(dtype);
  auto inPlace = [&](const ChunkRef &ref) {
    return ref.tokenBegin == value.tokens.begin &&
           ref.tokenEnd - ref.tokenBegin == tokens &&
           ref.layerBegin >= value.layers.begin &&
           ref.layerEnd <= value.layers.end;
  };
  // Objects that tile the box layer by layer write every word; else the
  // words between them start as zero, as ever.
  std::vector<int> layerObjects(value.layers.size());
  for (std::size_t o = 0; o < value.objectCount; ++o) {
    const ChunkRef &ref = value.objects[o].first;
    for (int64_t l = std::max(ref.layerBegin, value.layers.begin);
         l < std::min(ref.layerEnd, value.layers.end); ++l)
      layerObjects[l - value.layers.begin] += inPlace(ref) ? 1 : 2;
  }
  const size_t size = value.layers.size() * mats * tokens * w * words;
  if (std::all_of(layerObjects.begin(), layerObjects.end(),
                  [](int n) { return n == 1; }))
    value.data.resizeForOverwrite(size);
  else
    value.data.resize(size);
  // Objects that hold whole layers of the chunk, laid out as the chunk lays
  // them out, decode in place, at once: each checks its checksum, copies
  // its payload and looks for non-finite values (a raw chunk's whole decode,
  // on the upload lane when the plan has no decode step for it).
  // Objects read in place (fetchInPlace) are only checked, where they are.
  std::vector<Status> decoded(value.objectCount, Status::ok());
  hostWorkers().forEach(value.objectCount, [&](std::size_t o) {
    const auto &[ref, bytes] = value.objects[o];
    uint16_t *at = value.data.data() + (ref.layerBegin - value.layers.begin) *
                                           mats * tokens * w * words;
    if (value.landed[o])
      decoded[o] = store.checkInPlace(
          ref, bytes,
          {std::string_view(reinterpret_cast<const char *>(at),
                            std::size_t(ref.layerEnd - ref.layerBegin) * mats *
                                tokens * w * words * sizeof(uint16_t))});
    else if (inPlace(ref))
      decoded[o] = decodeAs(store, ref, bytes, dtype, at);
  });
  // What the decode wrote: copies of raw payloads in the chunk's own type,
  // values of every other encoding.
  HostTraffic traffic;
  auto wrote = [&](const ChunkRef &ref, int64_t bytes) {
    countDecode(traffic, store, ref, dtype, bytes);
  };
  std::vector<uint16_t> object;
  for (std::size_t o = 0; o < value.objectCount; ++o) {
    auto &[ref, bytes] = value.objects[o];
    const int64_t refTokens = ref.tokenEnd - ref.tokenBegin;
    if (inPlace(ref)) {
      KVC_RETURN_IF_ERROR(noteDamage(value, ref, decoded[o]));
      if (!value.landed[o])
        wrote(ref, store.shape(ref).numel() * words * 2);
    } else {
      object.resize(store.shape(ref).numel() * words);
      KVC_RETURN_IF_ERROR(noteDamage(
          value, ref, decodeAs(store, ref, bytes, dtype, object.data())));
      wrote(ref, int64_t(object.size()) * 2);
      // Copy the rows of the object inside the value's box.
      const int64_t t0 = std::max(ref.tokenBegin, value.tokens.begin);
      const int64_t t1 = std::min(ref.tokenEnd, value.tokens.end);
      const int64_t l0 = std::max(ref.layerBegin, value.layers.begin);
      const int64_t l1 = std::min(ref.layerEnd, value.layers.end);
      for (int64_t l = l0; l < l1; ++l)
        for (int64_t m = 0; m < mats; ++m)
          std::memcpy(value.data.data() +
                          (((l - value.layers.begin) * mats + m) * tokens +
                           (t0 - value.tokens.begin)) *
                              w * words,
                      object.data() +
                          (((l - ref.layerBegin) * mats + m) * refTokens +
                           (t0 - ref.tokenBegin)) *
                              w * words,
                      size_t((t1 - t0) * w * words) * sizeof(uint16_t));
      traffic.copied += (l1 - l0) * mats * (t1 - t0) * w * words * 2;
    }
  }
  value.encoded = false;
  account(value, traffic);
  return Status::ok();
}

} // namespace kvc::exec_detail
