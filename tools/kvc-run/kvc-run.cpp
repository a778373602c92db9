//===- kvc-run.cpp - The kvc runtime as a command -------------------------===//
//
// `kvc-run --help` lists the commands, `kvc-run COMMAND --help` a command's
// options with their defaults (commands() below is the one table of both):
// gen-model, save, profile-codecs, inspect-bundle, restore, compare (every
// plan, verified, in one table), cake (Cake's dynamic walk) and calibrate.
// The options save and restore must agree on (the request, --chunk-tokens,
// --layer-group, --tenant) are listed together in each.
//
// Every command takes --compute-threads N (default 1): the threads of the
// CPU backend's GEMMs (setComputeThreads: one core computes, the others
// serve the host-side workers).
//
// Plans come from a bundle compiled by kvc-opt, or with --strategy
// (compute|kv|hidden|cake|hcache|joint; compare takes a list, by default all
// the store allows) from the compiler in-process: the request and what the
// store holds for it become a kvc.restore planned for --target, whose tier
// for the store (--tier, else the first of the URL's kind) reads at the
// store's ?gbps= throttle when there is one. Without the compiler
// (KVC_BUILD_COMPILER=OFF) kvc-run links no LLVM or MLIR and --strategy is
// refused.
//
//===----------------------------------------------------------------------===//

#include "ProfileCodecs.h"

#include "kvc/Host/Calibrate.h"
#include "kvc/Host/Measure.h"
#include "kvc/Host/Memory.h"
#include "kvc/Host/Session.h"
#include "kvc/Host/Verify.h"
#include "kvc/Runtime/Base/Clock.h"

#include "kvc/Planning/CodecProfile.h"
#include "kvc/Planning/Plan.h"
#include "kvc/Runtime/Exec/DynamicCake.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Save/Saver.h"

#ifdef KVC_RUN_WITH_COMPILER
#include "kvc/Transforms/CompileRestore.h"
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

using namespace kvc;
using namespace kvc::host;

namespace {

/// One option of a command: its name, the placeholder of its value ("" for
/// a flag; in brackets when the value may be left out), and one line of
/// help with its default.
struct Option {
  const char *name, *value, *help;
  bool isFlag() const { return !*value; }
  bool valueOptional() const { return *value == '['; }
};

/// `--key value` and `--flag` options after the command, checked against
/// the command's options as they are parsed: an unknown option, one given
/// twice, or one that needs a value given without one is an error before
/// any work starts.
class Args {
public:
  static StatusOr<Args> parse(int argc, char **argv, int first,
                              const std::string &command,
                              const std::vector<Option> &options) {
    Args args;
    for (int i = first; i < argc; ++i) {
      std::string key = argv[i];
      if (key.rfind("--", 0) != 0)
        return invalidArgument("unexpected argument " + key);
      key = key.substr(2);
      auto option =
          std::find_if(options.begin(), options.end(),
                       [&](const Option &o) { return key == o.name; });
      if (option == options.end())
        return invalidArgument("unknown option --" + key + " (kvc-run " +
                               command + " --help lists them)");
      if (args.values_.count(key))
        return invalidArgument("--" + key + " given twice");
      const bool valueNext =
          i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
      if (option->isFlag() || (!valueNext && option->valueOptional()))
        args.values_[key] = "";
      else if (valueNext)
        args.values_[key] = argv[++i];
      else
        return invalidArgument("--" + key + " needs a value");
    }
    return args;
  }
  bool has(const std::string &key) {
    used_.push_back(key);
    return values_.count(key);
  }
  std::string get(const std::string &key, const std::string &fallback = "") {
    used_.push_back(key);
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  StatusOr<int64_t> integer(const std::string &key, int64_t fallback) {
    std::string text = get(key);
    if (text.empty())
      return fallback;
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (*end || errno == ERANGE)
      return invalidArgument("--" + key + " expects an integer, got " + text);
    return int64_t(v);
  }
  StatusOr<std::string> required(const std::string &key) {
    if (!has(key))
      return invalidArgument("missing --" + key);
    return get(key);
  }
  /// Fails on options this use of the command does not read (--plan
  /// without --bundle, say).
  Status checkUnused() const {
    for (const auto &[key, value] : values_)
      if (std::find(used_.begin(), used_.end(), key) == used_.end())
        return invalidArgument("--" + key + " does not apply here");
    return Status::ok();
  }

private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> used_;
};

/// One line of progress on a terminal's stderr, rewritten in place and
/// erased when done; nothing when stderr is not a terminal (a log, a pipe).
class Progress {
public:
  Progress() : tty_(isatty(STDERR_FILENO)) {}
  ~Progress() {
    if (shown_)
      std::fprintf(stderr, "\r\033[K");
  }
  void show(const std::string &text) {
    if (!tty_)
      return;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }

private:
  bool tty_, shown_ = false;
};

StatusOr<DType> parseDType(const std::string &name) {
  if (name == "bf16")
    return DType::BF16;
  if (name == "f16")
    return DType::F16;
  if (name == "f32")
    return DType::F32;
  return invalidArgument("--dtype expects bf16, f16 or f32, got " + name);
}

/// The store of --store URL for `model`, laid out by --chunk-tokens and
/// --layer-group and salted by --tenant (save and restore must agree).
/// The --store of a request; `access` says whether a file:// store may be
/// created (a save) or must exist (a restore).
StatusOr<std::unique_ptr<ChunkStore>>
openStore(Args &args, const LlamaModel &model, TierAccess access) {
  StoreOptions options;
  KVC_ASSIGN_OR_RETURN(url, args.required("store"));
  KVC_ASSIGN_OR_RETURN(
      chunkTokens, args.integer("chunk-tokens", options.layout.chunkTokens));
  KVC_ASSIGN_OR_RETURN(layerGroup,
                       args.integer("layer-group", options.layout.layerGroup));
  if (chunkTokens <= 0 || layerGroup <= 0)
    return invalidArgument("--chunk-tokens and --layer-group must be positive");
  options.url = url;
  options.layout = {chunkTokens, layerGroup};
  options.tenant = args.get("tenant");
  options.access = access;
  return host::openStore(options, model);
}

Status genModel(Args &args) {
  GenModelOptions o;
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  KVC_ASSIGN_OR_RETURN(layers, args.integer("layers", o.layers));
  KVC_ASSIGN_OR_RETURN(hidden, args.integer("hidden", o.hidden));
  KVC_ASSIGN_OR_RETURN(heads, args.integer("heads", o.heads));
  KVC_ASSIGN_OR_RETURN(kvHeads, args.integer("kv-heads", o.kvHeads));
  KVC_ASSIGN_OR_RETURN(ffn, args.integer("ffn", o.ffn));
  KVC_ASSIGN_OR_RETURN(vocab, args.integer("vocab", o.vocab));
  KVC_ASSIGN_OR_RETURN(maxPositions,
                       args.integer("max-positions", o.maxPositions));
  KVC_ASSIGN_OR_RETURN(seed, args.integer("seed", 0));
  KVC_ASSIGN_OR_RETURN(dtype, parseDType(args.get("dtype", "bf16")));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  o.layers = layers, o.hidden = hidden, o.heads = heads, o.kvHeads = kvHeads;
  o.ffn = ffn, o.vocab = vocab, o.maxPositions = maxPositions;
  o.seed = uint64_t(seed), o.dtype = dtype;
  KVC_RETURN_IF_ERROR(generateModel(out, o));
  std::printf("wrote a %lld-layer model (hidden %lld, %lld heads, %lld KV "
              "heads, %s) to %s\n",
              (long long)o.layers, (long long)o.hidden, (long long)o.heads,
              (long long)o.kvHeads, dtypeName(o.dtype), out.c_str());
  return Status::ok();
}

/// Fails when the f32 K and V of `tokens` tokens (what a prefill of them
/// holds, before any other buffer) exceed the memory this machine has
/// available: said at once, not after a prefill that would swap or die.
Status checkFits(const ModelConfig &model, int64_t tokens) {
  const double needed = double(tokens) * double(model.numLayers) * 2.0 *
                        double(model.numKvHeads * model.headDim) * 4.0;
  const int64_t available = availableMemoryBytes();
  if (available > 0 && needed > double(available)) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "%lld tokens: their K and V alone need %.1f GiB, this "
                  "machine has %.1f GiB available",
                  (long long)tokens, needed / double(1 << 30),
                  double(available) / double(1 << 30));
    return Status(StatusCode::FailedPrecondition, text);
  }
  return Status::ok();
}

/// Tokens from --tokens FILE (whitespace-separated ids below the model's
/// vocabulary) or --random-tokens, at most the model's positions and what
/// fits in memory.
StatusOr<std::vector<int32_t>> requestTokens(Args &args,
                                             const ModelConfig &model) {
  std::vector<int32_t> tokens;
  auto tooLong = [&](const std::string &what, int64_t n) {
    return invalidArgument(what + ": " + std::to_string(n) +
                           " tokens, the model holds at most " +
                           std::to_string(model.maxPositions) + " positions");
  };
  if (args.has("tokens")) {
    KVC_ASSIGN_OR_RETURN(path, args.required("tokens"));
    std::ifstream in(path);
    if (!in)
      return notFound(path + ": cannot open token file");
    for (std::string word; in >> word;) {
      char *end = nullptr;
      errno = 0;
      long long t = std::strtoll(word.c_str(), &end, 10);
      if (*end || errno == ERANGE || t < 0 || t >= model.vocabSize)
        return invalidArgument(
            path + ": token " + std::to_string(tokens.size() + 1) + " is \"" +
            word + "\", not a token id below the vocabulary of " +
            std::to_string(model.vocabSize));
      if (int64_t(tokens.size()) == model.maxPositions)
        return tooLong(path, int64_t(tokens.size()) + 1);
      tokens.push_back(int32_t(t));
    }
    if (tokens.empty())
      return invalidArgument(path + ": no tokens");
    KVC_RETURN_IF_ERROR(checkFits(model, int64_t(tokens.size())));
    return tokens;
  }
  KVC_ASSIGN_OR_RETURN(count, args.integer("random-tokens", 0));
  KVC_ASSIGN_OR_RETURN(seed, args.integer("seed", 0));
  if (count <= 0)
    return invalidArgument("give --tokens FILE or --random-tokens N");
  if (count > model.maxPositions)
    return tooLong("--random-tokens", count);
  KVC_RETURN_IF_ERROR(checkFits(model, count));
  std::mt19937_64 rng{uint64_t(seed)};
  for (int64_t i = 0; i < count; ++i)
    tokens.push_back(int32_t(rng() % uint64_t(model.vocabSize)));
  return tokens;
}

Status save(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  SaveOptions options;
  options.forms.clear();
  std::stringstream forms(args.get("forms", "kv,hidden"));
  for (std::string form; std::getline(forms, form, ',');) {
    std::optional<Form> parsed = parseForm(form);
    if (!parsed)
      return invalidArgument("--forms expects kv and/or hidden, got " + form);
    options.forms.push_back(*parsed);
  }
  KVC_ASSIGN_OR_RETURN(codec, parseCodecSpec(args.get("codec", "raw")));
  options.codec = codec;
  KVC_ASSIGN_OR_RETURN(writers, args.integer("writers", options.writers));
  KVC_ASSIGN_OR_RETURN(bufferMb, args.integer("buffer-mb", 256));
  if (writers <= 0 || bufferMb <= 0)
    return invalidArgument("--writers and --buffer-mb must be positive");
  options.writers = int(writers);
  options.bufferBytes = size_t(bufferMb) << 20;
  options.dryRun = args.has("dry-run");
  options.replace = args.has("replace");
  Progress progress;
  options.progress = [&](int64_t done, int64_t total) {
    progress.show("save: prefilled " + std::to_string(done) + " of " +
                  std::to_string(total) + " tokens");
  };
  KVC_ASSIGN_OR_RETURN(store, openStore(args, *model, TierAccess::Create));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  StatusOr<SaveStats> saved = saveContext(*model, *store, tokens, options);
  if (chunkFault(saved.status()) == ChunkFault::WrongRange)
    return Status(saved.status().code(),
                  saved.status().message() +
                      " (--replace rewrites what is stored)");
  KVC_ASSIGN_OR_RETURN(stats, std::move(saved));
  std::printf("saved %zu tokens of model %.16s to %s with codec %s: %lld "
              "objects written, %lld already stored; prefill %.3f s, total "
              "%.3f s, waited %.3f s for buffers, peak buffers %.1f MiB\n",
              tokens.size(), model->fingerprint().c_str(), store->tier().url().c_str(),
              options.codec.str().c_str(), (long long)stats.written,
              (long long)stats.skipped, stats.prefillSeconds,
              stats.totalSeconds, stats.stallSeconds,
              double(stats.peakBufferedBytes) / (1 << 20));
  return Status::ok();
}

Status profileCodecs(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  // Random tokens, as --random-tokens everywhere (--tokens names a file).
  KVC_ASSIGN_OR_RETURN(count, args.integer("random-tokens", 1024));
  KVC_ASSIGN_OR_RETURN(seed, args.integer("seed", 0));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  if (count <= 0 || count > model->config().maxPositions)
    return invalidArgument("--random-tokens " + std::to_string(count) +
                           ": expected 1 to the model's " +
                           std::to_string(model->config().maxPositions) +
                           " positions");
  return runCodecProfile(*model, count, uint64_t(seed), out);
}

/// Validates a plan bundle and summarizes each plan: its tasks per resource
/// and lanes, staging slots and predicted makespan.
Status inspectBundle(Args &args) {
  KVC_ASSIGN_OR_RETURN(path, args.required("bundle"));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(bundle, readPlanBundle(path));
  std::printf("bundle version %lld, model %s: %zu plan(s)\n",
              (long long)bundle.version,
              bundle.modelFingerprint.empty()
                  ? "(no fingerprint)"
                  : bundle.modelFingerprint.c_str(),
              bundle.plans.size());
  for (const BundlePlan &plan : bundle.plans) {
    std::printf("plan %s: tokens %lld to %lld, layers %lld to %lld, %zu "
                "tasks, %lld staging slots",
                plan.name.c_str(), (long long)plan.tokens.begin,
                (long long)plan.tokens.end, (long long)plan.layers.begin,
                (long long)plan.layers.end, plan.tasks.size(),
                (long long)plan.stagingSlots);
    if (plan.predictedUs)
      std::printf(", predicted %lld us", (long long)*plan.predictedUs);
    std::printf("\n");
    // Tasks and lanes per resource, in the order of Resource.
    std::map<Resource, std::pair<int64_t, int64_t>> use;
    for (const BundleTask &task : plan.tasks) {
      auto &[tasks, lanes] = use[task.resource];
      ++tasks;
      lanes = std::max(lanes, task.lane + 1);
    }
    for (const auto &[resource, counts] : use)
      std::printf("  %-8s %lld tasks on %lld lane(s)\n", name(resource),
                  (long long)counts.first, (long long)counts.second);
  }
  return Status::ok();
}

/// --max-error: a bound on the largest error relative to a full prefill's
/// largest |K| or |V|, when given.
StatusOr<std::optional<double>> maxErrorOption(Args &args) {
  if (!args.has("max-error"))
    return std::optional<double>();
  std::string text = args.get("max-error");
  double value = std::strtod(text.c_str(), nullptr);
  if (!(value > 0))
    return invalidArgument("--max-error expects a positive number, got " +
                           text);
  return std::optional<double>(value);
}

/// Prints a verification and fails above the bound.
Status reportVerification(const RestoreError &error,
                          const VerifyBound &bound) {
  Status status = checkVerification(error, bound);
  std::printf("verify: against a full prefill, max error %.3g", error.max);
  if (bound.max)
    std::printf(" (bound %.3g)", *bound.max);
  std::printf(", relative L2 %.3g (bound %.3g): %s\n", error.relativeL2,
              bound.relativeL2, status.isOk() ? "ok" : "FAILED");
  return status;
}

/// What restore and compare share: the model, the request, the store and
/// plans for them (from a bundle, or compiled in-process).
struct RestoreSetup {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ChunkStore> store;
  /// The request over them (its tokens, the reference prefill).
  MeasuredRequest request;
  std::string planSource; ///< The bundle's path, or "--strategy", for messages.
  PlanBundle bundle;
  std::optional<double> maxError; ///< --max-error, when given.
  /// The target planned for (--strategy), for compare's machine check.
  std::optional<TargetDesc> target;
};

/// The planning hook kvc-run binds: the compiler in-process.
PlanHook compilerHook() {
#ifdef KVC_RUN_WITH_COMPILER
  return [](const ModelCompute &model, const TargetDesc &target,
            const planning::Request &request, int64_t chunkTokens,
            const PlanOptions &options) {
    CompileRestoreOptions compile;
    compile.strategies = options.strategies;
    compile.chunkTokens = chunkTokens;
    compile.stagingMiB = options.stagingMiB;
    return compileRestore(model.config(), model.fingerprint(), target, request,
                          compile);
  };
#else
  return {};
#endif
}

/// Prints what `store` holds of the request: the planner's sources.
Status printStored(ChunkStore &store, const std::vector<int32_t> &tokens) {
  KVC_ASSIGN_OR_RETURN(matches, matchPrefix(store, tokens));
  const int64_t n = int64_t(tokens.size());
  for (const PrefixMatch &match : matches) {
    if (match.tokens < n) {
      std::printf("store: %s for tokens 0 to %lld of %lld (not planned)\n",
                  name(match.form), (long long)match.tokens, (long long)n);
      continue;
    }
    std::printf("store: %s for every token, codec %s", name(match.form),
                match.codec.str().c_str());
    if (store.layout().layerGroup > 1)
      std::printf(", %lld layers per object",
                  (long long)store.layout().layerGroup);
    std::printf("\n");
  }
  return Status::ok();
}

/// --strategy: plans the request in-process for --target, one plan per
/// strategy; `all` takes every strategy the store's sources allow.
StatusOr<PlanBundle> compileStrategies(Args &args, const LlamaModel &model,
                                       ChunkStore &store,
                                       const std::vector<int32_t> &tokens,
                                       const std::string &list,
                                       std::optional<TargetDesc> &plannedFor) {
  PlanHook hook = compilerHook();
  if (!hook)
    return unimplemented("--strategy plans with the compiler, which this "
                         "kvc-run was built without (KVC_BUILD_COMPILER=OFF); "
                         "compile a bundle with kvc-opt and pass --bundle");
  KVC_ASSIGN_OR_RETURN(targetPath, args.required("target"));
  KVC_ASSIGN_OR_RETURN(target, loadTargetDesc(targetPath));
  KVC_ASSIGN_OR_RETURN(stagingMiB, args.integer("staging-mib", 256));
  KVC_ASSIGN_OR_RETURN(tier, storeTier(target, store.tier(), args.get("tier")));
  std::printf("planning for %s: the store is tier %s at %.3g GB/s",
              target.name.c_str(), tier->name.c_str(), tier->readGBs);
  // A ?gbps= throttle is in gigabits per second, as links are quoted.
  if (double gbps = store.tier().throttleGBs())
    std::printf(" (its ?gbps=%.3g throttle, gigabits per second)", gbps * 8);
  std::printf("\n");
  KVC_RETURN_IF_ERROR(printStored(store, tokens));
  PlanOptions options;
  options.stagingMiB = stagingMiB;
  options.strategies.clear();
  std::stringstream names(list);
  for (std::string name; std::getline(names, name, ',');)
    options.strategies.push_back(name);
  plannedFor = target;
  return planRestore(hook, model, store, tokens, target, tier->name, options);
}

/// `defaultStrategy` is what --strategy means when given without a value.
StatusOr<RestoreSetup> loadRestoreSetup(Args &args,
                                        const std::string &defaultStrategy) {
  RestoreSetup setup;
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(store, openStore(args, *model, TierAccess::Existing));
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  setup.maxError = maxError;
  if (args.has("bundle") == args.has("strategy"))
    return invalidArgument("give either --bundle FILE or --strategy");
  KVC_RETURN_IF_ERROR(matchPrefix(*store, tokens).status());
  if (args.has("strategy")) {
    setup.planSource = "--strategy";
    const std::string list = args.get("strategy").empty()
                                 ? defaultStrategy
                                 : args.get("strategy");
    KVC_ASSIGN_OR_RETURN(bundle, compileStrategies(args, *model, *store,
                                                   tokens, list, setup.target));
    setup.bundle = std::move(bundle);
  } else {
    setup.planSource = args.get("bundle");
    KVC_ASSIGN_OR_RETURN(bundle, readPlanBundle(setup.planSource));
    setup.bundle = std::move(bundle);
  }
  const std::string &compiledFor = setup.bundle.modelFingerprint;
  if (!compiledFor.empty() && compiledFor != model->fingerprint())
    return Status(StatusCode::FailedPrecondition,
                  setup.planSource + " was compiled for model " +
                      compiledFor.substr(0, 16) + ", not " +
                      model->fingerprint().substr(0, 16));
  setup.model = std::move(model);
  setup.store = std::move(store);
  setup.request.model = setup.model.get();
  setup.request.store = setup.store.get();
  setup.request.tokens = std::move(tokens);
  return setup;
}

/// Prints the chunks a restore recomputed instead of loading, and the
/// exact context it held to do so.
void printFallbacks(const RestoreMetrics &metrics) {
  for (const std::string &event : metrics.fallbacks)
    std::printf("  fallback: %s\n", event.c_str());
  if (metrics.exactContextBytes > 0)
    std::printf("  exact context %.3f MB (a private prefill the fallbacks "
                "recomputed over)\n",
                double(metrics.exactContextBytes) * 1e-6);
}

/// Prints a dynamic Cake run: where the sides met, beside `predictedBy`'s
/// merge point when there is one.
void printDynamicCake(const DynamicCakeResult &result, std::size_t tokens,
                      const char *predictedBy) {
  std::printf("restored %zu tokens with dynamic Cake: %.3f ms; computed %lld "
              "chunks, loaded %lld; merge point at token %lld",
              tokens, result.metrics.makespanSeconds * 1e3,
              (long long)result.chunksComputed, (long long)result.chunksLoaded,
              (long long)result.mergeToken);
  if (result.predictedMergeToken)
    std::printf(" (%s: %lld)", predictedBy,
                (long long)*result.predictedMergeToken);
  std::printf("\n");
  printFallbacks(result.metrics);
}

/// restore --dynamic: runs a Cake-shaped plan as Cake's two-sided walk, on
/// the plan's tier, lanes and codec; the plan's merge point is the
/// prediction the run reports against.
Status restoreDynamic(RestoreSetup &setup, const BundlePlan &plan,
                      const RestoreOptions &run, bool verify) {
  KVC_ASSIGN_OR_RETURN(options, dynamicCakeOptions(plan));
  KVC_ASSIGN_OR_RETURN(into, destinationFor(cpuBackend(), *setup.model,
                                            setup.request.tokens, *setup.store,
                                            {options.tier}));
  KVC_ASSIGN_OR_RETURN(pools, ResourcePools::create(planResources(plan)));
  KVC_ASSIGN_OR_RETURN(result,
                       restoreDynamicCake(*pools, into->target, options, run));
  printDynamicCake(result, setup.request.tokens.size(),
                   ("plan " + plan.name).c_str());
  if (!run.tracePath.empty())
    std::printf("  trace: %s\n", run.tracePath.c_str());
  if (!verify)
    return Status::ok();
  KVC_ASSIGN_OR_RETURN(error, restoreError(*setup.model, setup.request.tokens,
                                           *into->cache, into->table));
  return reportVerification(error,
                            verifyBound(planCodecs(plan), setup.maxError));
}

/// Restores a request by running one plan of a bundle into a paged cache;
/// prints measured beside predicted, and with --verify the error against a
/// full prefill (failing above --max-error, by default bf16 rounding).
Status restoreCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(setup, loadRestoreSetup(args, "joint"));
  std::string planName = args.get("plan");
  bool verify = args.has("verify");
  bool dynamic = args.has("dynamic");
  RestoreOptions options;
  options.tracePath = args.get("trace");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  const PlanBundle &bundle = setup.bundle;
  const BundlePlan *plan = planName.empty() && bundle.plans.size() == 1
                               ? &bundle.plans.front()
                               : bundle.findPlan(planName);
  if (!plan)
    return invalidArgument(planName.empty()
                               ? setup.planSource + " holds several plans: "
                                                    "name one with --plan"
                               : setup.planSource + " has no plan " + planName);
  if (dynamic)
    return restoreDynamic(setup, *plan, options, verify);
  KVC_ASSIGN_OR_RETURN(run, runPlan(setup.request, *plan, options, verify));
  const RestoreMetrics &metrics = run.metrics;
  std::printf("restored %zu tokens with plan %s: %.3f ms measured",
              setup.request.tokens.size(), plan->name.c_str(),
              metrics.makespanSeconds * 1e3);
  if (metrics.predictedSeconds)
    std::printf(", %.3f ms predicted", *metrics.predictedSeconds * 1e3);
  std::printf(", %.3f GFLOP (plan: %.3f)\n", metrics.flops * 1e-9,
              metrics.plannedFlops * 1e-9);
  // Measured, and beside it what the compiler predicted where it did.
  auto predicted = [](const auto &map, const std::string &key, double scale,
                      const char *unit) {
    auto it = map.find(key);
    if (it != map.end())
      std::printf(" (predicted %.3f %s)", double(it->second) * scale, unit);
    std::printf("\n");
  };
  for (const auto &[resource, seconds] : metrics.busySeconds) {
    std::printf("  busy %-10s %.3f ms", resource.c_str(), seconds * 1e3);
    predicted(metrics.predictedBusySeconds, resource, 1e3, "ms");
  }
  for (const auto &[tier, bytes] : metrics.bytesRead) {
    std::printf("  read %-10s %.3f MB", tier.c_str(), double(bytes) * 1e-6);
    predicted(metrics.predictedBytesRead, tier, 1e-6, "MB");
  }
  std::printf("  staging  %.3f MB in %lld slot(s)\n",
              double(metrics.stagingBytes) * 1e-6,
              (long long)plan->stagingSlots);
  std::printf("  memory   %.1f MB resident before the restore (paged cache "
              "%.1f MB), peak %.1f MB: %.1f MB above\n",
              double(run.residentBefore) * 1e-6, double(run.cacheBytes) * 1e-6,
              double(run.residentPeak) * 1e-6,
              double(run.residentPeak - run.residentBefore) * 1e-6);
  printFallbacks(metrics);
  if (!options.tracePath.empty())
    std::printf("  trace: %s\n", options.tracePath.c_str());
  if (run.error)
    return reportVerification(*run.error,
                              verifyBound(planCodecs(*plan), setup.maxError));
  return Status::ok();
}

/// Restores the request with every plan of a bundle, verifies each, and
/// prints one table: predicted and measured time, bytes read, FLOPs,
/// fallbacks, error, and the measured speedup over every other plan.
Status compareCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(setup, loadRestoreSetup(args, "all"));
  KVC_ASSIGN_OR_RETURN(repeat, args.integer("repeat", 1));
  if (repeat <= 0)
    return invalidArgument("--repeat must be positive");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  const std::vector<BundlePlan> &plans = setup.bundle.plans;
  // A plan with the schedule of an earlier one is measured once and shown
  // for both (sameSchedules).
  const std::vector<std::size_t> sameAs = sameSchedules(plans);
  // One restore first, unmeasured: the first restore of a process pays for
  // thread pools, allocator growth and first-touch page faults (on this VM
  // 30-40% more than later ones), which would otherwise land on one plan.
  if (!plans.empty())
    KVC_RETURN_IF_ERROR(
        runPlan(setup.request, plans.front(), {}, /*verify=*/false).status());
  // Each plan `repeat` times, round robin so that a noisy stretch of the
  // machine does not land on one plan. With a target, calibration's
  // reference chunk is timed before each round too: predictions hold while
  // the machine runs at the speed it was calibrated at, and these timings
  // say whether it did.
  std::vector<std::vector<PlanRun>> all(plans.size());
  std::vector<double> probes;
  std::optional<Progress> progress(std::in_place);
  double price = 0;
  int64_t probeTokens = 0;
  for (int64_t r = 0; r < repeat; ++r) {
    if (setup.target) {
      KVC_ASSIGN_OR_RETURN(
          probe,
          measureReferenceChunk(cpuBackend(), *setup.model, *setup.target));
      probes.push_back(probe.measuredSeconds);
      price = probe.predictedSeconds;
      probeTokens = probe.tokens;
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (sameAs[i] != i)
        continue;
      progress->show("compare: round " + std::to_string(r + 1) + " of " +
                     std::to_string(repeat) + ", plan " + plans[i].name);
      // Every run is verified (after its timing): a run that goes wrong
      // once in a while fails the comparison too.
      KVC_ASSIGN_OR_RETURN(
          run, runPlan(setup.request, plans[i], {}, /*verify=*/true));
      all[i].push_back(std::move(run));
    }
  }
  progress.reset(); // Erased before the table.
  if (!probes.empty()) {
    double typical = median(probes);
    std::printf("machine: a %lld-token chunk from position 0 took %.2f ms",
                (long long)probeTokens, typical * 1e3);
    if (probes.size() > 1)
      std::printf(" at the median of %zu rounds (%.2f to %.2f)", probes.size(),
                  *std::min_element(probes.begin(), probes.end()) * 1e3,
                  *std::max_element(probes.begin(), probes.end()) * 1e3);
    std::printf(", %s prices it at %.2f ms (%+.0f%%)\n",
                setup.target->name.c_str(), price * 1e3,
                (typical / price - 1) * 100);
    // Not even the fastest timing reached the calibrated speed: the
    // machine was slower throughout, and `off` measures that, not the model.
    double quickest = *std::min_element(probes.begin(), probes.end());
    if (quickest > 1.1 * price)
      std::printf("(the machine never ran at the speed %s prices: its "
                  "fastest timing was %+.0f%% over the price, so off "
                  "measures the machine, not the cost model; %s)\n",
                  setup.target->name.c_str(), (quickest / price - 1) * 100,
                  setup.target->calibrated
                      ? "it ran slower than when it was calibrated (a "
                        "loaded machine?)"
                      : "calibrate first");
  }
  // The fastest run is held against the prediction, the median shown
  // beside it (summarize says why).
  std::vector<PlanRun> runs;
  std::vector<double> medians;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (sameAs[i] != i) {
      runs.push_back(runs[sameAs[i]]);
      medians.push_back(medians[sameAs[i]]);
      continue;
    }
    // The table shows (and verification holds) the worst error of them all.
    PlanSummary summary = summarize(std::move(all[i]));
    medians.push_back(summary.medianSeconds);
    runs.push_back(std::move(summary.fastest));
    runs.back().error = summary.worstError;
  }
  std::printf("%-10s %12s %10s %6s %10s %10s %9s %6s %10s %9s", "plan",
              "predicted ms", "fastest ms", "off", "median ms", "read MB",
              "GFLOP", "fallbk", "max error", "L2 error");
  for (const BundlePlan &base : plans)
    std::printf(" %10s", ("vs " + base.name).substr(0, 10).c_str());
  std::printf("\n");
  Status worst;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const RestoreMetrics &m = runs[i].metrics;
    int64_t bytes = 0;
    for (const auto &[tier, b] : m.bytesRead)
      bytes += b;
    char predicted[32] = "-", off[32] = "-";
    if (m.predictedSeconds) {
      std::snprintf(predicted, sizeof(predicted), "%.3f",
                    *m.predictedSeconds * 1e3);
      std::snprintf(off, sizeof(off), "%+.0f%%",
                    (m.makespanSeconds / *m.predictedSeconds - 1) * 100);
    }
    std::printf("%-10s %12s %10.3f %6s %10.3f %10.3f %9.3f %6zu %10.3g %9.3g",
                plans[i].name.c_str(), predicted, m.makespanSeconds * 1e3, off,
                medians[i] * 1e3, double(bytes) * 1e-6, m.flops * 1e-9,
                m.fallbacks.size(), runs[i].error->max,
                runs[i].error->relativeL2);
    for (const PlanRun &base : runs)
      std::printf(" %9.2fx",
                  base.metrics.makespanSeconds / m.makespanSeconds);
    std::printf("\n");
    if (worst.isOk())
      worst = checkVerification(*runs[i].error,
                                verifyBound(planCodecs(plans[i]),
                                            setup.maxError))
                  .withContext("plan " + plans[i].name);
  }
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (sameAs[i] != i)
      std::printf("(%s is the same schedule as %s: measured once, shown for "
                  "both)\n",
                  plans[i].name.c_str(), plans[sameAs[i]].name.c_str());
  if (repeat > 1)
    std::printf("(of %lld runs each: off and the speedups compare the "
                "fastest runs; every run was verified, the errors are the "
                "worst)\n",
                (long long)repeat);
  std::printf("verify: every plan within what its codecs allow of a full "
              "prefill: %s\n",
              worst.isOk() ? "ok" : "FAILED");
  return worst;
}

/// Restores with Cake's dynamic mode: compute from the front, KV loads from
/// the back of the store's chunks, meeting where this run's rates put them.
Status cakeCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(store, openStore(args, *model, TierAccess::Existing));
  KVC_RETURN_IF_ERROR(matchPrefix(*store, tokens).status());
  KVC_ASSIGN_OR_RETURN(lanes, args.integer("io-lanes", 2));
  KVC_ASSIGN_OR_RETURN(predicted, args.integer("predicted-merge", -1));
  bool verify = args.has("verify");
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(
      into, destinationFor(cpuBackend(), *model, tokens, *store, {"store"}));
  KVC_ASSIGN_OR_RETURN(
      pools,
      ResourcePools::create({{poolName(Resource::Compute), 1},
                             {poolName(Resource::IO, "store"), int(lanes)}}));
  DynamicCakeOptions options;
  options.tier = "store";
  if (predicted >= 0)
    options.predictedMergeToken = predicted;
  KVC_ASSIGN_OR_RETURN(result,
                       restoreDynamicCake(*pools, into->target, options));
  printDynamicCake(result, tokens.size(), "compiler");
  if (!verify)
    return Status::ok();
  KVC_ASSIGN_OR_RETURN(error,
                       restoreError(*model, tokens, *into->cache, into->table));
  KVC_ASSIGN_OR_RETURN(
      extent, store->stored(tokens.data(), int64_t(tokens.size()), Form::KV));
  return reportVerification(error, verifyBound({extent.codec}, maxError));
}

/// Measures this machine into a target description the planner accepts.
Status calibrateCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(basePath, args.required("base"));
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  std::string scratch = args.get("scratch", "/tmp");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  KVC_ASSIGN_OR_RETURN(base, loadTargetDesc(basePath));
  KVC_ASSIGN_OR_RETURN(target, calibrate(cpuBackend(), *model, base, scratch));
  std::ofstream file(out);
  file << printTargetDesc(target);
  if (!file)
    return notFound(out + ": cannot write the target description");
  std::printf("wrote %s\n", out.c_str());
  return Status::ok();
}

/// A command: what it does, its options and its implementation.
struct Command {
  const char *name, *summary;
  std::vector<Option> options;
  Status (*run)(Args &);
};

std::vector<Option> operator+(std::vector<Option> a,
                              const std::vector<Option> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<Command> &commands() {
  static const std::vector<Option> common = {
      {"compute-threads", "N",
       "threads of the CPU backend's GEMMs, at most the cores (default 1)"},
      {"help", "", "print this and exit"}};
  // What save and restore must agree on: the request and the store layout.
  static const std::vector<Option> request = {
      {"model", "DIR", "the model directory (config.json + safetensors)"},
      {"tokens", "FILE", "the request: whitespace-separated token ids"},
      {"random-tokens", "N", "or N random tokens (at most the context)"},
      {"seed", "S", "the random tokens' seed (default 0)"}};
  static const std::vector<Option> store = {
      {"store", "URL",
       "mem://, file:///DIR or redis://HOST:PORT[/DB], "
       "?gbps=N throttles"},
      {"chunk-tokens", "N", "tokens per stored object (default 256; as saved)"},
      {"layer-group", "N", "layers per stored object (default 4; as saved)"},
      {"tenant", "SALT",
       "the tenant salt of the keys (default none; as saved)"}};
  static const std::vector<Option> plan = {
      {"bundle", "FILE", "plans compiled by kvc-opt (or --strategy)"},
      {"strategy", "[LIST]",
       "plan in process: compute, kv, hidden, cake, "
       "hcache, joint"},
      {"target", "FILE", "the target --strategy plans for"},
      {"tier", "NAME",
       "the target's tier for the store (default the first "
       "of its kind)"},
      {"staging-mib", "N", "--strategy's staging budget (default 256)"},
      {"max-error", "X",
       "verification bound on the largest error (default "
       "what the plan's codecs allow)"}};
  static const std::vector<Command> all = {
      {"gen-model", "writes a random Llama-family model",
       std::vector<Option>{{"out", "DIR", "where to write it"},
                           {"layers", "N", "default 4"},
                           {"hidden", "N", "default 256"},
                           {"heads", "N", "default 8"},
                           {"kv-heads", "N", "default 2"},
                           {"ffn", "N", "default 688"},
                           {"vocab", "N", "default 1024"},
                           {"max-positions", "N", "default 32768"},
                           {"dtype", "TYPE", "bf16, f16 or f32 (default bf16)"},
                           {"seed", "S", "default 0"}} +
           common,
       genModel},
      {"save", "prefills a request and saves its KV and hidden states",
       request + store +
           std::vector<Option>{
               {"forms", "LIST", "kv and/or hidden (default kv,hidden)"},
               {"codec", "SPEC",
                "e.g. int8+zstd, hadamard+int4/g64 "
                "(default raw)"},
               {"writers", "N", "writer threads (default 2)"},
               {"buffer-mb", "N", "host buffer bound (default 256)"},
               {"dry-run", "", "prefill without saving"},
               {"replace", "", "rewrite objects stored with another codec"}} +
           common,
       save},
      {"profile-codecs", "measures every codec composition on the model's KV",
       std::vector<Option>{
           {"model", "DIR", "the model directory"},
           {"random-tokens", "N", "request length (default 1024)"},
           {"seed", "S", "default 0"},
           {"out", "FILE", "the profile (JSON)"}} +
           common,
       profileCodecs},
      {"inspect-bundle", "prints a plan bundle's plans and kernels",
       std::vector<Option>{{"bundle", "FILE", "the bundle"}} + common,
       inspectBundle},
      {"restore", "restores a request with one plan and reports it",
       request + store + plan +
           std::vector<Option>{
               {"plan", "NAME", "the bundle's plan (default its first)"},
               {"verify", "", "check the cache against a full prefill"},
               {"dynamic", "", "run a Cake-shaped plan as Cake's walk"},
               {"trace", "FILE", "write a Chrome trace"}} +
           common,
       restoreCommand},
      {"compare", "restores with every plan, verifies and tables them",
       request + store + plan +
           std::vector<Option>{
               {"repeat", "N", "runs per plan, round robin (default 1)"}} +
           common,
       compareCommand},
      {"cake", "restores with Cake's dynamic walk over what the store holds",
       request + store +
           std::vector<Option>{
               {"io-lanes", "N", "loading lanes (default 2)"},
               {"predicted-merge", "T", "a merge point to report beside"},
               {"verify", "", "check the cache against a full prefill"},
               {"max-error", "X",
                "verification bound (default bf16 "
                "rounding)"}} +
           common,
       cakeCommand},
      {"calibrate", "measures this machine and writes a target",
       std::vector<Option>{
           {"model", "DIR", "the model to time"},
           {"base", "FILE", "the target to start from"},
           {"out", "FILE", "the calibrated target"},
           {"scratch", "DIR", "where tier reads are timed (default /tmp)"}} +
           common,
       calibrateCommand},
  };
  return all;
}

void usage(FILE *out) {
  std::fprintf(out, "usage: kvc-run COMMAND [options]; kvc-run COMMAND "
                    "--help lists a command's options\n");
  for (const Command &c : commands())
    std::fprintf(out, "  %-16s %s\n", c.name, c.summary);
}

void usage(FILE *out, const Command &command) {
  std::fprintf(out, "usage: kvc-run %s [options]: %s\n", command.name,
               command.summary);
  for (const Option &o : command.options) {
    std::string flag = std::string("--") + o.name;
    if (!o.isFlag())
      flag += std::string(" ") + o.value;
    std::fprintf(out, "  %-24s %s\n", flag.c_str(), o.help);
  }
}

} // namespace

int main(int argc, char **argv) {
  std::string name = argc < 2 ? "" : argv[1];
  if (name == "--help" || name == "help") {
    usage(stdout);
    return 0;
  }
  const auto &all = commands();
  auto command = std::find_if(all.begin(), all.end(),
                              [&](const Command &c) { return name == c.name; });
  if (command == all.end()) {
    if (!name.empty())
      std::fprintf(stderr, "kvc-run: unknown command %s\n", name.c_str());
    usage(stderr);
    return 2;
  }
  StatusOr<Args> args =
      Args::parse(argc, argv, 2, command->name, command->options);
  Status status = args.status();
  if (args.isOk() && args->has("help")) {
    usage(stdout, *command);
    return 0;
  }
  if (args.isOk()) {
    StatusOr<int64_t> threads = args->integer("compute-threads", 1);
    const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
    if (!threads)
      status = threads.status();
    else if (*threads <= 0)
      status = invalidArgument("--compute-threads must be positive");
    else if (*threads > cores)
      status = invalidArgument("--compute-threads " + std::to_string(*threads) +
                               ": this machine has " + std::to_string(cores) +
                               " cores");
    else
      setComputeThreads(int(*threads));
  }
  if (status.isOk())
    status = command->run(*args);
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-run %s: %s\n", name.c_str(),
                 status.toString().c_str());
    return 1;
  }
  return 0;
}
