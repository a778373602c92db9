//===- Connector.h - The one object a server calls ---------------*- C++ -*-===//
//
// A server configures a Connector once (its model, its stores by URL, the
// target machine, the backend, where plans come from) and then, per
// request:
//
//   lookup      how much of the request's prefix the stores hold, per form
//               and encoding: a local index of what this process saved or
//               saw first, the stores where it knows less than the request
//   decide      how many prefix tokens to load, by which plan, and how many
//               to leave to the server's own prefill: the plan that makes
//               the server's first token earliest, the server's forward
//               pass over the rest running beside a layer-wise load, or
//               nothing when recomputing is as fast; and why
//   startLoad   the decided plan into the server's paged KV memory, in the
//               background; waitLayer(i) returns once layer i is written
//   saveLayer   a request's KV to the first store, layer by layer as the
//               server's forward pass writes it; waitSave
//   finished    the loads that ended and the saves whose blocks the server
//               may reuse, since the last call
//   cancel      stops a request's load and save and forgets it
//
// Decisions are priced with the planner (no compiler), and the plan each
// shape needs (loaded tokens, the server's tokens rounded up to a chunk,
// the stores' forms and encodings) is compiled once through the PlanHook
// and cached: on a warm cache neither decide nor startLoad compiles. The
// planner's pricing and the compile run outside the Connector's lock, so
// that one request's compile holds up no other's lookup or decision (two
// requests of a new shape may both compile it; the first plan is kept).
//
// A store describes itself: every layout it records for the model and
// tenant (recordedLayouts) is opened and looked up; saves go out in
// ConnectorOptions::saveLayout and record it.
//
// Instruments that measure one plan over a whole request rather than serve
// (kvc-run restore, compare and generate with a named plan, benchmarks) go
// through the same object: planRequest compiles a restore of every token,
// decide with a ChosenPlan runs the caller's plan (a bundle's, or one
// planRequest compiled) through the stores, pools and loads a server's
// requests use, and registerCaches may give each run a fresh cache.
//
// Threading: any thread may call; a request's calls are ordered by the
// caller. Nothing blocks except waitLayer and waitSave. Ownership: the
// Connector owns its stores, plans and pools; the server owns its caches
// (viewServerCaches) and the model, and keeps them alive as long as the
// Connector. Errors are values: an unknown request, bad block ids, caches
// of another shape or dtype are refused; a chunk that cannot be loaded
// intact is recomputed (or, without recomputeFailures, reported by
// failedBlocks for the server to recompute); a store that cannot be reached
// makes a lookup find nothing there.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_CONNECTOR_H
#define KVC_HOST_CONNECTOR_H

#include "kvc/Host/Session.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvc::host {

/// How a server lays out one layer's paged K and V (as vLLM allocates
/// them; block_size tokens of num_kv_heads x head_dim values a block).
enum class CacheLayout {
  /// Two tensors, K and V, each [num_blocks, block_size, heads, head_dim].
  Separate,
  /// One tensor [2, num_blocks, block_size, heads, head_dim]: K then V
  /// (vLLM's FlashAttention backend).
  KeysFirst,
  /// One tensor [num_blocks, 2, block_size, heads, head_dim]: each block's
  /// K then its V (FlashInfer's).
  BlocksFirst,
};

/// A server's KV memory: base pointers per layer and how it is laid out.
struct ServerCaches {
  CacheLayout layout = CacheLayout::Separate;
  /// The element type: bf16 or f16 (stored bf16 KV is rounded to f16 as it
  /// is written; a value beyond f16's range is an error, not an infinity).
  DType dtype = DType::BF16;
  CacheMemory memory = CacheMemory::Host;
  int64_t numBlocks = 0;
  int64_t blockSize = 16;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  /// Per layer: the K tensor (Separate) or the layer's one tensor.
  std::vector<void *> keys;
  /// Per layer: the V tensor (Separate only).
  std::vector<void *> values;
};

/// `caches` as a paged cache of `model`'s layers: InvalidArgument for a
/// shape, layer count or missing pointer that does not fit the model,
/// Unimplemented for an element type other than bf16 and f16.
StatusOr<std::unique_ptr<PagedKVCache>>
viewServerCaches(const ServerCaches &caches, const ModelConfig &model);

/// A store the Connector reads (and the first, writes).
struct StoreSpec {
  /// mem://, file:///path, redis://host:port, with an optional ?gbps=N.
  std::string url;
  /// The target's tier it is; empty: the first of its URL's kind.
  std::string tier;
};

/// When decide loads.
enum class LoadPolicy {
  /// When the load's first token is predicted earlier than recomputing.
  Cheapest,
  /// Whenever the stores hold a whole chunk past the server's tokens (for
  /// comparisons and tests: it may be slower than recomputing).
  Always,
  /// Never: every request is recomputed by the server.
  Never,
};

struct ConnectorOptions {
  /// The model (required): its config, fingerprint, and the computation of
  /// the chunks a plan computes or recomputes.
  const ModelCompute *model = nullptr;
  std::vector<StoreSpec> stores;
  /// Whether the first store (the one saves write) may be created where it
  /// does not exist (a file:// directory); false: every store must exist,
  /// as a reader expects.
  bool createStores = true;
  std::string tenant;
  /// Saves' layout and encoding (recorded in the first store).
  StoreLayout saveLayout{256, 1};
  CodecSpec saveCodec;
  /// The machine plans are priced and compiled for. decide and
  /// planRequest need one with tiers; a Connector that only runs chosen
  /// plans compiled ahead may have none (each store is then the tier
  /// StoreSpec::tier names).
  TargetDesc target;
  /// Where caches live and work runs; the CPU backend when null.
  Device *device = nullptr;
  /// The runner of `model` on `device` that computes what a plan computes
  /// or recomputes: the server's own (a runner over the server's model, as
  /// the Python package's Connector.prefill_with makes), which must
  /// outlive the Connector; the device's runner of `model` when null.
  ModelRunner *runner = nullptr;
  /// Compiles a plan (compilerPlanHook, or bundleHook over bundles compiled
  /// ahead); required.
  PlanHook planner;
  /// Strategies to choose among ("joint" alone searches them all), the
  /// staging budget, a codec profile, a KL budget, generated kernels.
  /// Loads are always planned layer-wise, for the server's forward pass.
  PlanOptions plans;
  /// Chunks that cannot be loaded intact: recomputed by kvc with the model
  /// (true), or left to the server (failedBlocks).
  bool recomputeFailures = true;
  LoadPolicy policy = LoadPolicy::Cheapest;
  /// Compiled plans kept (least recently used go first).
  std::size_t planCacheEntries = 256;
};

/// What the stores hold of a request's prefix.
struct Lookup {
  /// Per store, layout, form and encoding held: the longest prefix whose
  /// every object exists.
  struct Held {
    int store = 0;
    StoreLayout layout;
    PrefixMatch match;
    /// Of match.tokens, those before the first chunk with an object on a
    /// part of its store known not to answer now (Tier::answers: a
    /// cluster's master that failed its last command), and the end of the
    /// last such chunk: a load past `answering` recomputes the chunks up to
    /// `unreachableEnd`, which decide prices. match.tokens and 0 when every
    /// part answers.
    int64_t answering = 0;
    int64_t unreachableEnd = 0;
  };
  std::vector<Held> held;
  /// The longest of them.
  int64_t tokens = 0;
  /// Whether the local index answered (no store was asked).
  bool fromIndex = false;
};

/// What decide chose for a request.
struct Decision {
  /// Tokens [0, loadTokens) are resident after the load (those below the
  /// request's tokens on the device were already); the server prefills
  /// [loadTokens, n). Equal to the tokens on the device when nothing loads.
  int64_t loadTokens = 0;
  /// The strategy of the plan that loads them; empty when nothing loads.
  std::string strategy;
  /// The first token's predicted seconds with that choice, and when the
  /// server recomputes everything past its own tokens instead.
  double predictedSeconds = 0;
  double recomputeSeconds = 0;
  /// Why, in a sentence.
  std::string why;
  /// The holding the load reads: the store (an index into
  /// ConnectorOptions::stores) and its layout; -1 when nothing loads.
  int store = -1;
  StoreLayout layout;
  bool loads() const { return !strategy.empty(); }
};

/// A decision made elsewhere (a server's scheduler, by decide) for another
/// Connector over the same stores (its worker's) to run as it stands:
/// nothing is priced or chosen again.
struct Decided {
  /// Tokens [0, loadTokens) resident once the load ends.
  int64_t loadTokens = 0;
  /// The plan's strategy (planning::strategyName).
  std::string strategy;
  /// The holding it reads, as Decision::store and Decision::layout.
  int store = 0;
  StoreLayout layout;
};

/// A plan chosen by the caller rather than priced by decide.
struct ChosenPlan {
  /// The bundle holding it (and the kernels it names); the load keeps it.
  std::shared_ptr<const PlanBundle> bundle;
  /// Its name in the bundle; empty: the bundle's only plan.
  std::string name;
};

/// How startLoad runs a load.
struct LoadOptions {
  /// Writes a Chrome trace of the load here when not empty.
  std::string tracePath;
  /// Runs a Cake-shaped plan as Cake's two-sided walk (DynamicCake.h):
  /// compute from the front, load from the back, meeting where this run's
  /// rates put them; RestoreMetrics::walk says where.
  bool dynamic = false;
};

/// The loads and saves that ended since the last call.
struct Finished {
  /// Loads whose restore ended (ok or not: failedBlocks says what to
  /// recompute); their blocks are the server's again.
  std::vector<std::string> loads;
  /// Saves that no longer read the server's blocks (they may be reused;
  /// the writes may still go on: waitSave waits for them).
  std::vector<std::string> saves;
};

class Connector {
public:
  /// Opens the stores and checks the options.
  static StatusOr<std::unique_ptr<Connector>> create(ConnectorOptions options);
  ~Connector();

  /// The server's KV memory, which every load writes and every save reads,
  /// before the first startLoad or saveLayer; again, replacing it (a
  /// server that reallocates its memory, an instrument's fresh cache per
  /// run), only while no load or save runs.
  Status registerCaches(std::unique_ptr<PagedKVCache> caches);

  /// What the stores hold of `tokens`. Reads no object's payload.
  StatusOr<Lookup> lookup(const std::vector<int32_t> &tokens);

  /// Decides request `id`'s load: `tokens` is its prompt and
  /// `tokensOnDevice` how many of them the server's own cache holds.
  /// `recomputeSeconds`, when the server measures it, is what recomputing
  /// the tokens past its own takes it (LoadPolicy::Cheapest loads only
  /// what is predicted faster); else the planner prices it on the target.
  /// Remembers the request (and replaces an undecided or finished one).
  StatusOr<Decision>
  decide(const std::string &id, const std::vector<int32_t> &tokens,
         int64_t tokensOnDevice,
         std::optional<double> recomputeSeconds = std::nullopt);

  /// Decides request `id`'s load as `decided` (another Connector's
  /// decision): the plan of that strategy over that holding, compiled once
  /// per shape, and no price. NotFound where the holding no longer covers
  /// the tokens; InvalidArgument for a store, layout or strategy this
  /// Connector does not have.
  StatusOr<Decision> decide(const std::string &id,
                            const std::vector<int32_t> &tokens,
                            int64_t tokensOnDevice, const Decided &decided);

  /// Decides request `id`'s load as `plan` instead of pricing one: it
  /// loads tokens [tokensOnDevice, end of the plan's tokens), reading each
  /// tier the plan fetches from the store on that tier (the only store,
  /// when the Connector has one), under the layout that holds the most of
  /// `tokens`. For instruments: the plan may be slower than recomputing,
  /// and may leave the server no token. A bundle compiled for another
  /// model's weights is refused (checkCompiledFor).
  StatusOr<Decision> decide(const std::string &id,
                            const std::vector<int32_t> &tokens,
                            int64_t tokensOnDevice, ChosenPlan plan);

  /// Plans the restore of every token of `tokens` through the planner, from
  /// what the store and layout holding most of them hold of them whole: one
  /// plan per strategy of `options` (none: every strategy those holdings
  /// allow), in that layout's chunks. Compiles every call (no plan cache):
  /// for instruments that run a request's plans by name (decide with a
  /// ChosenPlan), where decide plans loads that leave the server its last
  /// token.
  StatusOr<PlanBundle> planRequest(const std::vector<int32_t> &tokens,
                                   PlanOptions options);

  /// Starts the decided load into the blocks `blockIds` (the request's
  /// table from token 0, covering at least its loaded tokens).
  Status startLoad(const std::string &id, const std::vector<int32_t> &blockIds,
                   const LoadOptions &options = {});
  /// Blocks until `layer` holds the loaded tokens (or the load failed, or
  /// `timeout` passed: Unavailable).
  Status waitLayer(const std::string &id, int64_t layer,
                   std::optional<std::chrono::milliseconds> timeout =
                       std::nullopt);
  /// Makes `stream` (the device's handle of the server's stream: a
  /// cudaStream_t on CUDA) wait until `layer` holds the loaded tokens or
  /// the load ends, without blocking the caller (Device::streamWait, raised
  /// when the layer completes): the server's forward pass queues its
  /// attention for the layer behind it. Where the device makes no stream
  /// wait (the CPU's, a GPU without memory waits), blocks as waitLayer
  /// does. A load that fails lets the stream go on too:
  /// what it could not write is failedBlocks' to say.
  Status waitLayerOn(const std::string &id, int64_t layer, void *stream);
  /// Blocks until the load ends; its metrics.
  StatusOr<RestoreMetrics> waitLoad(const std::string &id);
  /// The blocks of `id` the server must recompute: those a failed chunk
  /// left unwritten (without recomputeFailures), or every loaded block of
  /// a load that failed. Empty while the load runs.
  StatusOr<std::vector<int32_t>> failedBlocks(const std::string &id);

  /// Saves layer `layer` of request `id` (`tokens`, in `blockIds` from
  /// token 0) once the server's forward pass has written it; the whole
  /// chunks of the request are saved, objects already stored skipped.
  Status saveLayer(const std::string &id, const std::vector<int32_t> &tokens,
                   int64_t layer, const std::vector<int32_t> &blockIds);
  /// Blocks until `id`'s save ends (every layer must have been given);
  /// its metrics. The request's save is forgotten.
  StatusOr<SaveMetrics> waitSave(const std::string &id);

  /// Stops `id`'s load and save and forgets the request; returns at once.
  /// A server calls it for every request it is done with: until then the
  /// Connector keeps the request's decision, load and save.
  /// Its blocks are the server's again once finished() lists it (a chunk
  /// in flight may still be written until then); a save it stops leaves no
  /// object behind.
  Status cancel(const std::string &id);

  Finished finished();

  /// The target, each store's tier capped at its throttle.
  const TargetDesc &target() const;
  /// Store `store` (an index into ConnectorOptions::stores): the target's
  /// tier it is, and the storage behind it (its URL and throttle).
  const std::string &tierOf(int store) const;
  const Tier &storage(int store) const;

  /// Plans compiled so far, and decisions answered from the plan cache.
  int64_t plansCompiled() const;
  int64_t planCacheHits() const;

private:
  struct State;
  explicit Connector(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// A PlanHook over bundles compiled ahead: for each request, the first plan
/// of the strategy asked for whose tokens are the request's, in a bundle
/// compiled for the model's weights (one of another model's is never run:
/// FailedPrecondition when only such a bundle has the plan).
PlanHook bundleHook(std::vector<PlanBundle> bundles);

} // namespace kvc::host

#endif // KVC_HOST_CONNECTOR_H
