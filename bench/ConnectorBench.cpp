//===- ConnectorBench.cpp - What a server gets from the Connector ---------===//
//
// kvc-connector-bench [--model DIR] [--target FILE] [--calibrate]
//                     [--prefix P] [--suffix S] [--links LIST] [--repeat R]
//                     [--lookup-tokens N] [--lookups K] [--json FILE]
//
// A server on the CPU backend with its own paged cache, and a file:// store
// holding the KV of a P-token prefix (saved through the Connector, layer by
// layer). For each link rate of LIST (Gbps; the store read through its
// ?gbps= throttle), a request of the prefix and S new tokens is served
// four ways, each the fastest of R runs:
//
//   recompute  the server prefills all P + S tokens;
//   load all   the Connector loads the KV of every whole stored chunk
//              (strategy kv, LoadPolicy::Always), the server prefills the
//              rest;
//   kv         the Connector decides between that and recomputing
//              (strategy kv, LoadPolicy::Cheapest): a server whose model
//              kvc does not run;
//   joint      the Connector decides with every strategy (its own compute
//              beside the loads: Cake, HCache and their joint plan).
//
// The server's forward pass over its tokens (ModelRunner::decode) runs beside
// the load, each layer gated on the load's writing it (waitLayer), as the
// planner prices it; recomputing is the same pass over every token.
//
// A way is "ok" within the noise of the better of recompute and load all:
// the spread of the recompute's own R runs, at least 5%.
//
// It also times, on a warm Connector: decide + startLoad of requests of one
// shape (the plan cache hit) against the first decide (which compiles), and
// lookup and decide of an N-token request whose every chunk the index
// holds (an N-token context of zeros saved first: lookups read no
// payload): the first decide, which prices every candidate prefix and
// compiles, and later ones of the same shape.
//
// The model defaults to a generated 8-layer, hidden-512 Llama; the target
// to targets/cpu-2core.json, or with --calibrate this machine measured
// (host::calibrate) so that the Connector's prices are its own.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Tools/Calibrate.h"
#include "kvc/Host/CompilerHook.h"
#include "kvc/Host/Connector.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#include "BenchServer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <unistd.h>

using namespace kvc;
using namespace kvc::host;
using namespace kvc::bench;

namespace {

struct Flags {
  std::string model, target = KVC_SOURCE_DIR "/targets/cpu-2core.json", json;
  bool calibrate = false;
  int64_t prefix = 3072, suffix = 1024, repeat = 3, lookupTokens = 32768,
          lookups = 1000;
  std::vector<double> links = {100, 10, 1, 0.3, 0.1, 0.03};
};

StatusOr<Flags> parse(int argc, char **argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> StatusOr<std::string> {
      if (i + 1 >= argc)
        return invalidArgument(arg + " needs a value");
      return std::string(argv[++i]);
    };
    auto integer = [&](int64_t &out) -> Status {
      KVC_ASSIGN_OR_RETURN(text, value());
      char *end = nullptr;
      out = std::strtoll(text.c_str(), &end, 10);
      if (*end || out <= 0)
        return invalidArgument(arg + " expects a positive integer");
      return Status::ok();
    };
    if (arg == "--model") {
      KVC_ASSIGN_OR_RETURN(v, value());
      flags.model = v;
    } else if (arg == "--target") {
      KVC_ASSIGN_OR_RETURN(v, value());
      flags.target = v;
    } else if (arg == "--json") {
      KVC_ASSIGN_OR_RETURN(v, value());
      flags.json = v;
    } else if (arg == "--calibrate") {
      flags.calibrate = true;
    } else if (arg == "--prefix") {
      KVC_RETURN_IF_ERROR(integer(flags.prefix));
    } else if (arg == "--suffix") {
      KVC_RETURN_IF_ERROR(integer(flags.suffix));
    } else if (arg == "--repeat") {
      KVC_RETURN_IF_ERROR(integer(flags.repeat));
    } else if (arg == "--lookup-tokens") {
      KVC_RETURN_IF_ERROR(integer(flags.lookupTokens));
    } else if (arg == "--lookups") {
      KVC_RETURN_IF_ERROR(integer(flags.lookups));
    } else if (arg == "--links") {
      KVC_ASSIGN_OR_RETURN(v, value());
      flags.links.clear();
      std::stringstream in(v);
      for (std::string word; std::getline(in, word, ',');) {
        char *end = nullptr;
        const double gbps = std::strtod(word.c_str(), &end);
        if (word.empty() || *end || gbps <= 0)
          return invalidArgument("--links expects positive rates, got " + v);
        flags.links.push_back(gbps);
      }
    } else {
      return invalidArgument("unknown option " + arg);
    }
  }
  return flags;
}

/// One request served through `connector`: its decision and seconds.
StatusOr<std::pair<Decision, double>> serve(Connector &connector,
                                            Server &server,
                                            const std::string &id,
                                            const std::vector<int32_t> &tokens,
                                            const std::vector<int32_t> &ids) {
  Clock::time_point start = Clock::now();
  KVC_ASSIGN_OR_RETURN(decision, connector.decide(id, tokens, 0));
  if (decision.loads()) {
    KVC_RETURN_IF_ERROR(connector.startLoad(id, ids));
    KVC_RETURN_IF_ERROR(server.forward(
        tokens, decision.loadTokens, ids,
        [&](int64_t layer) { return connector.waitLayer(id, layer); }));
    KVC_RETURN_IF_ERROR(connector.waitLoad(id).status());
  } else {
    KVC_RETURN_IF_ERROR(server.forward(tokens, 0, ids));
  }
  const double seconds = secondsSince(start);
  (void)connector.finished();
  KVC_RETURN_IF_ERROR(connector.cancel(id)); // Forgets it.
  return std::make_pair(decision, seconds);
}

Status run(const Flags &flags) {
  std::string modelDir = flags.model;
  const std::string scratch =
      (std::filesystem::temp_directory_path() /
       ("kvc-connector-bench-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(scratch);
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } cleanup{scratch};
  if (modelDir.empty()) {
    modelDir = scratch + "/model";
    GenModelOptions gen;
    gen.layers = 8;
    gen.hidden = 512;
    gen.heads = 8;
    gen.kvHeads = 2;
    gen.ffn = 1376;
    gen.seed = 1;
    KVC_RETURN_IF_ERROR(generateModel(modelDir, gen));
  }
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(modelDir));
  KVC_ASSIGN_OR_RETURN(base, loadTargetDesc(flags.target));
  TargetDesc target = base;
  if (flags.calibrate) {
    std::FILE *quiet = std::fopen("/dev/null", "w");
    StatusOr<TargetDesc> calibrated =
        calibrate(cpuDevice(), *model, base, scratch, quiet ? quiet : stderr);
    if (quiet)
      std::fclose(quiet);
    KVC_ASSIGN_OR_RETURN(measured, std::move(calibrated));
    target = measured;
  }
  const ModelConfig &config = model->config();
  const int64_t n = flags.prefix + flags.suffix;
  Server server{*model,
                (std::max(flags.lookupTokens, 2 * n) + 15) / 16 + 16, {}};

  ConnectorOptions options;
  options.model = model.get();
  options.target = target;
  options.planner = compilerPlanHook();
  options.stores = {{"file://" + scratch + "/store", ""}};
  options.saveLayout = {256, 1};

  // The prefix, prefilled and saved.
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i)
    tokens[i] = int32_t((i * 7919 + 13) % config.vocabSize);
  const std::vector<int32_t> prefix(tokens.begin(),
                                    tokens.begin() + flags.prefix);
  {
    KVC_ASSIGN_OR_RETURN(writer, connect(options, server));
    const std::vector<int32_t> ids = blockRange(0, flags.prefix);
    KVC_RETURN_IF_ERROR(server.prefill(prefix, 0, ids));
    KVC_RETURN_IF_ERROR(
        saveAll(*writer, "prefix", prefix, ids, config.numLayers));
  }

  nlohmann::json out;
  out["model"] = {{"layers", config.numLayers},
                  {"hidden", config.hiddenSize},
                  {"kv_heads", config.numKvHeads},
                  {"head_dim", config.headDim}};
  out["target"] = target.name;
  out["prefix"] = flags.prefix;
  out["suffix"] = flags.suffix;
  std::printf("kvc-connector-bench: %lld-layer hidden-%lld model, %lld stored "
              "+ %lld new tokens, target %s, fastest of %lld\n",
              (long long)config.numLayers, (long long)config.hiddenSize,
              (long long)flags.prefix, (long long)flags.suffix,
              target.name.c_str(), (long long)flags.repeat);
  std::printf("%-9s %11s %11s %11s %7s %11s %7s %-6s %9s %9s %7s\n",
              "link Gbps", "recompute s", "load all s", "kv s", "loads",
              "joint s", "loads", "plan", "kv vs", "joint vs", "noise");
  const std::vector<int32_t> ids = blockRange(int32_t(server.blocks - (n + 15) / 16 - 1), n);
  int worse = 0;
  for (double gbps : flags.links) {
    char rate[32];
    std::snprintf(rate, sizeof(rate), "%g", gbps);
    ConnectorOptions throttled = options;
    throttled.stores[0].url += std::string("?gbps=") + rate;
    KVC_ASSIGN_OR_RETURN(joint, connect(throttled, server));
    throttled.plans.strategies = {planning::Strategy::Kv};
    KVC_ASSIGN_OR_RETURN(kv, connect(throttled, server));
    throttled.policy = LoadPolicy::Always;
    KVC_ASSIGN_OR_RETURN(always, connect(throttled, server));
    double recompute = 1e30, loadAll = 1e30, kvTime = 1e30, jointTime = 1e30;
    double slowestRecompute = 0;
    Decision kvDecision, jointDecision;
    for (int64_t r = 0; r < flags.repeat; ++r) {
      Clock::time_point start = Clock::now();
      KVC_RETURN_IF_ERROR(server.forward(tokens, 0, ids));
      recompute = std::min(recompute, secondsSince(start));
      slowestRecompute = std::max(slowestRecompute, secondsSince(start));
      KVC_ASSIGN_OR_RETURN(forced, serve(*always, server, "r", tokens, ids));
      loadAll = std::min(loadAll, forced.second);
      KVC_ASSIGN_OR_RETURN(byKv, serve(*kv, server, "r", tokens, ids));
      kvTime = std::min(kvTime, byKv.second);
      kvDecision = byKv.first;
      KVC_ASSIGN_OR_RETURN(byJoint, serve(*joint, server, "r", tokens, ids));
      jointTime = std::min(jointTime, byJoint.second);
      jointDecision = byJoint.first;
    }
    const double better = std::min(recompute, loadAll);
    // Within the noise of the better of the two: the spread of the
    // recompute's own runs, and at least 5%.
    const double noise = std::max(0.05, slowestRecompute / recompute - 1);
    const bool ok = kvTime <= better * (1 + noise) + 0.005 &&
                    jointTime <= better * (1 + noise) + 0.005;
    worse += !ok;
    std::printf("%-9s %11.4f %11.4f %11.4f %7lld %11.4f %7lld %-6s %+8.1f%% "
                "%+8.1f%% %6.1f%% %s\n",
                rate, recompute, loadAll, kvTime,
                (long long)kvDecision.loadTokens, jointTime,
                (long long)jointDecision.loadTokens,
                jointDecision.loads() ? jointDecision.strategy.c_str() : "-",
                (kvTime / better - 1) * 100, (jointTime / better - 1) * 100,
                noise * 100, ok ? "ok" : "WORSE");
    auto described = [](const Decision &decision, double seconds) {
      return nlohmann::json{{"seconds", seconds},
                            {"load_tokens", decision.loadTokens},
                            {"strategy", decision.strategy},
                            {"predicted_s", decision.predictedSeconds},
                            {"predicted_recompute_s",
                             decision.recomputeSeconds},
                            {"why", decision.why}};
    };
    out["links"].push_back({{"gbps", gbps},
                            {"recompute_s", recompute},
                            {"load_all_s", loadAll},
                            {"kv", described(kvDecision, kvTime)},
                            {"joint", described(jointDecision, jointTime)},
                            {"noise", noise},
                            {"ok", ok}});
  }

  // Decide + start: the first decision of a shape compiles its plan, later
  // ones of the same shape (other requests) hit the plan cache.
  {
    KVC_ASSIGN_OR_RETURN(connector, connect(options, server));
    std::vector<int32_t> request = tokens;
    Clock::time_point start = Clock::now();
    KVC_ASSIGN_OR_RETURN(first, connector->decide("cold", request, 0));
    const double cold = secondsSince(start);
    if (!first.loads())
      return failedPrecondition("the unthrottled store is not loaded from: " +
                                first.why);
    KVC_RETURN_IF_ERROR(connector->cancel("cold"));
    std::vector<double> warm;
    for (int i = 0; i < 50; ++i) {
      request.back() = int32_t(i % config.vocabSize); // Another request.
      const std::string id = "warm" + std::to_string(i);
      start = Clock::now();
      KVC_ASSIGN_OR_RETURN(decided, connector->decide(id, request, 0));
      KVC_RETURN_IF_ERROR(connector->startLoad(id, ids));
      warm.push_back(secondsSince(start));
      (void)decided;
      KVC_RETURN_IF_ERROR(connector->waitLoad(id).status());
      KVC_RETURN_IF_ERROR(connector->cancel(id));
    }
    std::sort(warm.begin(), warm.end());
    std::printf("decide + startLoad: first (compiles) %.3f ms; warm median "
                "%.3f ms, p90 %.3f ms (%lld plans compiled for %zu requests)\n",
                cold * 1e3, warm[warm.size() / 2] * 1e3,
                warm[warm.size() * 9 / 10] * 1e3,
                (long long)connector->plansCompiled(), warm.size() + 1);
    out["decide"] = {{"cold_ms", cold * 1e3},
                     {"warm_median_ms", warm[warm.size() / 2] * 1e3},
                     {"warm_p90_ms", warm[warm.size() * 9 / 10] * 1e3},
                     {"plans_compiled", connector->plansCompiled()}};
  }

  // Lookup of a long request the index holds every chunk of.
  {
    ConnectorOptions fresh = options;
    fresh.stores = {{"file://" + scratch + "/lookup", ""}};
    KVC_ASSIGN_OR_RETURN(connector, connect(fresh, server));
    std::vector<int32_t> request(flags.lookupTokens);
    for (int64_t i = 0; i < flags.lookupTokens; ++i)
      request[i] = int32_t((i * 31 + 5) % config.vocabSize);
    std::fill(server.memory.begin(), server.memory.end(), 0);
    KVC_RETURN_IF_ERROR(saveAll(*connector, "long", request,
                                blockRange(0, flags.lookupTokens),
                                config.numLayers));
    std::vector<double> times;
    int64_t found = 0;
    for (int64_t i = 0; i < flags.lookups; ++i) {
      Clock::time_point start = Clock::now();
      KVC_ASSIGN_OR_RETURN(lookup, connector->lookup(request));
      times.push_back(secondsSince(start));
      found = lookup.fromIndex ? lookup.tokens : -1;
    }
    std::sort(times.begin(), times.end());
    std::printf("lookup of %lld tokens (%lld found in the index): median "
                "%.1f us, p99 %.1f us\n",
                (long long)flags.lookupTokens, (long long)found,
                times[times.size() / 2] * 1e6,
                times[times.size() * 99 / 100] * 1e6);
    out["lookup"] = {{"tokens", flags.lookupTokens},
                     {"found", found},
                     {"median_us", times[times.size() / 2] * 1e6},
                     {"p99_us", times[times.size() * 99 / 100] * 1e6}};

    // Decide alone at that length: the first prices every candidate
    // prefix and compiles the plan; later requests of the shape hit both
    // caches (each decided, then forgotten).
    Clock::time_point start = Clock::now();
    KVC_ASSIGN_OR_RETURN(first, connector->decide("long-cold", request, 0));
    const double cold = secondsSince(start);
    KVC_RETURN_IF_ERROR(connector->cancel("long-cold"));
    std::vector<double> warm;
    for (int i = 0; i < 200; ++i) {
      const std::string id = "long" + std::to_string(i);
      start = Clock::now();
      KVC_ASSIGN_OR_RETURN(decided, connector->decide(id, request, 0));
      warm.push_back(secondsSince(start));
      (void)decided;
      KVC_RETURN_IF_ERROR(connector->cancel(id));
    }
    std::sort(warm.begin(), warm.end());
    std::printf("decide of %lld tokens (%s, %lld loaded): first %.3f ms; "
                "warm median %.3f ms, p90 %.3f ms\n",
                (long long)flags.lookupTokens,
                first.loads() ? first.strategy.c_str() : "recomputes",
                (long long)first.loadTokens, cold * 1e3,
                warm[warm.size() / 2] * 1e3, warm[warm.size() * 9 / 10] * 1e3);
    out["decide_long"] = {{"tokens", flags.lookupTokens},
                          {"load_tokens", first.loadTokens},
                          {"cold_ms", cold * 1e3},
                          {"warm_median_ms", warm[warm.size() / 2] * 1e3},
                          {"warm_p90_ms", warm[warm.size() * 9 / 10] * 1e3}};
  }
  if (!flags.json.empty()) {
    std::ofstream file(flags.json);
    file << out.dump(1) << "\n";
    if (!file)
      return unavailable(flags.json + ": cannot write");
  }
  if (worse)
    return internalError(std::to_string(worse) +
                         " link(s) where the connector was slower than the "
                         "better of loading and recomputing");
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  StatusOr<Flags> flags = parse(argc, argv);
  Status status = flags ? run(*flags) : flags.status();
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-connector-bench: %s\n",
                 status.toString().c_str());
    return 1;
  }
  return 0;
}
