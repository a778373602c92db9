//===- TransferCommands.cpp - kvc-run transfer-send and transfer-recv -----===//
//
// The two ends of a transfer (kvc/Runtime/Net/Transfer.h) as processes: a
// prefill node that computes a request and streams its KV, and a decode
// node that receives it into a paged cache, recomputing what did not
// arrive, and can verify it against its own full prefill.
//
//===----------------------------------------------------------------------===//

#include "Commands.h"

#include "kvc/Host/Session.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Base/Threads.h"
#include "kvc/Runtime/Net/CodecController.h"
#include "kvc/Runtime/Net/Transfer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvc::run {

using namespace kvc::host;

namespace {

/// What both ends must agree on besides the model: the tenant, and the
/// sender's layout (the receiver takes it from the hello).
ChunkObjects localObjects(Args &args, const LlamaModel &model,
                          StoreLayout layout = {}) {
  return ChunkObjects(model.config(), model.fingerprint(), args.get("tenant"),
                      layout);
}

StatusOr<Milliseconds> timeoutOption(Args &args) {
  KVC_ASSIGN_OR_RETURN(ms, args.integer("timeout-ms", 10000));
  if (ms <= 0)
    return invalidArgument("--timeout-ms must be positive");
  return Milliseconds(ms);
}

std::string perCodec(const std::map<std::string, int64_t> &counts) {
  std::string out;
  for (const auto &[codec, count] : counts)
    out += (out.empty() ? "" : ", ") + codec + " " + std::to_string(count);
  return out.empty() ? "none" : out;
}

/// Writes `text` to `path` whole (a reader never sees part of it).
Status writeAtomically(const std::string &path, const std::string &text) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << text << "\n";
    if (!out.flush())
      return unavailable("cannot write " + partial);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    return unavailable("cannot write " + path);
  return Status::ok();
}

/// A plan of a bundle, with the bundle's kernel table.
struct CompiledPlan {
  BundlePlan plan;
  std::vector<BundleKernel> kernels;
};

/// The plan of `--bundle` whose objects end in `endpoint` steps: `--plan`,
/// or the only such plan (kvc-expand makes a kvc.transfer a send and a
/// receive plan); none without `--bundle`.
StatusOr<std::optional<CompiledPlan>>
transferPlan(Args &args, const LlamaModel &model, StepKind endpoint) {
  if (!args.has("bundle"))
    return std::optional<CompiledPlan>();
  const std::string path = args.get("bundle");
  KVC_ASSIGN_OR_RETURN(bundle, readBundleFor(path, model));
  if (args.has("plan")) {
    KVC_ASSIGN_OR_RETURN(plan, selectPlan(bundle, path, args.get("plan")));
    return std::optional<CompiledPlan>({*plan, bundle.kernels});
  }
  std::optional<BundlePlan> found;
  for (const BundlePlan &plan : bundle.plans)
    for (const BundleTask &task : plan.tasks)
      if (std::any_of(
              task.steps.begin(), task.steps.end(),
              [&](const BundleStep &s) { return s.kind == endpoint; })) {
        if (found && found->name != plan.name)
          return invalidArgument(
              path + " has several plans that " +
              (endpoint == StepKind::Send ? "send" : "receive") + " (" +
              found->name + ", " + plan.name + "): choose one with --plan");
        found = plan;
        break;
      }
  if (!found)
    return invalidArgument(path + " has no plan that " +
                           (endpoint == StepKind::Send ? "sends" : "receives"));
  return std::optional<CompiledPlan>({std::move(*found), bundle.kernels});
}

/// KVServe's controller over `--codecs` (most accurate first) under
/// `--slo-ms`, or none when the chunks go out in one `--codec`.
StatusOr<std::unique_ptr<CodecController>>
codecController(Args &args, const ChunkObjects &objects,
                const std::vector<int32_t> &tokens) {
  KVC_ASSIGN_OR_RETURN(sloMs, args.number("slo-ms"));
  if (!args.has("codecs")) {
    if (sloMs)
      return invalidArgument("--slo-ms is the controller's: give --codecs");
    return std::unique_ptr<CodecController>();
  }
  if (args.has("codec"))
    return invalidArgument("--codec sends one encoding, --codecs lets the "
                           "controller choose among several: give one");
  CodecControllerOptions options;
  std::stringstream list(args.get("codecs"));
  for (std::string spec; std::getline(list, spec, ',');) {
    KVC_ASSIGN_OR_RETURN(codec, parseCodecSpec(spec));
    options.candidates.push_back(codec);
  }
  if (options.candidates.empty())
    return invalidArgument("--codecs expects codecs separated by commas");
  if (sloMs) {
    if (!(*sloMs > 0))
      return invalidArgument("--slo-ms expects a positive number");
    options.sloSeconds = *sloMs * 1e-3;
    options.chunks = int64_t(
        objects
            .refs(tokens.data(), int64_t(tokens.size()), Form::KV, CodecSpec())
            .size());
  }
  return std::make_unique<CodecController>(options);
}

} // namespace

Status transferSendCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(to, args.required("to"));
  std::string host;
  int port = 0;
  KVC_RETURN_IF_ERROR(parseHostPort(to, host, port).withContext("--to"));
  SendOptions options;
  options.device = &backend();
  KVC_ASSIGN_OR_RETURN(codec, parseCodecSpec(args.get("codec", "raw")));
  options.codec = codec;
  KVC_ASSIGN_OR_RETURN(timeout, timeoutOption(args));
  options.timeout = timeout;
  KVC_ASSIGN_OR_RETURN(layout, storeLayout(args));
  KVC_ASSIGN_OR_RETURN(prefillTokens, args.integer("prefill-tokens", 0));
  options.prefillTokens = prefillTokens;
  KVC_ASSIGN_OR_RETURN(gbs, args.number("gbs"));
  if (gbs && !(*gbs > 0))
    return invalidArgument("--gbs expects a positive number (GB/s)");
  ChunkObjects objects = localObjects(args, *model, layout);
  KVC_ASSIGN_OR_RETURN(controller, codecController(args, objects, tokens));
  options.chooser = controller.get();
  KVC_ASSIGN_OR_RETURN(plan, transferPlan(args, *model, StepKind::Send));
  if (plan) {
    if (args.has("codec") || controller)
      return invalidArgument("--bundle's plan chooses the codec: drop "
                             "--codec and --codecs");
    KVC_ASSIGN_OR_RETURN(
        planned,
        sendOptionsFor(plan->plan, objects, int64_t(tokens.size()), options));
    options = planned;
    options.kernels = &plan->kernels;
  }
  // The send plan: --bundle's, or the one the sender makes for the layout.
  options.tracePath = args.get("trace");
  KVC_RETURN_IF_ERROR(args.checkUnused());

  KVC_ASSIGN_OR_RETURN(link, connectUcx(host, port, timeout));
  if (gbs)
    link = std::make_unique<ThrottledLink>(std::move(link), *gbs);
  KVC_ASSIGN_OR_RETURN(stats,
                       sendContext(*model, objects, tokens, *link, options));
  std::printf("sent %zu tokens of model %.16s to %s: %lld chunks (%s), "
              "%.3f MB; prefill %.3f s, total %.3f s\n",
              tokens.size(), model->fingerprint().c_str(),
              link->describe().c_str(), (long long)stats.chunks,
              perCodec(stats.chunksPerCodec).c_str(),
              double(stats.bytes) * 1e-6, stats.stream.prefillSeconds,
              stats.stream.totalSeconds);
  if (stats.planRun)
    printKernels(*stats.planRun);
  std::printf("the receiver wrote %lld chunks as sent and recomputed %lld\n",
              (long long)stats.received, (long long)stats.recomputed);
  if (controller)
    std::printf("the controller measured the link at %.3f GB/s and %.0f us "
                "per message\n",
                controller->linkGBs(), controller->messageSeconds() * 1e6);
  return Status::ok();
}

Status transferRecvCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  std::string host;
  int port = 0;
  KVC_RETURN_IF_ERROR(
      parseHostPort(args.get("listen", "127.0.0.1:0"), host, port)
          .withContext("--listen"));
  const std::string portFile = args.get("port-file");
  ReceiveOptions options;
  KVC_ASSIGN_OR_RETURN(timeout, timeoutOption(args));
  options.timeout = timeout;
  KVC_ASSIGN_OR_RETURN(decoders, args.integer("decoders", options.decoders));
  KVC_RETURN_IF_ERROR(checkWorkers("--decoders", decoders));
  options.decoders = int(decoders);
  const bool verify = args.has("verify");
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  ChunkObjects local = localObjects(args, *model);
  KVC_ASSIGN_OR_RETURN(plan, transferPlan(args, *model, StepKind::Recv));
  if (plan) {
    if (args.has("decoders"))
      return invalidArgument("--bundle's plan runs on its own lanes: drop "
                             "--decoders");
    KVC_ASSIGN_OR_RETURN(
        planned,
        receiveOptionsFor(plan->plan, local, int64_t(tokens.size()), options));
    options = planned;
    options.kernels = &plan->kernels;
  }
  KVC_ASSIGN_OR_RETURN(tracePath, planTracePath(args));
  options.tracePath = tracePath;
  KVC_RETURN_IF_ERROR(args.checkUnused());

  KVC_ASSIGN_OR_RETURN(listener, listenUcx(host, port));
  if (!portFile.empty())
    KVC_RETURN_IF_ERROR(
        writeAtomically(portFile, std::to_string(listener->port())));
  KVC_ASSIGN_OR_RETURN(link, listener->accept(timeout));
  KVC_ASSIGN_OR_RETURN(into,
                       destinationFor(backend(), *model, tokens, nullptr, {}));
  KVC_ASSIGN_OR_RETURN(metrics,
                       receiveContext(*link, local, into->target, options));
  std::printf("received %zu tokens from %s: %lld of %lld chunks (%s), %.3f MB "
              "in %.3f s (stream %.3f s, recompute %.3f s)\n",
              tokens.size(), link->describe().c_str(),
              (long long)metrics.received, (long long)metrics.chunks,
              perCodec(metrics.chunksPerCodec).c_str(),
              double(metrics.bytes) * 1e-6, metrics.seconds,
              metrics.streamSeconds, metrics.fallbackSeconds);
  // A receive plan's predictions count from the sender's start, as the
  // measurements count from its hello (kvc-estimate prices the sender's
  // prefill, encoding and link before each recv).
  printLayerReadiness(metrics.layerReadySeconds,
                      metrics.planRun
                          ? metrics.planRun->predictedLayerReadySeconds
                          : std::vector<double>());
  if (metrics.planRun)
    printKernels(*metrics.planRun);
  if (!metrics.lost.empty())
    std::printf("  the stream broke off: %s\n", metrics.lost.c_str());
  for (const std::string &why : metrics.rejected)
    std::printf("  rejected a message: %s\n", why.c_str());
  for (const std::string &line : metrics.fallbacks)
    std::printf("  %s\n", line.c_str());
  if (!verify)
    return Status::ok();
  std::vector<CodecSpec> codecs;
  for (const auto &[name, count] : metrics.chunksPerCodec) {
    KVC_ASSIGN_OR_RETURN(codec, parseCodecSpec(name));
    codecs.push_back(codec);
  }
  KVC_ASSIGN_OR_RETURN(error, restoreError(*model, tokens, *into->cache,
                                           into->table, backend()));
  return reportVerification(error, verifyBound(codecs, maxError));
}

} // namespace kvc::run
