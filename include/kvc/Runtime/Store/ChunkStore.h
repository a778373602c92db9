//===- ChunkStore.h - Encoded, checked chunks on a tier ---------*- C++ -*-===//
//
// The store of one model for one tenant: chunk keys from the token prefix,
// the layout (tokens per chunk, layers per object), and the codec, over any
// tier. Writing is idempotent (a chunk already stored is not written again);
// reading checks every header against what was asked for and decodes.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_STORE_CHUNKSTORE_H
#define KVC_RUNTIME_STORE_CHUNKSTORE_H

#include "kvc/Runtime/Store/ChunkFormat.h"
#include "kvc/Runtime/Store/Tier.h"

#include <memory>
#include <optional>

namespace kvc {

struct StoreLayout {
  int64_t chunkTokens = 256; ///< Tokens per prefix chunk.
  int64_t layerGroup = 4;    ///< Layers per stored object (layer-major).
};

/// One stored object: a form over a token chunk and a layer group.
struct ChunkRef {
  Digest key{};
  Form form = Form::KV;
  int64_t tokenBegin = 0, tokenEnd = 0;
  int64_t layerBegin = 0, layerEnd = 0;
  std::string name() const {
    return chunkObjectName(key, form, layerBegin, layerEnd);
  }
};

/// How much of a request a store holds in one form: every object of the
/// chunks of tokens [0, tokens) exists, encoded with `codec`.
struct StoredExtent {
  int64_t tokens = 0;
  CodecSpec codec;
};

class ChunkStore {
public:
  ChunkStore(std::shared_ptr<Tier> tier, ModelConfig model,
             std::string fingerprint, std::string salt, StoreLayout layout);

  Tier &tier() { return *tier_; }
  const StoreLayout &layout() const { return layout_; }
  const ModelConfig &model() const { return model_; }
  const PrefixKeys &keys() const { return keys_; }

  /// Every object of `form` for `tokens`, in token then layer order.
  std::vector<ChunkRef> refs(const int32_t *tokens, int64_t count,
                             Form form) const;

  /// The longest prefix of `tokens` whose every object of `form` exists,
  /// and the codec its first object was stored with (what a planner may
  /// load; a chunk that turns out corrupt is still caught when read).
  StatusOr<StoredExtent> stored(const int32_t *tokens, int64_t count,
                                Form form);

  /// Common layouts other than this store's (chunks of 64 to 2048 tokens,
  /// groups of 1 to 8 layers) under which the first object of `form` for
  /// `tokens` exists: what a save with another --chunk-tokens or
  /// --layer-group left, which this store's keys cannot find.
  StatusOr<std::vector<StoreLayout>> otherLayouts(const int32_t *tokens,
                                                  int64_t count, Form form);

  /// The codec of the object `ref` names, if one is stored and readable
  /// (a corrupt one reads as none).
  StatusOr<std::optional<CodecSpec>> storedCodec(const ChunkRef &ref);

  /// Encodes `values` (the ref's chunkShape) with `codec` and writes them,
  /// unless the object is already stored with `codec`; `written` tells
  /// which. An object stored with another codec is a WrongRange fault (a
  /// key holds one encoding, and keeping the other would leave restores of
  /// `codec` to find it) unless `replace`, which rewrites it.
  Status put(const ChunkRef &ref, const float *values, const CodecSpec &codec,
             bool *written = nullptr, bool replace = false);

  /// Reads, checks and decodes `ref` into `out`; `codec` receives the codec
  /// it was stored with. Errors carry a ChunkFault.
  Status get(const ChunkRef &ref, float *out, CodecSpec *codec = nullptr);

  /// Checks and decodes bytes already read for `ref`. With `planned`, an
  /// object stored with another codec is a WrongRange fault before any
  /// decoding: a plan that priced and bounded raw KV must not restore int2
  /// objects saved under the same key.
  Status decode(const ChunkRef &ref, std::string_view bytes, float *out,
                CodecSpec *codec = nullptr,
                const CodecSpec *planned = nullptr) const;
  /// The same into bf16 values (decodeChunkToBf16).
  Status decode(const ChunkRef &ref, std::string_view bytes, uint16_t *out,
                CodecSpec *codec = nullptr,
                const CodecSpec *planned = nullptr) const;

  ChunkShape shape(const ChunkRef &ref) const;

private:
  ChunkHeader expected(const ChunkRef &ref) const;

  std::shared_ptr<Tier> tier_;
  ModelConfig model_;
  std::string fingerprintHex_, salt_;
  Digest fingerprint_;
  PrefixKeys keys_;
  StoreLayout layout_;
};

} // namespace kvc

#endif // KVC_RUNTIME_STORE_CHUNKSTORE_H
