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
// serve the host-side workers); and --backend cpu|cuda: where the paged
// cache lives and restores compute (cuda where kvc-run was built with the
// CUDA toolkit and a GPU is present).
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

#include "Commands.h"
#include "ProfileCodecs.h"

#include "kvc/Host/Tools/Calibrate.h"
#include "kvc/Host/Session.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/Llama2c.h"
#include "kvc/Runtime/Save/SavePlan.h"
#include "kvc/Runtime/Save/Saver.h"
#include "kvc/Runtime/Store/StoreInspect.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unistd.h>

using namespace kvc;
using namespace kvc::run;

namespace {

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

Status importLlama2cCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(checkpoint, args.required("checkpoint"));
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  std::string tokenizer = args.get("tokenizer");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(config, importLlama2c(checkpoint, tokenizer, out));
  std::printf("wrote %s: %lld layers, hidden %lld, %lld heads (%lld KV), "
              "vocabulary %lld%s, float32\n",
              out.c_str(), (long long)config.numLayers,
              (long long)config.hiddenSize, (long long)config.numHeads,
              (long long)config.numKvHeads, (long long)config.vocabSize,
              tokenizer.empty() ? "" : " with its tokenizer");
  return Status::ok();
}

/// A context saved with several codecs keeps each: says which.
Status reportOtherEncodings(ChunkStore &store,
                            const std::vector<int32_t> &tokens,
                            const SaveOptions &saved) {
  for (Form form : saved.forms) {
    KVC_ASSIGN_OR_RETURN(
        extents, store.stored(tokens.data(), int64_t(tokens.size()), form));
    for (const StoredExtent &extent : extents)
      if (extent.codec != saved.codec)
        std::printf("the store also holds %s of tokens 0 to %lld with codec "
                    "%s\n",
                    name(form), (long long)extent.tokens,
                    extent.codec.str().c_str());
  }
  return Status::ok();
}

/// SIGINT and SIGTERM, while one lives, stop a save (SaveOptions::cancel)
/// instead of the process: the save ends as a failed one and takes back what
/// it wrote. A second signal acts as it would without this (the handler is
/// reset by the first).
class InterruptsStopTheSave {
public:
  InterruptsStopTheSave() {
    interrupted().store(false);
    struct sigaction action = {};
    action.sa_handler = [](int) { interrupted().store(true); };
    action.sa_flags = SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &oldInt_);
    sigaction(SIGTERM, &action, &oldTerm_);
  }
  ~InterruptsStopTheSave() {
    sigaction(SIGINT, &oldInt_, nullptr);
    sigaction(SIGTERM, &oldTerm_, nullptr);
  }
  static std::atomic<bool> &interrupted() {
    static std::atomic<bool> flag{false};
    return flag;
  }

private:
  struct sigaction oldInt_ = {}, oldTerm_ = {};
};

Status saveCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
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
  if (options.forms.empty())
    return invalidArgument("--forms names no form (expected kv, hidden or "
                           "kv,hidden)");
  KVC_ASSIGN_OR_RETURN(codec, parseCodecSpec(args.get("codec", "raw")));
  options.codec = codec;
  KVC_ASSIGN_OR_RETURN(writers, args.integer("writers", options.writers));
  KVC_ASSIGN_OR_RETURN(bufferMb, args.integer("buffer-mb", 256));
  if (writers <= 0 || bufferMb <= 0)
    return invalidArgument("--writers and --buffer-mb must be positive");
  KVC_RETURN_IF_ERROR(checkWorkers("--writers", writers));
  options.writers = int(writers);
  options.bufferBytes = size_t(bufferMb) << 20;
  options.dryRun = args.has("dry-run");
  options.device = &backend();
  KVC_ASSIGN_OR_RETURN(prefillTokens, args.integer("prefill-tokens", 0));
  options.prefillTokens = prefillTokens;
  Progress progress;
  options.progress = [&](int64_t done, int64_t total) {
    progress.show("save: prefilled " + std::to_string(done) + " of " +
                  std::to_string(total) + " tokens");
  };
  InterruptsStopTheSave interrupts;
  options.cancel = &InterruptsStopTheSave::interrupted();
  KVC_ASSIGN_OR_RETURN(store, openStore(args, *model, TierAccess::Create));
  KVC_ASSIGN_OR_RETURN(tracePath, planTracePath(args));
  if (args.has("bundle")) {
    // A compiled save plan decides the forms and the encoding.
    if (args.has("forms") || args.has("codec"))
      return invalidArgument("--bundle's save plan chooses the forms and the "
                             "codec: drop --forms and --codec");
    const std::string path = args.get("bundle");
    KVC_ASSIGN_OR_RETURN(bundle, readBundleFor(path, *model));
    KVC_ASSIGN_OR_RETURN(plan, selectPlan(bundle, path, args.get("plan")));
    KVC_ASSIGN_OR_RETURN(
        planned,
        saveOptionsFor(*plan, *store, int64_t(tokens.size()), options));
    options = std::move(planned);
    // The executor runs the plan beside the prefill, each gather taking
    // its object as soon as the prefill computed it (where the backend
    // launches the bundle's save kernels, in its cache).
    KVC_RETURN_IF_ERROR(args.checkUnused());
    std::map<std::string, ChunkStore *> stores;
    for (const BundleTask &task : plan->tasks)
      for (const BundleStep &step : task.steps)
        if (step.kind == StepKind::Store)
          stores[step.tier] = store.get();
    SaveRunOptions run;
    run.tracePath = tracePath;
    run.kernels = &bundle.kernels;
    KVC_ASSIGN_OR_RETURN(metrics,
                         saveDuringPrefill(backend(), *model, tokens, *plan,
                                           stores, options, run));
    std::printf("saved %zu tokens of model %.16s to %s with codec %s: %lld "
                "objects written, %lld already stored; plan %s: snapshots "
                "done at %.3f s (they follow the prefill), total %.3f s",
                tokens.size(), model->fingerprint().c_str(),
                store->tier().url().c_str(), options.codec.str().c_str(),
                (long long)metrics.written, (long long)metrics.skipped,
                plan->name.c_str(), metrics.snapshotSeconds,
                metrics.makespanSeconds);
    if (metrics.predictedSeconds)
      std::printf(" (predicted %.3f s)", *metrics.predictedSeconds);
    std::printf("\n");
    printKernels(metrics);
    return reportOtherEncodings(*store, tokens, options);
  }
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(stats, saveContext(*model, *store, tokens, options));
  std::printf("saved %zu tokens of model %.16s to %s with codec %s: %lld "
              "objects written, %lld already stored; prefill %.3f s, total "
              "%.3f s, waited %.3f s for buffers, peak buffers %.1f MiB\n",
              tokens.size(), model->fingerprint().c_str(), store->tier().url().c_str(),
              options.codec.str().c_str(), (long long)stats.written,
              (long long)stats.skipped, stats.prefillSeconds,
              stats.totalSeconds, stats.stallSeconds,
              double(stats.peakBufferedBytes) / (1 << 20));
  return reportOtherEncodings(*store, tokens, options);
}

Status profileCodecs(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  KVC_ASSIGN_OR_RETURN(seed, args.integer("seed", 0));
  KVC_ASSIGN_OR_RETURN(decodeSteps, args.integer("decode-steps", 8));
  if (decodeSteps < 0)
    return invalidArgument("--decode-steps: expected 0 or more");
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  if (!args.has("tokens") && !args.has("prompt"))
    args.setDefault("random-tokens", "1024");
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  return runCodecProfile(*model, tokens, uint64_t(seed), decodeSteps, out);
}

/// Validates a plan bundle and summarizes each plan (its tasks per resource
/// and lanes, staging slots, predicted makespan, what it moves and the tasks
/// that launch generated kernels) and each kernel of its table.
/// kvc-run store stat|verify|gc: every object of a store read and checked.
Status storeCommand(Args &args, bool list, bool removeFailed) {
  KVC_ASSIGN_OR_RETURN(url, args.required("store"));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  KVC_ASSIGN_OR_RETURN(tier, openTier(url, TierAccess::Existing));
  KVC_ASSIGN_OR_RETURN(report, inspectStore(*tier, removeFailed));
  auto mb = [](int64_t bytes) { return double(bytes) * 1e-6; };
  int64_t objects = 0, bytes = 0;
  for (const auto &[model, sizes] : report.models) {
    objects += sizes.objects;
    bytes += sizes.bytes;
  }
  std::printf("%s: %lld objects, %.3f MB; %lld layout records\n",
              tier->url().c_str(), (long long)objects, mb(bytes),
              (long long)report.layouts.objects);
  if (list)
    for (const auto &[model, sizes] : report.models) {
      std::printf("  model %s: %lld objects, %.3f MB\n",
                  model.substr(0, 16).c_str(), (long long)sizes.objects,
                  mb(sizes.bytes));
      for (const auto &[encoding, each] : report.encodings.at(model))
        std::printf("    %-24s %lld objects, %.3f MB\n", encoding.c_str(),
                    (long long)each.objects, mb(each.bytes));
    }
  for (const StoreReport::Failed &failed : report.failed)
    std::printf("  fails its checks: %s: %s\n", failed.name.c_str(),
                failed.why.c_str());
  if (removeFailed)
    std::printf("removed %lld objects that fail their checks\n",
                (long long)report.removed);
  else if (!report.failed.empty())
    return dataLoss(std::to_string(report.failed.size()) +
                    " objects fail their checks (kvc-run store gc removes "
                    "them)");
  return Status::ok();
}

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
    if (plan.prefillStep)
      std::printf(", beside a prefill of %lld tokens a step",
                  (long long)*plan.prefillStep);
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
    printLoads(plan);
    // Fused tasks, and those of them that launch generated kernels.
    std::set<std::string> entries;
    int64_t fused = 0, launching = 0;
    for (const BundleTask &task : plan.tasks) {
      fused += !task.kernel.empty();
      launching += !task.entry.empty();
      for (const std::string *entry : {&task.entry, &task.prologue})
        if (!entry->empty())
          entries.insert(*entry);
    }
    if (fused)
      std::printf("  %-8s %lld of %lld fused tasks launch %zu generated "
                  "kernels\n",
                  "kernels", (long long)launching, (long long)fused,
                  entries.size());
  }
  for (const BundleKernel &kernel : bundle.kernels)
    std::printf("kernel %s: %s for %s, grid %lldx%lldx%lld of %lld threads "
                "a chunk, %lld payload bytes, %zu bytes of PTX\n",
                kernel.name.c_str(), bundleKernelKindName(kernel.kind),
                kernel.target.c_str(), (long long)kernel.grid[0],
                (long long)kernel.grid[1], (long long)kernel.grid[2],
                (long long)kernel.block[0], (long long)kernel.payloadBytes,
                kernel.binary.size());
  return Status::ok();
}

/// Measures this machine into a target description the planner accepts.
Status calibrateCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(basePath, args.required("base"));
  KVC_ASSIGN_OR_RETURN(out, args.required("out"));
  const char *tmp = std::getenv("TMPDIR");
  std::string scratch = args.get("scratch", tmp && *tmp ? tmp : "/tmp");
  const std::string remote = args.get("remote"),
                    remoteTier = args.get("remote-tier");
  if (remote.empty() && !remoteTier.empty())
    return invalidArgument("--remote-tier names the tier --remote measures");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  // Where the target goes is checked before minutes of measuring.
  const std::filesystem::path outDir =
      std::filesystem::absolute(out).parent_path();
  if (::access(outDir.c_str(), W_OK | X_OK) != 0)
    return invalidArgument("--out " + out + ": cannot write to " +
                           outDir.string() + ": " + std::strerror(errno));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(base, loadTargetDesc(basePath));
  std::map<std::string, std::string> remotes;
  if (!remote.empty()) {
    std::string name = remoteTier;
    for (const TierDesc &tier : base.tiers)
      if (name.empty() && tier.kind == TierDesc::Kind::Remote)
        name = tier.name;
    if (name.empty())
      return invalidArgument("--remote: " + basePath + " has no remote tier");
    remotes[name] = remote;
  }
  KVC_ASSIGN_OR_RETURN(target, calibrate(backend(), *model, base, scratch,
                                         stdout, remotes));
  std::ofstream file(out);
  file << printTargetDesc(target);
  if (!file)
    return notFound(out + ": cannot write the target description");
  std::printf("wrote %s\n", out.c_str());
  return Status::ok();
}

} // namespace

namespace kvc::run {

std::vector<Option> operator+(std::vector<Option> a,
                              const std::vector<Option> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<Command> &commands() {
  // Every command takes --help; those that compute take the CPU's GEMM
  // threads; those that run on a backend take the backend's options too.
  static const std::vector<Option> help = {
      {"help", "", "print this and exit"}};
  static const std::vector<Option> cpu =
      std::vector<Option>{
          {"compute-threads", "N",
           "threads of the CPU backend's GEMMs, at most the cores (default "
           "1)"}} +
      help;
  static const std::vector<Option> common =
      std::vector<Option>{
          {"backend", "NAME",
           "cpu (default) or cuda: where the paged cache lives and restores "
           "compute"},
          {"gemm", "PRECISION",
           "the cuda backend's GEMM inputs, f32 or bf16 (default the model's: "
           "f32 for f32 checkpoints, else bf16)"}} +
      cpu;
  // What save and restore must agree on: the request and the store layout.
  static const std::vector<Option> request = {
      {"model", "DIR", "the model directory (config.json + safetensors)"},
      {"tokens", "FILE", "the request: whitespace-separated token ids"},
      {"random-tokens", "N", "or N random tokens (at most the context)"},
      {"prompt", "TEXT", "or text, for a model with a tokenizer.bin"},
      {"seed", "S", "the random tokens' seed (default 0)"}};
  static const std::vector<Option> store = {
      {"store", "URL",
       "mem://, file:///DIR or redis://HOST:PORT[/DB], "
       "?gbps=N throttles"},
      {"chunk-tokens", "N",
       "tokens per stored object (default 256; save and cake only: the "
       "Connector's readers read the store's)"},
      {"layer-group", "N",
       "layers per stored object (default 4; save and cake only)"},
      {"tenant", "SALT",
       "the tenant salt of the keys (default none; as saved)"}};
  static const std::vector<Option> plan = {
      {"bundle", "FILE", "plans compiled by kvc-opt (or --strategy)"},
      {"codec-profile", "FILE",
       "--strategy's codec profile (profile-codecs; default the estimate)"},
      {"max-kl", "X",
       "--strategy's quality budget: next-token KL divergence (nats) a lossy "
       "source may add, per --codec-profile"},
      {"strategy", "[LIST]",
       "plan in process: compute, kv, hidden, cake, "
       "hcache, joint"},
      {"target", "FILE", "the target --strategy plans for"},
      {"tier", "NAME",
       "the target's tier for the store (default the first "
       "of its kind)"},
      {"staging-mib", "N", "--strategy's staging budget (default 256)"},
      {"layer-wise", "",
       "--strategy's loads layer by layer, for a forward pass that runs "
       "beside the restore"},
      {"gpu-chip", "ARCH",
       "--strategy's generated kernels, as PTX for this GPU (sm_90: H100, "
       "H200; none: no kernels; default the target's chip with --backend "
       "cuda, none with cpu)"},
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
           help,
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
               {"prefill-tokens", "N",
                "tokens per prefill step, whole chunks (default one chunk)"},
               {"bundle", "FILE",
                "a compiled save plan (kvc-save-pipeline) choosing the "
                "forms and codec"},
               {"plan", "NAME", "the bundle's plan (default its only one)"},
               {"trace", "FILE", "write the plan's Chrome trace"}} +
           common,
       saveCommand},
      {"import-llama2c", "converts a llama2.c checkpoint to a model directory",
       std::vector<Option>{
           {"checkpoint", "FILE", "the llama2.c .bin"},
           {"tokenizer", "FILE", "its tokenizer .bin (optional)"},
           {"out", "DIR", "where to write the model"}} +
           help,
       importLlama2cCommand},
      {"profile-codecs", "measures every codec composition on the model's KV",
       request +
           std::vector<Option>{
               {"decode-steps", "N",
                "decode steps after each of 4 cuts for the next-token KL "
                "and agreement (default 8; 0: none)"},
               {"out", "FILE", "the profile (JSON)"}} +
           cpu,
       profileCodecs},
      {"inspect-bundle", "prints a plan bundle's plans and kernels",
       std::vector<Option>{{"bundle", "FILE", "the bundle"}} + help,
       inspectBundle},
      {"restore",
       "restores a request with one plan through the Connector and reports "
       "it",
       request + store + plan +
           std::vector<Option>{
               {"plan", "NAME", "the bundle's plan (default its first)"},
               {"verify", "", "check the cache against a full prefill"},
               {"dynamic", "", "run a Cake-shaped plan as Cake's walk"},
               {"forward-tokens", "N",
                "run a server's forward pass of N tokens after the request "
                "beside the restore, each layer once restored, and report "
                "its first token (--strategy plans for it)"},
               {"trace", "FILE", "write a Chrome trace"},
               {"dump-kv", "FILE",
                "write the restored K and V (safetensors) for "
                "scripts/hf-reference.py --kv"}} +
           common,
       restoreCommand},
      {"generate",
       "a server's request through the Connector (or --bundle's plan, or "
       "Cake's walk), then decodes greedily from the cache",
       request + store + plan +
           std::vector<Option>{
               {"policy", "P",
                "cheapest (default), always or never: when the Connector "
                "loads"},
               {"plan", "NAME", "the bundle's plan (default its first)"},
               {"steps", "N", "tokens to generate (default 32)"},
               {"dynamic", "", "run a Cake-shaped plan as Cake's walk"}} +
           common,
       generateCommand},
      {"compare", "restores with every plan, verifies and tables them",
       request + store + plan +
           std::vector<Option>{
               {"repeat", "N", "runs per plan, round robin (default 1)"},
               {"trace", "PREFIX",
                "write each plan's fastest run as a Chrome trace, "
                "PREFIX-PLAN.json"},
               {"json", "FILE", "write the table as JSON too"}} +
           common,
       compareCommand},
      {"store stat", "what a store holds, per model and encoding",
       std::vector<Option>{{"store", "URL", "the store"}} + help,
       [](Args &args) { return storeCommand(args, true, false); }},
      {"store verify",
       "reads every object of a store and checks it (fails if one fails)",
       std::vector<Option>{{"store", "URL", "the store"}} + help,
       [](Args &args) { return storeCommand(args, false, false); }},
      {"store gc", "removes the objects of a store that fail their checks",
       std::vector<Option>{{"store", "URL", "the store"}} + help,
       [](Args &args) { return storeCommand(args, false, true); }},
      {"serve",
       "a server's request through the Connector: lookup, decision, load, "
       "the server's prefill of the rest",
       request + store +
           std::vector<Option>{
               {"target", "FILE", "the machine decisions are priced for"},
               {"tier", "NAME",
                "the target's tier the store is (default the first of its "
                "kind)"},
               {"strategy", "LIST",
                "strategies to choose among (default joint: all of them)"},
               {"policy", "P",
                "cheapest (default), always or never: when to load"},
               {"on-device", "N",
                "tokens the server holds already (default 0)"},
               {"codec-profile", "FILE", "a measured codec profile"},
               {"max-kl", "X",
                "the quality budget: next-token KL divergence (nats) a "
                "lossy encoding may add, per --codec-profile"},
               {"gpu-chip", "ARCH",
                "generate the plans' kernels for ARCH (default the target's "
                "chip; none: none)"},
               {"verify", "", "check the cache against a full prefill"},
               {"max-error", "X",
                "verification bound (default what the stored codecs "
                "allow)"}} +
           common,
       serveCommand},
      {"cake", "restores with Cake's dynamic walk over what the store holds",
       request + store +
           std::vector<Option>{
               {"io-lanes", "N", "loading lanes (default 2)"},
               {"codec", "SPEC",
                "the stored KV encoding to load (default the one stored)"},
               {"predicted-merge", "T", "a merge point to report beside"},
               {"verify", "", "check the cache against a full prefill"},
               {"max-error", "X",
                "verification bound (default bf16 "
                "rounding)"}} +
           common,
       cakeCommand},
      {"transfer-send",
       "prefills a request and streams its KV to a transfer-recv",
       request +
           std::vector<Option>{
               {"to", "HOST:PORT", "the receiver's address"},
               {"codec", "SPEC", "the chunks' encoding (default raw)"},
               {"codecs", "SPEC,...",
                "let KVServe's controller choose each chunk's encoding "
                "among these, most accurate first"},
               {"slo-ms", "N", "the controller's deadline for the transfer"},
               {"bundle", "FILE",
                "run a compiled transfer's send plan: its encoding, "
                "order and lanes"},
               {"plan", "NAME", "the bundle's plan (default its send plan)"},
               {"trace", "FILE", "write the send plan's Chrome trace"},
               {"chunk-tokens", "N", "tokens per chunk (default 256)"},
               {"layer-group", "N", "layers per chunk (default 4)"},
               {"prefill-tokens", "N",
                "tokens per prefill step, whole chunks; a step of several "
                "streams layer by layer (default one chunk; the whole "
                "request for a layer-wise --bundle)"},
               {"tenant", "SALT", "the tenant salt of the keys (as received)"},
               {"gbs", "N", "emulate a link of N GB/s (gigabytes per second)"},
               {"timeout-ms", "N",
                "wait at most this for the receiver (default 10000)"}} +
           common,
       transferSendCommand},
      {"transfer-recv",
       "receives a request's KV from a transfer-send into a paged cache",
       request +
           std::vector<Option>{
               {"listen", "HOST:PORT",
                "where to listen (default 127.0.0.1:0, any port)"},
               {"port-file", "FILE", "write the port listened on here"},
               {"tenant", "SALT", "the tenant salt of the keys (as sent)"},
               {"decoders", "N",
                "threads decoding chunks (default 2; a plan has its lanes)"},
               {"bundle", "FILE",
                "run a compiled transfer's receive plan: its layout, "
                "encoding and lanes"},
               {"plan", "NAME", "the bundle's plan (default its receive plan)"},
               {"trace", "FILE", "write the receive plan's Chrome trace"},
               {"timeout-ms", "N",
                "wait at most this for the sender and each message "
                "(default 10000)"},
               {"verify", "", "check the cache against a full prefill"},
               {"max-error", "X",
                "verification bound (default what the received codecs "
                "allow)"}} +
           common,
       transferRecvCommand},
      {"grid",
       "the main job in one process: calibrate, save each context, compare "
       "every strategy at each link",
       std::vector<Option>{
           {"model", "DIR", "the model, read once"},
           {"target", "FILE",
            "the target to plan for (with --calibrate: to start from)"},
           {"calibrate", "", "calibrate this machine first and plan for it"},
           {"tokens", "LIST", "contexts, e.g. 8192,32768 (default 8192)"},
           {"links", "LIST",
            "link rates in Gbps (gigabits), e.g. 7,32,100 (default 7)"},
           {"repeat", "N", "runs per plan and cell (default 2)"},
           {"prefill-tokens", "N",
            "the saves' tokens per prefill step (as save's)"},
           {"work", "DIR", "where the contexts are saved (reused)"},
           {"out", "PREFIX",
            "PREFIX.md, PREFIX.json, and each step's output"}} +
           common,
       gridCommand},
      {"calibrate", "measures this machine and writes a target",
       std::vector<Option>{
           {"model", "DIR", "the model to time"},
           {"base", "FILE", "the target to start from"},
           {"out", "FILE", "the calibrated target"},
           {"scratch", "DIR",
            "an existing directory where disk tiers are timed (default "
            "$TMPDIR or /tmp)"},
           {"remote", "URL",
            "a store (redis://, redis-cluster://) to time as a remote tier"},
           {"remote-tier", "NAME",
            "the remote tier it is (default the target's first)"}} +
           common,
       calibrateCommand},
  };
  return all;
}

} // namespace kvc::run

namespace {

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
  int first = 2;
  // Commands of two words: "store stat", "store verify", "store gc".
  if (name == "store" && argc > 2 && argv[2][0] != '-') {
    name += std::string(" ") + argv[2];
    first = 3;
  }
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("kvc-run %s (plan bundles up to version %lld, chunk format "
                "version %d)\n",
                KVC_VERSION, (long long)kPlanBundleVersion,
                int(kChunkFormatVersion));
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
      Args::parse(argc, argv, first, command->name, command->options);
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
    status = selectBackend(args->get("backend", "cpu"), args->get("gemm"));
  // Timings on the CPU backend depend on OpenBLAS's kernels: say so once
  // where it picked its generic ones on a CPU with wider vectors.
  if (status.isOk() && args->get("backend", "cpu") == "cpu" &&
      (name == "calibrate" || name == "compare"))
    if (std::optional<std::string> slow = slowBlasWarning())
      std::fprintf(stderr, "kvc-run %s: warning: %s\n", name.c_str(),
                   slow->c_str());
  if (status.isOk())
    status = command->run(*args);
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-run %s: %s\n", name.c_str(),
                 status.toString().c_str());
    return 1;
  }
  return 0;
}
