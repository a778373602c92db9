//===- RestoreCommands.cpp - kvc-run restore, compare and cake ------------===//
//
// Restores of a request from a store, by a bundle's plan or plans compiled
// in-process (--strategy), printed beside the compiler's predictions and
// verified against a full prefill; compare runs every plan in rounds and
// prints one table; cake runs Cake's dynamic walk. restore, compare and
// generate go through host::Connector, as a server's loads do: it opens
// the store (and reads its layout), plans the request (--strategy) and runs
// each chosen plan into a fresh cache registered with it.
//
//===----------------------------------------------------------------------===//

#include "Commands.h"

#include "kvc/Host/ConnectorSpec.h"
#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Calibrate.h"
#include "kvc/Host/Tools/Generate.h"
#include "kvc/Host/Tools/Measure.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Exec/DynamicCake.h"
#include "kvc/Runtime/Model/Llama2c.h"
#include "kvc/Runtime/Model/Tokenizer.h"

#ifdef KVC_RUN_WITH_COMPILER
#include "kvc/Host/CompilerHook.h"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>

namespace kvc::run {

using namespace kvc::host;

StatusOr<std::optional<double>> maxErrorOption(Args &args) {
  KVC_ASSIGN_OR_RETURN(value, args.number("max-error"));
  if (value && !(*value > 0))
    return invalidArgument("--max-error expects a positive number, got " +
                           args.get("max-error"));
  // Where verification is asked for (not where it always runs, as in
  // compare), a bound without it would bound nothing.
  if (value && args.takes("verify") && !args.has("verify"))
    return invalidArgument("--max-error bounds --verify's check: give "
                           "--verify too");
  return value;
}

StatusOr<double> maxKlOption(Args &args) {
  KVC_ASSIGN_OR_RETURN(maxKl, args.number("max-kl"));
  if (!maxKl)
    return std::numeric_limits<double>::infinity();
  if (!(*maxKl >= 0))
    return invalidArgument("--max-kl expects a non-negative number, got " +
                           args.get("max-kl"));
  if (args.get("codec-profile").empty())
    return invalidArgument("--max-kl judges codecs by a measured profile: "
                           "give --codec-profile FILE (kvc-run "
                           "profile-codecs writes one)");
  return *maxKl;
}

StatusOr<std::string> planTracePath(Args &args) {
  if (args.has("trace") && !args.has("bundle"))
    return invalidArgument("--trace traces a compiled plan: give --bundle");
  return args.get("trace");
}

void printLayerReadiness(const std::vector<double> &ready,
                         const std::vector<double> &predicted) {
  if (ready.empty())
    return;
  auto last = [](const std::vector<double> &layers) {
    return *std::max_element(layers.begin(), layers.end());
  };
  auto print = [&](const char *what, double measured,
                   std::optional<double> estimate) {
    std::printf("%s %.3f ms", what, measured * 1e3);
    if (estimate)
      std::printf(" (predicted %.3f ms)", *estimate * 1e3);
  };
  print("  layer 0 ready after", ready.front(),
        predicted.empty() ? std::nullopt
                          : std::optional<double>(predicted.front()));
  print("; every layer after", last(ready),
        predicted.empty() ? std::nullopt
                          : std::optional<double>(last(predicted)));
  std::printf("\n");
}

void printHostTraffic(const RestoreMetrics &metrics) {
  const HostTraffic &traffic = metrics.hostTraffic;
  if (!traffic.delivered)
    return;
  std::printf("  host     read %.3f MB, copied %.3f MB, decoded %.3f MB for "
              "%.3f MB loaded into the cache (%.3f MB of it by the device "
              "from staging): %.2f host bytes a byte\n",
              double(traffic.read) * 1e-6, double(traffic.copied) * 1e-6,
              double(traffic.decoded) * 1e-6, double(traffic.delivered) * 1e-6,
              double(traffic.scattered) * 1e-6, traffic.perByte());
  // By step: the bytes each moved, in MB.
  std::printf("  by step ");
  const char *separator = "";
  for (const auto &[step, moved] : metrics.hostTrafficByStep) {
    std::printf("%s%s", separator, step.c_str());
    for (const auto &[name, bytes] : moved.counters())
      if (bytes)
        std::printf(" %s %.3f", name.c_str(), double(bytes) * 1e-6);
    separator = "; ";
  }
  std::printf(" (MB)\n");
}

namespace {

nlohmann::json hostTrafficJson(const HostTraffic &traffic) {
  nlohmann::json out;
  for (const auto &[name, bytes] : traffic.counters())
    out[name + "_bytes"] = bytes;
  out["host_bytes_per_byte"] = traffic.perByte();
  return out;
}

} // namespace

nlohmann::json hostTrafficJson(const RestoreMetrics &metrics) {
  nlohmann::json out = hostTrafficJson(metrics.hostTraffic);
  for (const auto &[step, traffic] : metrics.hostTrafficByStep)
    out["by_step"][step] = hostTrafficJson(traffic);
  return out;
}

Status reportVerification(const RestoreError &error, const VerifyBound &bound) {
  Status status = checkVerification(error, bound);
  std::printf("verify: against a full prefill, max error %.3g", error.max);
  if (bound.max)
    std::printf(" (bound %.3g)", *bound.max);
  std::printf(", relative L2 %.3g (bound %.3g): %s\n", error.relativeL2,
              bound.relativeL2, status.isOk() ? "ok" : "FAILED");
  return status;
}

/// The planning hook kvc-run binds: the compiler in-process.
PlanHook compilerHook() {
#ifdef KVC_RUN_WITH_COMPILER
  return compilerPlanHook([](const std::string &warning) {
    std::fprintf(stderr, "kvc-run: warning: %s\n", warning.c_str());
  });
#else
  return {};
#endif
}

/// Prints what the stores hold of the request (`found`, of `n` tokens): the
/// planner's sources.
void printStored(const Lookup &found, int64_t n) {
  for (Form form : {Form::KV, Form::Hidden})
    if (std::none_of(
            found.held.begin(), found.held.end(),
            [&](const Lookup::Held &h) { return h.match.form == form; }))
      std::printf("store: no %s of the request\n", name(form));
  for (const Lookup::Held &held : found.held) {
    const PrefixMatch &match = held.match;
    if (match.tokens < n) {
      std::printf("store: %s for tokens 0 to %lld of %lld (not planned)\n",
                  name(match.form), (long long)match.tokens, (long long)n);
      continue;
    }
    std::printf("store: %s for every token, codec %s", name(match.form),
                match.codec.str().c_str());
    if (held.layout.layerGroup > 1)
      std::printf(", %lld layers per object",
                  (long long)held.layout.layerGroup);
    std::printf("\n");
  }
}

/// --strategy: plans the request in-process for the connector's target,
/// one plan per strategy; `all` takes every strategy the store's sources
/// allow.
StatusOr<PlanBundle> compileStrategies(Args &args, Connector &connector,
                                       const std::vector<int32_t> &tokens,
                                       const std::string &list) {
  KVC_ASSIGN_OR_RETURN(stagingMiB, args.integer("staging-mib", 256));
  if (stagingMiB <= 0)
    return invalidArgument("--staging-mib must be positive, got " +
                           std::to_string(stagingMiB));
  const TargetDesc &target = connector.target();
  const std::string &tierName = connector.tierOf(0);
  double readGBs = 0;
  for (const TierDesc &tier : target.tiers)
    if (tier.name == tierName)
      readGBs = planning::CostModel::readGBs(tier);
  std::printf("planning for %s: the store is tier %s at %.3g GB/s",
              target.name.c_str(), tierName.c_str(), readGBs);
  // A ?gbps= throttle is in gigabits per second, as links are quoted.
  if (double gbps = connector.storage(0).throttleGBs())
    std::printf(" (its ?gbps=%.3g throttle, gigabits per second)", gbps * 8);
  std::printf("\n");
  KVC_ASSIGN_OR_RETURN(found, connector.lookup(tokens));
  printStored(found, int64_t(tokens.size()));
  PlanOptions options;
  options.stagingMiB = stagingMiB;
  options.layerWise = args.has("layer-wise");
  KVC_ASSIGN_OR_RETURN(forwardTokens, args.integer("forward-tokens", 0));
  options.forwardTokens = forwardTokens;
  options.codecProfile = args.get("codec-profile");
  // The CPU backend launches no PTX: its plans need none unless asked.
  options.gpuChip =
      args.get("gpu-chip", &backend() == &cpuDevice() ? "none" : "");
  KVC_ASSIGN_OR_RETURN(maxKl, maxKlOption(args));
  options.maxKl = maxKl;
  KVC_ASSIGN_OR_RETURN(strategies, planning::parseStrategies(list));
  options.strategies = std::move(strategies);
  return connector.planRequest(tokens, options);
}

/// `defaultStrategy` is what --strategy means when given without a value.
StatusOr<RestoreSetup> loadRestoreSetup(Args &args,
                                        const std::string &defaultStrategy) {
  RestoreSetup setup;
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(forwardTokens, args.integer("forward-tokens", 0));
  const int64_t n = int64_t(tokens.size()),
                context = model->config().maxPositions;
  if (forwardTokens < 0 || forwardTokens > context - n)
    return invalidArgument("--forward-tokens " + std::to_string(forwardTokens) +
                           " after the request's " + std::to_string(n) +
                           " tokens: the model holds at most " +
                           std::to_string(context) + " positions");
  KVC_RETURN_IF_ERROR(refuseLayoutOptions(args));
  KVC_ASSIGN_OR_RETURN(url, args.required("store"));
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  setup.maxError = maxError;
  if (args.has("bundle") == args.has("strategy"))
    return invalidArgument("give either --bundle FILE or --strategy");
  ConnectorSpec spec;
  spec.stores = {{url, args.get("tier")}};
  spec.createStores = false;
  spec.tenant = args.get("tenant");
  TargetDesc target;
  PlanHook planner;
  if (args.has("strategy")) {
    planner = compilerHook();
    if (!planner)
      return unimplemented(
          "--strategy plans with the compiler, which this kvc-run was built "
          "without (KVC_BUILD_COMPILER=OFF); compile a bundle with kvc-opt "
          "and pass --bundle");
    KVC_ASSIGN_OR_RETURN(targetPath, args.required("target"));
    KVC_ASSIGN_OR_RETURN(loaded, loadTargetDesc(targetPath));
    target = std::move(loaded);
  } else {
    setup.planSource = args.get("bundle");
    KVC_ASSIGN_OR_RETURN(bundle, readBundleFor(setup.planSource, *model));
    setup.bundle = std::make_shared<const PlanBundle>(std::move(bundle));
    // Bundles compiled ahead run as chosen; nothing is planned here.
    planner = bundleHook({});
  }
  KVC_ASSIGN_OR_RETURN(options,
                       connectorOptions(spec, *model, backend(),
                                        std::move(target), std::move(planner)));
  KVC_ASSIGN_OR_RETURN(connector, Connector::create(std::move(options)));
  if (args.has("strategy")) {
    setup.planSource = "--strategy";
    setup.target = &connector->target();
    const std::string list =
        args.get("strategy").empty() ? defaultStrategy : args.get("strategy");
    KVC_ASSIGN_OR_RETURN(bundle,
                         compileStrategies(args, *connector, tokens, list));
    setup.bundle = std::make_shared<const PlanBundle>(std::move(bundle));
  }
  setup.model = std::move(model);
  setup.connector = std::move(connector);
  setup.request.connector = setup.connector.get();
  setup.request.device = &backend();
  setup.request.model = setup.model.get();
  setup.request.tokens = std::move(tokens);
  setup.request.forwardTokens = forwardTokens;
  return setup;
}

namespace {

/// The kernel lines of a run whose generated kernels `did` `chunks` in
/// `launches`, the rest `instead` on the host.
void printKernels(int64_t chunks, int64_t launches,
                  const std::vector<std::string> &notLaunched, const char *did,
                  const char *instead) {
  if (chunks > 0)
    std::printf("  generated kernels %s %lld chunks on the device in %lld "
                "launches\n",
                did, (long long)chunks, (long long)launches);
  for (const std::string &why : notLaunched)
    std::printf("  %s on the host instead: %s\n", instead, why.c_str());
}

} // namespace

void printKernels(const RestoreMetrics &metrics) {
  printKernels(metrics.kernelChunks, metrics.kernelLaunches,
               metrics.kernelsNotLaunched, "wrote", "decoded");
}

void printKernels(const SaveMetrics &metrics) {
  printKernels(metrics.kernelChunks, metrics.kernelLaunches,
               metrics.kernelsNotLaunched, "encoded", "encoded");
}

/// Prints the chunks a restore recomputed instead of loading, and the
/// exact context it held to do so (after printKernels).
void printFallbacks(const RestoreMetrics &metrics) {
  printKernels(metrics);
  // Chunks that failed for one reason (a node gone: every chunk it held),
  // on one line with it: "<chunk>; <chunk> recomputed: <reason>".
  std::vector<std::pair<std::string, std::string>> byReason;
  for (const std::string &event : metrics.fallbacks) {
    std::size_t at = std::string::npos;
    for (const char *verb : {" recomputed: ", " left unwritten: "})
      at = std::min(at, event.find(verb));
    const std::string chunk = event.substr(0, at),
                      reason = at == std::string::npos ? "" : event.substr(at);
    auto same = std::find_if(byReason.begin(), byReason.end(),
                             [&](const auto &r) { return r.second == reason; });
    if (same == byReason.end())
      byReason.push_back({chunk, reason});
    else
      same->first += "; " + chunk;
  }
  for (const auto &[chunks, reason] : byReason)
    std::printf("  fallback: %s%s\n", chunks.c_str(), reason.c_str());
  if (metrics.exactContextBytes > 0)
    std::printf("  exact context %.3f MB (a private prefill the fallbacks "
                "recomputed over)\n",
                double(metrics.exactContextBytes) * 1e-6);
}

/// Prints a dynamic Cake run: where the sides met, beside `predictedBy`'s
/// merge point when there is one.
void printDynamicCake(const RestoreMetrics &metrics, std::size_t tokens,
                      const char *predictedBy) {
  const CakeWalk walk = metrics.walk.value_or(CakeWalk());
  std::printf("restored %zu tokens with dynamic Cake: %.3f ms; computed %lld "
              "chunks, loaded %lld; merge point at token %lld",
              tokens, metrics.makespanSeconds * 1e3,
              (long long)walk.chunksComputed, (long long)walk.chunksLoaded,
              (long long)walk.mergeToken);
  if (walk.predictedMergeToken)
    std::printf(" (%s: %lld)", predictedBy,
                (long long)*walk.predictedMergeToken);
  std::printf("\n");
  printFallbacks(metrics);
}

/// The bundle's plan `name`, or its only plan when `name` is empty.
StatusOr<PlanBundle> readBundleFor(const std::string &path,
                                   const LlamaModel &model) {
  KVC_ASSIGN_OR_RETURN(bundle, readPlanBundle(path));
  KVC_RETURN_IF_ERROR(
      checkCompiledFor(bundle, model.fingerprint()).withContext(path));
  return bundle;
}

StatusOr<const BundlePlan *> selectPlan(const PlanBundle &bundle,
                                        const std::string &source,
                                        const std::string &name) {
  const BundlePlan *plan = name.empty() && bundle.plans.size() == 1
                               ? &bundle.plans.front()
                               : bundle.findPlan(name);
  if (!plan)
    return invalidArgument(name.empty()
                               ? source + " holds several plans: name one "
                                          "with --plan"
                               : source + " has no plan " + name);
  return plan;
}

void printLoads(const BundlePlan &plan) {
  // The tokens and layers each (step, form, encoding, tier) covers, in
  // first-use order.
  struct Moves {
    StepKind kind;
    Form form;
    std::string codec, tier;
    BundleRange tokens, layers;
  };
  std::vector<Moves> moves;
  for (const BundleTask &task : plan.tasks)
    for (const BundleStep &step : task.steps) {
      if (step.kind != StepKind::Fetch && step.kind != StepKind::Store &&
          step.kind != StepKind::Send && step.kind != StepKind::Recv)
        continue;
      // A transfer's peer stands where a store's tier does.
      const std::string &where = step.tier.empty() ? step.node : step.tier;
      auto it = std::find_if(moves.begin(), moves.end(), [&](const Moves &m) {
        return m.kind == step.kind && m.form == step.form &&
               m.codec == step.codec.str() && m.tier == where;
      });
      if (it == moves.end()) {
        moves.push_back({step.kind, step.form, step.codec.str(), where,
                         step.tokens, step.layers});
        continue;
      }
      it->tokens = {std::min(it->tokens.begin, step.tokens.begin),
                    std::max(it->tokens.end, step.tokens.end)};
      it->layers = {std::min(it->layers.begin, step.layers.begin),
                    std::max(it->layers.end, step.layers.end)};
    }
  for (const Moves &m : moves) {
    const bool in = m.kind == StepKind::Fetch || m.kind == StepKind::Recv;
    const char *verb = m.kind == StepKind::Fetch   ? "loads"
                       : m.kind == StepKind::Store ? "stores"
                       : m.kind == StepKind::Send  ? "sends"
                                                   : "receives";
    std::printf("  %-8s %s as %s %s %s: tokens %lld to %lld, layers %lld to "
                "%lld\n",
                verb, name(m.form), m.codec.c_str(), in ? "from" : "to",
                m.tier.c_str(), (long long)m.tokens.begin,
                (long long)m.tokens.end, (long long)m.layers.begin,
                (long long)m.layers.end);
  }
}

/// Restores a request by running one plan of a bundle into a paged cache;
/// prints measured beside predicted, and with --verify the error against a
/// full prefill (failing above --max-error, by default bf16 rounding).
Status restoreCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(setup, loadRestoreSetup(args, "joint"));
  std::string planName = args.get("plan");
  bool verify = args.has("verify");
  bool dynamic = args.has("dynamic");
  const std::string dumpPath = args.get("dump-kv");
  const int64_t forwardTokens = setup.request.forwardTokens;
  if (forwardTokens > 0 && dynamic)
    return invalidArgument("--forward-tokens runs beside a plan's restore, "
                           "not --dynamic");
  LoadOptions options;
  options.tracePath = args.get("trace");
  options.dynamic = dynamic;
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(plan,
                       selectPlan(*setup.bundle, setup.planSource, planName));
  KVC_ASSIGN_OR_RETURN(run,
                       runPlan(setup.request, {setup.bundle, plan->name},
                               options, verify, dumpPath.empty() ? -1 : 0));
  if (!dumpPath.empty())
    KVC_RETURN_IF_ERROR(writeRestoredKv(dumpPath, *setup.request.device,
                                        *setup.request.model, *run.cache,
                                        run.table, setup.request.tokens));
  const RestoreMetrics &metrics = run.metrics;
  if (dynamic) {
    printDynamicCake(metrics, setup.request.tokens.size(),
                     ("plan " + plan->name).c_str());
    if (!options.tracePath.empty())
      std::printf("  trace: %s\n", options.tracePath.c_str());
    if (!dumpPath.empty())
      std::printf("  K and V: %s\n", dumpPath.c_str());
    if (run.error)
      return reportVerification(*run.error,
                                planBound(*plan, metrics, setup.maxError));
    return Status::ok();
  }
  std::printf("restored %zu tokens with plan %s: %.3f ms measured",
              setup.request.tokens.size(), plan->name.c_str(),
              metrics.makespanSeconds * 1e3);
  if (metrics.predictedSeconds)
    std::printf(", %.3f ms predicted", *metrics.predictedSeconds * 1e3);
  std::printf(", %.3f GFLOP (plan: %.3f)\n", metrics.flops * 1e-9,
              metrics.plannedFlops * 1e-9);
  // Far off, a prediction usually prices another machine than this one: a
  // target's nominal numbers, not this machine's calibrated ones.
  if (metrics.predictedSeconds && *metrics.predictedSeconds > 0) {
    const double ratio = metrics.makespanSeconds / *metrics.predictedSeconds;
    if (ratio > 2 || ratio < 0.5)
      std::printf("  (measured %.1fx the prediction: the plan was priced for "
                  "its target's numbers; for predictions that hold here, "
                  "compile for a target kvc-run calibrate measured on this "
                  "machine)\n",
                  ratio);
  }
  printLoads(*plan);
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
  printHostTraffic(metrics);
  printLayerReadiness(metrics.layerReadySeconds,
                      metrics.predictedLayerReadySeconds);
  if (run.firstTokenSeconds)
    std::printf("  first token %.3f ms: a forward pass of %lld tokens beside "
                "the restore, %.3f ms after its last layer\n",
                *run.firstTokenSeconds * 1e3, (long long)forwardTokens,
                (*run.firstTokenSeconds - metrics.makespanSeconds) * 1e3);
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
  if (!dumpPath.empty())
    std::printf("  K and V: %s\n", dumpPath.c_str());
  if (run.error)
    return reportVerification(*run.error,
                              planBound(*plan, metrics, setup.maxError));
  return Status::ok();
}

/// Restores a prompt with one plan (or Cake's walk), decodes greedily from
/// the restored cache, and prints the tokens (and text, for a model with a
/// tokenizer) beside what decoding after a full prefill gives.
Status generateCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(steps, args.integer("steps", 32));
  if (steps <= 0)
    return invalidArgument("--steps must be positive");
  const std::string tokenizerFile = tokenizerPath(args.get("model"));
  GenerateOptions options;
  options.steps = steps;
  // A server's request through the Connector, or a plan named by --bundle
  // (or Cake's walk) run through it.
  std::optional<ServedRequest> served;
  std::optional<RestoreSetup> setup;
  std::optional<PlanRun> run;
  if (!args.has("bundle") && !args.has("dynamic")) {
    if (args.has("plan"))
      return invalidArgument("--plan names a plan of --bundle");
    KVC_ASSIGN_OR_RETURN(request, serveRequest(args, 0, steps));
    served = std::move(request);
  } else {
    std::string planName = args.get("plan");
    LoadOptions load;
    load.dynamic = args.has("dynamic");
    KVC_ASSIGN_OR_RETURN(loaded, loadRestoreSetup(args, "joint"));
    setup = std::move(loaded);
    KVC_RETURN_IF_ERROR(args.checkUnused());
    KVC_ASSIGN_OR_RETURN(
        plan, selectPlan(*setup->bundle, setup->planSource, planName));
    KVC_ASSIGN_OR_RETURN(ran, runPlan(setup->request,
                                      {setup->bundle, plan->name}, load,
                                      /*verify=*/false, steps));
    if (load.dynamic) {
      printDynamicCake(ran.metrics, setup->request.tokens.size(),
                       ("plan " + plan->name).c_str());
    } else {
      std::printf("restored %zu tokens with plan %s: %.3f ms\n",
                  setup->request.tokens.size(), plan->name.c_str(),
                  ran.metrics.makespanSeconds * 1e3);
      printFallbacks(ran.metrics);
    }
    run = std::move(ran);
  }
  const LlamaModel &model = served ? *served->model : *setup->model;
  const std::vector<int32_t> &prompt =
      served ? served->tokens : setup->request.tokens;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!tokenizerFile.empty()) {
    KVC_ASSIGN_OR_RETURN(
        loaded, Tokenizer::load(tokenizerFile, model.config().vocabSize));
    tokenizer = std::move(loaded);
  }
  options.stop = tokenizer ? Tokenizer::kEos : -1;
  KVC_ASSIGN_OR_RETURN(
      restored, served ? generateAfterRestore(backend(), model, *served->cache,
                                              served->table, prompt, options)
                       : generateAfterRestore(backend(), model, *run->cache,
                                              run->table, prompt, options));
  KVC_ASSIGN_OR_RETURN(reference,
                       generateAfterPrefill(model, prompt, options));
  auto print = [&](const char *label, const std::vector<int32_t> &ids) {
    std::printf("%s:", label);
    for (int32_t id : ids)
      std::printf(" %d", id);
    std::printf("\n");
    if (tokenizer)
      std::printf("  \"%s%s\"\n", tokenizer->decode(prompt).c_str(),
                  tokenizer->decode(ids, prompt.back()).c_str());
  };
  print("after the restore", restored);
  size_t same = 0;
  while (same < restored.size() && same < reference.size() &&
         restored[same] == reference[same])
    ++same;
  if (same == restored.size() && same == reference.size()) {
    std::printf("after a full prefill: the same %zu tokens\n", same);
  } else {
    print("after a full prefill", reference);
    std::printf("the first %zu tokens agree\n", same);
  }
  return Status::ok();
}

/// The encoding of the stored KV Cake's walk loads: --codec, else the one
/// the store holds for the whole request.
StatusOr<CodecSpec> cakeEncoding(Args &args,
                                 const std::vector<PrefixMatch> &matches,
                                 size_t tokens) {
  if (args.has("codec"))
    return parseCodecSpec(args.get("codec"));
  std::vector<CodecSpec> whole;
  for (const PrefixMatch &match : matches)
    if (match.form == Form::KV && match.tokens == int64_t(tokens))
      whole.push_back(match.codec);
  if (whole.size() > 1)
    return invalidArgument("the store holds the request's KV with codecs " +
                           whole[0].str() + " and " + whole[1].str() +
                           ": pick one with --codec");
  return whole.empty() ? CodecSpec() : whole.front();
}

/// Restores with Cake's dynamic mode: compute from the front, KV loads from
/// the back of the store's chunks, meeting where this run's rates put them.
Status cakeCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(store, openStore(args, *model, TierAccess::Existing));
  KVC_ASSIGN_OR_RETURN(matches, matchPrefix(*store, tokens));
  KVC_ASSIGN_OR_RETURN(codec, cakeEncoding(args, matches, tokens.size()));
  KVC_ASSIGN_OR_RETURN(lanes, args.integer("io-lanes", 2));
  KVC_ASSIGN_OR_RETURN(predicted, args.integer("predicted-merge", -1));
  bool verify = args.has("verify");
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(
      into, destinationFor(backend(), *model, tokens, store.get(), {"store"}));
  KVC_ASSIGN_OR_RETURN(
      pools,
      backend().createPools({{poolName(Resource::Compute), 1},
                             {poolName(Resource::IO, "store"), int(lanes)}}));
  DynamicCakeOptions options;
  options.tier = "store";
  options.codec = codec;
  if (predicted >= 0)
    options.predictedMergeToken = predicted;
  KVC_ASSIGN_OR_RETURN(result,
                       restoreDynamicCake(*pools, into->target, options));
  printDynamicCake(result, tokens.size(), "compiler");
  if (!verify)
    return Status::ok();
  KVC_ASSIGN_OR_RETURN(error, restoreError(*model, tokens, *into->cache,
                                           into->table, backend()));
  // Cake computes from the front through every layer.
  return reportVerification(
      error, verifyBound({codec}, maxError, model->config().numLayers));
}

} // namespace kvc::run
