//===- ServeCommand.cpp - kvc-run serve: a request through the Connector --===//
//
// What a server does with one request, through host::Connector: look its
// prefix up, decide (and say why), load what was decided into a paged cache
// of the backend's while the server's own prefill waits layer by layer,
// then prefill the rest, and optionally verify the cache against a full
// prefill. With --on-device N, the server holds the first N tokens itself
// (prefilled first, never rewritten). `generate` decodes from the same
// request's cache (serveRequest).
//
//===----------------------------------------------------------------------===//

#include "Commands.h"

#include "kvc/Host/Connector.h"
#include "kvc/Host/ConnectorSpec.h"
#include "kvc/Runtime/Base/Clock.h"

#include <cstdio>

namespace kvc::run {

using namespace kvc::host;

StatusOr<ServedRequest> serveRequest(Args &args, int64_t onDevice,
                                     int64_t room) {
  ServedRequest served;
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(model, loadModel(modelDir));
  KVC_ASSIGN_OR_RETURN(tokens, requestTokens(args, model->config()));
  KVC_ASSIGN_OR_RETURN(url, args.required("store"));
  KVC_ASSIGN_OR_RETURN(targetPath, args.required("target"));
  KVC_ASSIGN_OR_RETURN(target, loadTargetDesc(targetPath));
  KVC_RETURN_IF_ERROR(refuseLayoutOptions(args));
  ConnectorSpec spec;
  spec.stores = {{url, args.get("tier")}};
  spec.tenant = args.get("tenant");
  spec.codecProfile = args.get("codec-profile");
  spec.gpuChip = args.get("gpu-chip");
  KVC_ASSIGN_OR_RETURN(maxKl, maxKlOption(args));
  spec.maxKl = maxKl;
  spec.strategies = args.get("strategy", "joint");
  spec.policy = args.get("policy", "cheapest");
  KVC_ASSIGN_OR_RETURN(options,
                       connectorOptions(spec, *model, backend(),
                                        std::move(target), compilerHook()));
  KVC_RETURN_IF_ERROR(args.checkUnused());
  const int64_t n = int64_t(tokens.size());
  if (onDevice < 0 || onDevice >= n)
    return invalidArgument("--on-device " + std::to_string(onDevice) +
                           " of a request of " + std::to_string(n) +
                           " tokens (the server computes at least its last)");

  KVC_ASSIGN_OR_RETURN(connector, Connector::create(options));
  const ModelConfig &config = model->config();
  KVC_ASSIGN_OR_RETURN(cached, backend().cacheFor(config, n + room));
  auto [cache, table] = std::move(cached);
  PagedKVCache *view = cache.get();
  KVC_RETURN_IF_ERROR(connector->registerCaches(std::move(cache)));
  std::unique_ptr<ModelRunner> runner = backend().createRunner(*model);
  auto prefill = [&](int64_t from, int64_t to) {
    return runner->prefillInto(*view, table, tokens.data() + from, from,
                               to - from, config.numLayers);
  };
  // The server's own prefix, computed before the request arrives.
  KVC_RETURN_IF_ERROR(prefill(0, onDevice));

  Clock::time_point start = Clock::now();
  KVC_ASSIGN_OR_RETURN(found, connector->lookup(tokens));
  std::printf("lookup: the store holds %lld of the request's %lld tokens (%s)\n",
              (long long)found.tokens, (long long)n,
              found.fromIndex ? "this process's index" : "asked the store");
  for (const Lookup::Held &held : found.held)
    std::printf("  %s as %s, %lld tokens, in objects of %lld tokens x %lld "
                "layers\n",
                name(held.match.form), held.match.codec.str().c_str(),
                (long long)held.match.tokens,
                (long long)held.layout.chunkTokens,
                (long long)held.layout.layerGroup);
  KVC_ASSIGN_OR_RETURN(decision, connector->decide("request", tokens, onDevice));
  std::printf("decision: %s\n", decision.why.c_str());
  std::optional<RestoreMetrics> metrics;
  if (decision.loads()) {
    KVC_RETURN_IF_ERROR(connector->startLoad("request", table.blocks));
    KVC_ASSIGN_OR_RETURN(loaded, connector->waitLoad("request"));
    metrics = std::move(loaded);
    KVC_ASSIGN_OR_RETURN(failed, connector->failedBlocks("request"));
    if (!failed.empty())
      return internalError("serve: " + std::to_string(failed.size()) +
                           " blocks left to recompute");
  }
  const double loadSeconds = secondsSince(start);
  KVC_RETURN_IF_ERROR(prefill(decision.loadTokens, n));
  const double seconds = secondsSince(start);
  if (metrics) {
    std::printf("loaded %lld tokens by plan %s in %.3f ms (the plan: %.3f "
                "ms, predicted %.3f ms)\n",
                (long long)(decision.loadTokens - onDevice),
                decision.strategy.c_str(), loadSeconds * 1e3,
                metrics->makespanSeconds * 1e3,
                metrics->predictedSeconds.value_or(0) * 1e3);
    printFallbacks(*metrics);
  }
  std::printf("the server prefilled %lld tokens: the request's cache ready "
              "at %.3f ms (first token predicted at %.3f ms; recomputing "
              "predicted at %.3f ms)\n",
              (long long)(n - decision.loadTokens), seconds * 1e3,
              decision.predictedSeconds * 1e3,
              decision.recomputeSeconds * 1e3);
  served.model = std::move(model);
  served.tokens = std::move(tokens);
  served.connector = std::move(connector);
  served.cache = view;
  served.table = std::move(table);
  served.found = std::move(found);
  served.decision = std::move(decision);
  return served;
}

Status serveCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(onDevice, args.integer("on-device", 0));
  KVC_ASSIGN_OR_RETURN(maxError, maxErrorOption(args));
  const bool verify = args.has("verify");
  KVC_ASSIGN_OR_RETURN(served, serveRequest(args, onDevice, /*room=*/0));
  if (!verify)
    return Status::ok();
  KVC_ASSIGN_OR_RETURN(error, restoreError(*served.model, served.tokens,
                                           *served.cache, served.table,
                                           backend()));
  // What the load may have read: every encoding the store holds.
  std::vector<CodecSpec> codecs;
  if (served.decision.loads())
    for (const Lookup::Held &held : served.found.held)
      codecs.push_back(held.match.codec);
  // The server recomputes the rest of the request through every layer.
  Status checked = checkVerification(
      error, verifyBound(codecs, maxError, served.model->config().numLayers));
  std::printf("verify: against a full prefill, max error %.3g, relative L2 "
              "%.3g: %s\n",
              error.max, error.relativeL2,
              checked.isOk() ? "ok" : checked.message().c_str());
  return checked;
}

} // namespace kvc::run
