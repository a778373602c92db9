//===- ChunkStore.h - Encoded, checked chunks on a tier ---------*- C++ -*-===//
//
// The store of one model for one tenant: chunk keys from the token prefix
// and the layout (tokens per chunk, layers per object), over any tier. A
// chunk may be stored in several encodings side by side, each its own
// object; a planner is offered each, and a restore reads the one its plan
// chose. Writing is idempotent (an encoding already stored is not written
// again); reading checks every header against what was asked for and
// decodes.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_STORE_CHUNKSTORE_H
#define KVC_RUNTIME_STORE_CHUNKSTORE_H

#include "kvc/Runtime/Store/ChunkFormat.h"
#include "kvc/Runtime/Store/Tier.h"

#include <atomic>
#include <memory>
#include <optional>

namespace kvc {

struct StoreLayout {
  int64_t chunkTokens = 256; ///< Tokens per prefix chunk.
  int64_t layerGroup = 4;    ///< Layers per stored object (layer-major).
  /// The objects of one token chunk of a model of `layers` layers.
  int64_t layerGroups(int64_t layers) const {
    return (layers + layerGroup - 1) / layerGroup;
  }
};

/// One stored object: a form over a token chunk and a layer group, in one
/// encoding.
struct ChunkRef {
  Digest key{};
  Form form = Form::KV;
  int64_t tokenBegin = 0, tokenEnd = 0;
  int64_t layerBegin = 0, layerEnd = 0;
  CodecSpec codec;
  std::string name() const {
    return chunkObjectName(key, form, layerBegin, layerEnd, codec);
  }
};

/// How much of a request a store holds in one form and encoding: every
/// object of the chunks of tokens [0, tokens) exists, encoded with `codec`.
struct StoredExtent {
  int64_t tokens = 0;
  CodecSpec codec;
};

/// The objects of one model for one tenant under a layout, wherever they
/// go: their names, shapes and checked encoding. A store keeps them on a
/// tier; a transfer (Transfer.h) sends them as its messages.
class ChunkObjects {
public:
  ChunkObjects(ModelConfig model, std::string fingerprint, std::string salt,
               StoreLayout layout);

  const StoreLayout &layout() const { return layout_; }
  const ModelConfig &model() const { return model_; }
  const PrefixKeys &keys() const { return keys_; }
  /// The model's fingerprint (hex).
  const std::string &fingerprint() const { return fingerprintHex_; }
  /// The tenant's salt.
  const std::string &salt() const { return salt_; }

  /// Every object of `form` for `tokens` encoded with `codec`, in token then
  /// layer order.
  std::vector<ChunkRef> refs(const int32_t *tokens, int64_t count, Form form,
                             const CodecSpec &codec) const;
  /// The index in refs() of the object whose tokens start at `tokenBegin`
  /// and layers at `layerBegin` (a chunk's and a group's first).
  int64_t position(int64_t tokenBegin, int64_t layerBegin) const {
    return tokenBegin / layout_.chunkTokens *
               layout_.layerGroups(model_.numLayers) +
           layerBegin / layout_.layerGroup;
  }

  ChunkShape shape(const ChunkRef &ref) const;

  /// The object holding `values` (the ref's shape) encoded with the ref's
  /// codec: header and payload, as a tier stores it.
  StatusOr<std::string> encode(const ChunkRef &ref, const float *values) const;
  /// The same from the ref's payload before its lossless stage (what a
  /// generated save kernel writes); DataLoss unless it is exactly as long
  /// as the shape and codec make it.
  StatusOr<std::string> encodePayload(const ChunkRef &ref,
                                      std::string_view payload) const;

  /// Checks an object's bytes against `ref`, its encoding included (bytes
  /// of another encoding are a WrongRange fault: a plan that priced and
  /// bounded raw KV must never restore int2), and decodes them.
  Status decode(const ChunkRef &ref, std::string_view bytes, float *out) const;
  /// The same into bf16 values (decodeChunkToBf16).
  Status decode(const ChunkRef &ref, std::string_view bytes,
                uint16_t *out) const;
  /// The same into rows wherever they are (decodeChunkToBf16Rows): a paged
  /// cache's, row r of matrix m at rows[m * tokens + r].
  Status decode(const ChunkRef &ref, std::string_view bytes,
                const std::vector<uint16_t *> &rows) const;

  /// Checks a raw object read in place (Tier::getInto): `header` its
  /// header's bytes, `payload` its payload where it landed, in parts (a
  /// staging buffer's one, or a paged cache's rows). The checks of decode()
  /// (header, range, model and dtype, length, checksum, values NaN or
  /// infinite), the checksum and the values in one pass over the payload,
  /// a cache-sized block at a time, which is never copied. Internal for an
  /// object that is not raw.
  Status checkInPlace(const ChunkRef &ref, std::string_view header,
                      const std::vector<std::string_view> &payload) const;

  /// Checks them the same way and undoes only the lossless stage
  /// (decompressChunk): the payload a generated restore kernel reads.
  Status payload(const ChunkRef &ref, std::string_view bytes,
                 std::string &out) const;

  /// Whether `bytes` are a readable object that `ref` names.
  bool holds(const ChunkRef &ref, std::string_view bytes) const;

private:
  ChunkHeader expected(const ChunkRef &ref) const;

  ModelConfig model_;
  std::string fingerprintHex_, salt_;
  Digest fingerprint_;
  PrefixKeys keys_;
  StoreLayout layout_;
};

/// ChunkObjects on a tier.
class ChunkStore : public ChunkObjects {
public:
  ChunkStore(std::shared_ptr<Tier> tier, ModelConfig model,
             std::string fingerprint, std::string salt, StoreLayout layout);

  Tier &tier() { return *tier_; }
  /// The tier, for another store over it (another layout).
  const std::shared_ptr<Tier> &sharedTier() const { return tier_; }

  /// The encodings `ref`'s chunk is stored in, whatever `ref.codec` is.
  StatusOr<std::vector<CodecSpec>> encodings(const ChunkRef &ref);

  /// Per encoding of the first object of `form` for `tokens`, the longest
  /// prefix of `tokens` whose every object of `form` exists in it: what a
  /// planner may load (a chunk that turns out corrupt is still caught when
  /// read). Empty when the first object is not stored at all. An object
  /// whose node does not answer (Unavailable: a cluster's master gone) is
  /// passed over, found neither stored nor missing: the prefix reaches the
  /// objects found beyond it, and a load that cannot read it recomputes its
  /// chunk; when the first does not answer, the encodings are the next's.
  StatusOr<std::vector<StoredExtent>> stored(const int32_t *tokens,
                                             int64_t count, Form form);

  /// Common layouts other than this store's (chunks of 64 to 2048 tokens,
  /// groups of 1 to 8 layers) under which the first object of `form` for
  /// `tokens` exists: what a save with another --chunk-tokens or
  /// --layer-group left, which this store's keys cannot find.
  StatusOr<std::vector<StoreLayout>> otherLayouts(const int32_t *tokens,
                                                  int64_t count, Form form);

  /// Encodes `values` (the ref's chunkShape) with the ref's codec and
  /// writes them, unless a readable object of that encoding is stored
  /// already; `written` tells which. The chunk's other encodings stay.
  Status put(const ChunkRef &ref, const float *values, bool *written = nullptr);
  /// The same for an object encode() made.
  Status putEncoded(const ChunkRef &ref, std::string_view object,
                    bool *written = nullptr);
  /// Whether a readable object `ref` names is stored (a corrupt one is not).
  StatusOr<bool> has(const ChunkRef &ref);
  /// Records this store's layout for its model and tenant in the tier,
  /// unless recorded (put and putEncoded do before their first object).
  Status recordLayout();
  /// Removes the object `ref` names, if stored.
  Status remove(const ChunkRef &ref) { return tier_->remove(ref.name()); }

  /// Reads, checks and decodes `ref` into `out`. Errors carry a ChunkFault.
  Status get(const ChunkRef &ref, float *out);

private:
  std::shared_ptr<Tier> tier_;
  /// Whether recordLayout found or wrote the record (held apart so that a
  /// store stays movable).
  std::unique_ptr<std::atomic<bool>> recorded_ =
      std::make_unique<std::atomic<bool>>(false);
};

/// The layouts `tier` records objects of the model with `fingerprint` (hex)
/// under for tenant `salt`, ordered by chunk tokens, then layer group: one
/// small object per layout, "layouts/<digest>/<tokens>x<group>", which a
/// store adds before the first object it writes (ChunkStore::recordLayout),
/// so that a reader need not be told how a writer chose. Not objects of any
/// save: a failed save leaves its record.
StatusOr<std::vector<StoreLayout>> recordedLayouts(Tier &tier,
                                                   const std::string &fingerprint,
                                                   const std::string &salt);

} // namespace kvc

#endif // KVC_RUNTIME_STORE_CHUNKSTORE_H
