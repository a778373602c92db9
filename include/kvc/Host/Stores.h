//===- Stores.h - Stores a server opens and matches -------------*- C++ -*-===//
//
// What a server asks of its KV stores before it plans a restore: open one
// from a URL with the layout its saves used, and find how much of a
// request's prefix each store holds, per form (KV, hidden states) and
// encoding, as vLLM's connector asks get_num_new_matched_tokens. The matches
// become the planner's sources, each on the target machine's tier the store
// is.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_STORES_H
#define KVC_HOST_STORES_H

#include "kvc/Planning/Plan.h"
#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Runtime/Model/ModelCompute.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <memory>
#include <string>
#include <vector>

namespace kvc::host {

/// Where a store is and how its objects are laid out.
struct StoreOptions {
  /// mem://, file:///path, redis://host:port, with an optional ?gbps=N.
  std::string url;
  /// The layout; with chunkTokens 0, the one the store records for the
  /// model and tenant (recordedLayouts, ChunkStore.h: the first), else
  /// StoreLayout's default. A store records the layout of every object
  /// written into it.
  StoreLayout layout;
  /// Salts every key: tenants never share objects.
  std::string tenant;
  /// Whether a file:// store may be created (a save) or must exist.
  TierAccess access = TierAccess::Existing;
};

/// The store `options` names, for `model`'s objects.
StatusOr<std::unique_ptr<ChunkStore>> openStore(const StoreOptions &options,
                                                const ModelCompute &model);


/// How much of a request one store holds in one form and encoding.
struct PrefixMatch {
  Form form = Form::KV;
  /// The request's first `tokens` tokens have every object of `form`
  /// encoded with `codec`.
  int64_t tokens = 0;
  CodecSpec codec;
};

/// The prefix of `tokens` `store` holds, per form (KV, then hidden states)
/// and encoding (in name order); none for a form it holds nothing of.
/// FailedPrecondition when it holds nothing of the request under its layout
/// but holds it under another (a save with other chunk tokens or layer
/// group), naming that layout: a restore would otherwise miss every object.
StatusOr<std::vector<PrefixMatch>>
matchPrefix(ChunkStore &store, const std::vector<int32_t> &tokens);

/// The tier of `target` that `store` is: the one named `name`, else the
/// first of the URL's kind (mem:// DRAM, file:// disk, others remote). A
/// throttled store caps the tier's read bandwidth at its throttle.
StatusOr<TierDesc *> storeTier(TargetDesc &target, const Tier &store,
                               const std::string &name = "");

/// The matches that cover the whole request, as planner sources on `tier`.
std::vector<planning::Source> sourcesOf(const ChunkStore &store,
                                        const std::vector<PrefixMatch> &matches,
                                        int64_t tokens,
                                        const std::string &tier);

} // namespace kvc::host

#endif // KVC_HOST_STORES_H
