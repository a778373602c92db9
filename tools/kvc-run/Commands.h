//===- Commands.h - kvc-run's commands and what they share ------*- C++ -*-===//

#ifndef KVC_TOOLS_KVC_RUN_COMMANDS_H
#define KVC_TOOLS_KVC_RUN_COMMANDS_H

#include "Args.h"

#include "kvc/Host/Connector.h"
#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Measure.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/ModelRunner.h"
#include "kvc/Runtime/Save/SavePlan.h"
#include "kvc/Runtime/Store/ChunkStore.h"

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <optional>

namespace kvc::run {

StatusOr<DType> parseDType(const std::string &name);

/// The backend restores run on (--backend: cpu, or cuda where kvc-run was
/// built with CUDA and a GPU is present).
Device &backend();
/// Selects it by name; Unavailable for cuda without a GPU.
/// `gemm` ("", f32 or bf16) forces the cuda backend's GEMM input precision.
Status selectBackend(const std::string &name, const std::string &gemm = "");

/// The model in `dir`, read once a process: a command that runs others (the
/// grid) reads a checkpoint once, whatever its steps ask for.
StatusOr<std::shared_ptr<LlamaModel>> loadModel(const std::string &dir);

/// --chunk-tokens and --layer-group: how a request's KV is cut into objects
/// (default 256 x 4), both positive.
StatusOr<StoreLayout> storeLayout(Args &args);

/// The --store of a request, laid out by --chunk-tokens and --layer-group
/// and salted by --tenant (save and restore must agree); `access` says
/// whether a file:// store may be created (a save) or must exist.
StatusOr<std::unique_ptr<ChunkStore>>
openStore(Args &args, const LlamaModel &model, TierAccess access);

/// Refuses --chunk-tokens and --layer-group in a command whose store the
/// Connector opens: it reads the layout the store records.
Status refuseLayoutOptions(Args &args);

/// Tokens from --tokens FILE (whitespace-separated ids below the model's
/// vocabulary), --random-tokens or --prompt (encoded by the tokenizer.bin of
/// --model), at most the model's positions and what fits in memory.
StatusOr<std::vector<int32_t>> requestTokens(Args &args,
                                             const ModelConfig &model);

/// The bundle at `path`, refused when compiled for another model.
StatusOr<PlanBundle> readBundleFor(const std::string &path,
                                   const LlamaModel &model);
/// The plan `name` of `bundle` (read from `source`, for messages), or its
/// only plan when `name` is empty.
StatusOr<const BundlePlan *> selectPlan(const PlanBundle &bundle,
                                        const std::string &source,
                                        const std::string &name);

/// Prints what `plan` loads, stores, sends and receives, one line per form,
/// encoding and tier or peer: "  loads    kv as int4/g32 from disk: tokens
/// 0 to 1024, layers 0 to 4", "  stores   hidden as raw to ssd: ...",
/// "  sends    kv as int8/g128 to decode: ...".
void printLoads(const BundlePlan &plan);

/// --max-error: a bound on the largest error relative to a full prefill's
/// largest |K| or |V|, when given.
StatusOr<std::optional<double>> maxErrorOption(Args &args);

/// --max-kl: the quality budget in next-token KL divergence (nats), judged
/// by --codec-profile's measures (required with it); infinite when not
/// given.
StatusOr<double> maxKlOption(Args &args);

/// Prints when layer 0 and the last layer to complete held every token
/// (`ready`, seconds per layer), beside the plan's predictions where it has
/// them: "  layer 0 ready after 90.6 ms (predicted 84.7 ms); every layer
/// after ...".
void printLayerReadiness(const std::vector<double> &ready,
                         const std::vector<double> &predicted = {});

/// Prints the restore's host traffic (HostTraffic) per byte it loaded into
/// the cache; nothing when it loaded none.
void printHostTraffic(const RestoreMetrics &metrics);

/// Prints the chunks generated kernels wrote on the device, and why any
/// whose task names one were decoded on the host.
void printKernels(const RestoreMetrics &metrics);
/// printKernels, then the chunks recomputed instead of loaded.
void printFallbacks(const RestoreMetrics &metrics);
/// The planning hook kvc-run binds: the compiler in-process (none in a
/// build without it).
host::PlanHook compilerHook();
/// The same for a save or send plan's objects, which they encode.
void printKernels(const SaveMetrics &metrics);

/// --trace of a command that traces a compiled plan: its path ("" when not
/// given); refused without --bundle.
StatusOr<std::string> planTracePath(Args &args);

/// Prints a verification and fails above the bound.
Status reportVerification(const RestoreError &error,
                          const host::VerifyBound &bound);

/// A server's request through host::Connector (ServeCommand.cpp): the
/// connector configured from the command's options, the request's prefix
/// looked up, the decision, the load into a paged cache of the backend's
/// (room for `room` tokens more), and the server's prefill of the rest,
/// each printed as it goes. The server holds its first `onDevice` tokens
/// (prefilled before the request). Reads every option it takes; the
/// caller reads its own first.
struct ServedRequest {
  std::shared_ptr<LlamaModel> model;
  std::vector<int32_t> tokens;
  /// Owns the cache.
  std::unique_ptr<host::Connector> connector;
  PagedKVCache *cache = nullptr;
  BlockTable table;
  host::Lookup found;
  host::Decision decision;
};
StatusOr<ServedRequest> serveRequest(Args &args, int64_t onDevice,
                                     int64_t room);

/// restore, generate, compare and cake (RestoreCommands.cpp).
Status restoreCommand(Args &args);
Status generateCommand(Args &args);
Status compareCommand(Args &args);
Status cakeCommand(Args &args);
Status serveCommand(Args &args);

/// transfer-send and transfer-recv (TransferCommands.cpp).
Status gridCommand(Args &args);
Status transferSendCommand(Args &args);
Status transferRecvCommand(Args &args);

/// What restore and compare share: the model, the request, the Connector
/// over the store and plans for them (from a bundle, or compiled
/// in-process).
struct RestoreSetup {
  std::shared_ptr<LlamaModel> model;
  std::unique_ptr<host::Connector> connector;
  /// The request over them (its tokens, the reference prefill).
  host::MeasuredRequest request;
  std::string planSource; ///< The bundle's path, or "--strategy", for messages.
  std::shared_ptr<const PlanBundle> bundle;
  std::optional<double> maxError; ///< --max-error, when given.
  /// The connector's target, when --strategy planned for it (compare's
  /// machine check); null for a bundle.
  const TargetDesc *target = nullptr;
};

/// The model, the request and its plans from restore's and compare's
/// options; `defaultStrategy` is what --strategy means without a value.
StatusOr<RestoreSetup> loadRestoreSetup(Args &args,
                                        const std::string &defaultStrategy);

/// The restore's host traffic, and by step (compare --json).
nlohmann::json hostTrafficJson(const RestoreMetrics &metrics);

/// A command: what it does, its options and its implementation.
struct Command {
  const char *name, *summary;
  std::vector<Option> options;
  Status (*run)(Args &);
};

/// kvc-run's commands, as its usage lists them (kvc-run.cpp).
const std::vector<Command> &commands();

/// Runs command `name` with `words` as its options, its standard output
/// going to `outputPath` (none: this process's).
Status runStep(const std::string &name, const std::vector<std::string> &words,
               const std::string &outputPath);

} // namespace kvc::run

#endif // KVC_TOOLS_KVC_RUN_COMMANDS_H
