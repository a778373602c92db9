//===- Soak.cpp - Requests under faults: nothing lost, nothing wrong ------===//
//
// kvc-soak [--seconds S] [--fault-free S0] [--clients N] [--prompts P]
//          [--tokens T] [--fault-every F] [--seed X] [--json FILE]
//
// A server on the CPU backend (BenchServer.h) serves N clients at once
// through one Connector for S seconds. Each request is one of P stored
// T-token prompts and 16 tokens of its own: decide (LoadPolicy::Always, the
// KV plan), the load beside the server's forward pass, then the cache
// verified against a full prefill of the prompt (restoreError within bf16
// rounding: a wrong cache is any request past it). Half the prompts are
// stored in a Redis Cluster of three masters without replicas, half in a
// file:// tier of 24 MiB (least recently used objects evicted past it; on a
// tmpfs of 64 MiB of its own where this process may mount one), an object a
// chunk of 128 tokens. Beside the loads a saver saves them again through
// two writers (each saves to its own first store), and every fourth save a
// prompt never seen to the disk. After S0 seconds
// without faults (default S/5: the baseline), every F seconds the next
// fault of a cycle:
//
//   kill      a master SIGKILLed          restart   started again, empty
//   freeze    a master SIGSTOPped         thaw      resumed
//   migrate   200 slots and their keys moved between two masters
//   corrupt   a byte flipped in 3 of the file tier's objects
//   truncate  3 objects cut to half       delete    3 objects removed
//   fill      the file tier's filesystem filled (saves fail), then drained
//             (skipped, and said, where no tmpfs could be mounted)
//
// Prints (and writes with --json) per phase: requests served and failed,
// wrong caches, chunks loaded and recomputed, requests that loaded nothing,
// p50/p99 first-token times; saves and failed saves; the faults injected;
// peak memory, and first-token times by the fault last injected. Exits 1 on a
// failed request or a wrong cache, 77 when no Redis Cluster can start
// (redis-server and redis-cli are needed).
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/CompilerHook.h"
#include "kvc/Host/Connector.h"
#include "kvc/Host/Tools/Verify.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Base/Memory.h"
#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Testing/RedisCluster.h"

#include "BenchServer.h"

#include <nlohmann/json.hpp>

#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

using namespace kvc;
using namespace kvc::host;
using namespace kvc::bench;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kChunkTokens = 128;
constexpr int64_t kOwnTokens = 16; ///< Each request's tokens after its prompt.

struct Flags {
  double seconds = 600, faultFree = -1, faultEvery = 5;
  int64_t clients = 4, prompts = 8, tokens = 512;
  uint64_t seed = 1;
  std::string json;
};

StatusOr<Flags> parse(int argc, char **argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc)
      return invalidArgument(arg + " needs a value");
    const std::string value = argv[++i];
    char *end = nullptr;
    const double number = std::strtod(value.c_str(), &end);
    const bool numeric = !value.empty() && !*end && number >= 0;
    if (arg == "--json") {
      flags.json = value;
      continue;
    }
    if (!numeric)
      return invalidArgument(arg + " expects a number, got " + value);
    if (arg == "--seconds")
      flags.seconds = number;
    else if (arg == "--fault-free")
      flags.faultFree = number;
    else if (arg == "--fault-every")
      flags.faultEvery = number;
    else if (arg == "--clients")
      flags.clients = int64_t(number);
    else if (arg == "--prompts")
      flags.prompts = int64_t(number);
    else if (arg == "--tokens")
      flags.tokens = int64_t(number);
    else if (arg == "--seed")
      flags.seed = uint64_t(number);
    else
      return invalidArgument("unknown option " + arg);
  }
  if (flags.faultFree < 0)
    flags.faultFree = flags.seconds / 5;
  if (flags.clients < 1 || flags.prompts < 2 || flags.tokens < kChunkTokens ||
      flags.faultEvery <= 0 || flags.faultFree > flags.seconds)
    return invalidArgument("--clients >= 1, --prompts >= 2, --tokens >= 128, "
                           "--fault-every > 0, --fault-free <= --seconds");
  return flags;
}

/// What one phase (fault-free, or with faults) served.
struct Phase {
  int64_t requests = 0, failed = 0, wrong = 0, chunksLoaded = 0,
          chunksRecomputed = 0, loadedNothing = 0, blocksLeftToServer = 0;
  std::vector<double> firstToken; ///< Seconds, a request each.
  int64_t peakRssBytes = 0;

  double percentile(double p) const {
    if (firstToken.empty())
      return 0;
    std::vector<double> sorted = firstToken;
    std::sort(sorted.begin(), sorted.end());
    return sorted[std::min(sorted.size() - 1,
                           std::size_t(p * double(sorted.size())))];
  }
};

/// The soak's shared state: what the threads report into.
struct Soak {
  const Flags &flags;
  const LlamaModel &model;
  Server &server;
  Connector &serving;
  std::vector<Connector *> writers; ///< Prompt p saves through p % 2.
  const std::vector<std::vector<int32_t>> &prompts;
  const std::vector<ModelCompute::Cache> &references;
  Clock::time_point start = Clock::now();
  std::atomic<bool> faulting{false}, done{false};

  std::mutex mutex;
  Phase phases[2]; ///< Fault-free, faulted.
  int64_t saves = 0, savesFailed = 0;
  std::map<std::string, int64_t> why; ///< Failures and wrong caches.
  std::vector<std::string> faults;
  /// First-token times by the fault last injected when each request began.
  std::map<std::string, std::vector<double>> byFault;
  std::string current = "none"; ///< The fault last injected.
  /// Resident memory every 30 seconds: whether it stays bounded.
  std::vector<std::pair<double, int64_t>> rss;

  Phase &phase() { return phases[faulting.load() ? 1 : 0]; }
  /// Counts `what` happened; reasons that differ only in an object's key,
  /// a temporary file or a port are one.
  void note(const std::string &what) {
    static const std::regex kNoise(
        "[0-9a-f]{64}|/\\.tmp/[0-9.]+|127\\.0\\.0\\.1:[0-9]+");
    const std::string reason = std::regex_replace(what, kNoise, "*");
    if (why[reason]++ == 0)
      std::fprintf(stderr, "kvc-soak: %s\n", reason.c_str());
  }
};

/// One request of `client`: its prompt `p` and tokens of its own, served
/// into `ids` and verified.
void serveOne(Soak &soak, ModelRunner &runner, int64_t client, int64_t n,
              std::size_t p, const std::vector<int32_t> &ids,
              std::mt19937_64 &random) {
  std::vector<int32_t> tokens = soak.prompts[p];
  for (int64_t i = 0; i < kOwnTokens; ++i)
    tokens.push_back(int32_t(random() % soak.model.config().vocabSize));
  const std::string id = "c" + std::to_string(client) + "-" + std::to_string(n);
  Connector &connector = soak.serving;
  std::string during;
  {
    std::lock_guard<std::mutex> lock(soak.mutex);
    during = soak.current;
  }
  const Clock::time_point start = Clock::now();
  auto failed = [&](const Status &status) {
    std::lock_guard<std::mutex> lock(soak.mutex);
    ++soak.phase().requests;
    ++soak.phase().failed;
    soak.note("failed: " + status.toString());
    (void)connector.cancel(id);
  };
  StatusOr<Decision> decision = connector.decide(id, tokens, 0);
  if (!decision)
    return failed(decision.status());
  RestoreMetrics metrics;
  std::vector<int32_t> leftToServer;
  if (decision->loads()) {
    if (Status started = connector.startLoad(id, ids); !started.isOk())
      return failed(started);
    Status forward = soak.server.forward(
        tokens, decision->loadTokens, ids,
        [&](int64_t layer) { return connector.waitLayer(id, layer); }, &runner);
    StatusOr<RestoreMetrics> loaded = connector.waitLoad(id);
    if (!forward.isOk())
      return failed(forward);
    if (!loaded)
      return failed(loaded.status());
    metrics = std::move(*loaded);
    StatusOr<std::vector<int32_t>> left = connector.failedBlocks(id);
    if (!left)
      return failed(left.status());
    leftToServer = std::move(*left);
    if (!leftToServer.empty()) // The server recomputes what kvc could not.
      if (Status again = soak.server.forward(tokens, 0, ids, {}, &runner);
          !again.isOk())
        return failed(again);
  } else if (Status forward = soak.server.forward(tokens, 0, ids, {}, &runner);
             !forward.isOk()) {
    return failed(forward);
  }
  const double seconds = secondsSince(start);
  (void)connector.finished();
  (void)connector.cancel(id);

  BlockTable table{ids};
  StatusOr<RestoreError> error =
      restoreError(soak.model, soak.references[p], soak.flags.tokens,
                   *soak.server.cache, table, cpuDevice());
  Status verified =
      error ? checkVerification(*error, verifyBound({})) : error.status();
  std::lock_guard<std::mutex> lock(soak.mutex);
  Phase &phase = soak.phase();
  ++phase.requests;
  phase.firstToken.push_back(seconds);
  if (soak.faulting.load())
    soak.byFault[during].push_back(seconds);
  phase.blocksLeftToServer += int64_t(leftToServer.size());
  if (!verified.isOk()) {
    ++phase.wrong;
    soak.note("wrong cache: " + verified.toString());
  }
  if (!decision->loads()) {
    ++phase.loadedNothing;
    return;
  }
  const int64_t chunks =
      (decision->loadTokens + kChunkTokens - 1) / kChunkTokens;
  for (const std::string &event : metrics.fallbacks) {
    const std::size_t at = event.find(" recomputed: ");
    soak.note("chunk recomputed: " +
              (at == std::string::npos ? event : event.substr(at + 13)));
  }
  const int64_t recomputed = int64_t(metrics.fallbackTokens.size());
  phase.chunksRecomputed += recomputed;
  phase.chunksLoaded += std::max<int64_t>(0, chunks - recomputed);
}

void client(Soak &soak, int64_t c, const std::vector<int32_t> &ids) {
  std::unique_ptr<ModelRunner> runner = cpuDevice().createRunner(soak.model);
  std::mt19937_64 random(soak.flags.seed * 1000 + uint64_t(c));
  for (int64_t n = 0; !soak.done.load(); ++n)
    serveOne(soak, *runner, c, n, random() % soak.prompts.size(), ids, random);
}

/// Saves prompts again, beside the loads, through their writers.
void saver(Soak &soak, const std::vector<int32_t> &ids) {
  std::unique_ptr<ModelRunner> runner = cpuDevice().createRunner(soak.model);
  std::mt19937_64 random(soak.flags.seed * 1000 + 999);
  const int64_t layers = soak.model.config().numLayers;
  std::vector<int32_t> fresh(soak.prompts.front().size());
  for (int64_t n = 0; !soak.done.load(); ++n) {
    // Every fourth save a prompt never saved before, to the disk (whose
    // capacity evicts the least recently used); the others one of the
    // stored prompts again, through its writer (objects stored whole are
    // left as they are, the rest written).
    const std::size_t p = random() % soak.prompts.size();
    const bool novel = n % 4 == 3;
    for (int32_t &token : fresh)
      token = int32_t(random() % soak.model.config().vocabSize);
    const std::vector<int32_t> &tokens = novel ? fresh : soak.prompts[p];
    Connector &writer = *soak.writers[novel ? 1 : p % 2];
    const std::string id = "save" + std::to_string(n);
    Status saved = soak.server.prefill(tokens, 0, ids, runner.get());
    if (saved.isOk())
      saved = saveAll(writer, id, tokens, ids, layers);
    (void)writer.finished();
    (void)writer.cancel(id); // Forgets it.
    std::lock_guard<std::mutex> lock(soak.mutex);
    ++soak.saves;
    if (!saved.isOk()) {
      ++soak.savesFailed;
      soak.note("save failed: " + saved.toString());
    }
  }
}

/// The faults of one cycle, injected one every --fault-every seconds.
class Faults {
public:
  Faults(Soak &soak, test::RedisCluster &cluster, std::string disk, bool tmpfs)
      : soak_(soak), cluster_(cluster), disk_(std::move(disk)), tmpfs_(tmpfs),
        random_(soak.flags.seed * 7 + 3) {}

  void inject(int64_t step) {
    static const char *const kCycle[] = {
        "kill",    "restart",  "freeze", "thaw", "migrate",
        "corrupt", "truncate", "delete", "fill", "drain"};
    const std::string fault = kCycle[step % std::size(kCycle)];
    const std::string what = fault + ": " + run(fault);
    std::lock_guard<std::mutex> lock(soak_.mutex);
    soak_.faults.push_back(what);
    soak_.current = fault;
  }

  /// Leaves the stores whole again: nodes running, the disk drained.
  void heal() {
    if (frozen_ >= 0)
      cluster_.thaw(frozen_);
    if (killed_ >= 0)
      cluster_.restart(killed_);
    std::error_code ignored;
    fs::remove(disk_ + "/ballast", ignored);
  }

private:
  std::string run(const std::string &fault) {
    if (fault == "kill" || fault == "freeze") {
      std::vector<int> masters = cluster_.masters();
      if (masters.size() < 2)
        return "skipped (fewer than two masters answer)";
      const int node = masters[random_() % masters.size()];
      if (fault == "kill") {
        cluster_.kill(node);
        killed_ = node;
      } else {
        cluster_.freeze(node);
        frozen_ = node;
      }
      return "node " + std::to_string(node);
    }
    if (fault == "restart") {
      if (killed_ < 0)
        return "skipped (none killed)";
      const int node = std::exchange(killed_, -1);
      return "node " + std::to_string(node) +
             (cluster_.restart(node) ? "" : " (did not answer)");
    }
    if (fault == "thaw") {
      if (frozen_ < 0)
        return "skipped (none frozen)";
      const int node = std::exchange(frozen_, -1);
      cluster_.thaw(node);
      return "node " + std::to_string(node);
    }
    if (fault == "migrate") {
      if (!cluster_.waitHealthy(5))
        return "skipped (the cluster is not healthy yet)";
      std::vector<int> masters = cluster_.masters();
      const int from = masters[random_() % masters.size()];
      const int to =
          masters[(std::size_t(std::find(masters.begin(), masters.end(), from) -
                               masters.begin()) +
                   1) %
                  masters.size()];
      return "200 slots from node " + std::to_string(from) + " to " +
             std::to_string(to) +
             (cluster_.migrate(from, to, 200) ? "" : " (reshard failed)");
    }
    if (fault == "fill" || fault == "drain") {
      if (!tmpfs_)
        return "skipped (no tmpfs of its own could be mounted)";
      const std::string ballast = disk_ + "/ballast";
      if (fault == "drain") {
        std::error_code ignored;
        fs::remove(ballast, ignored);
        return "the ballast removed";
      }
      std::ofstream out(ballast, std::ios::binary);
      const std::string megabyte(1 << 20, 'x');
      int64_t written = 0;
      while (out.write(megabyte.data(), std::streamsize(megabyte.size())) &&
             out.flush())
        ++written;
      return std::to_string(written) + " MiB of ballast: full";
    }
    // corrupt, truncate, delete: 3 of the file tier's stored objects.
    std::vector<fs::path> objects;
    std::error_code error;
    for (fs::recursive_directory_iterator it(disk_ + "/store", error), end;
         !error && it != end; it.increment(error))
      if (it->is_regular_file() &&
          it->path().string().find("/kv/") != std::string::npos)
        objects.push_back(it->path());
    std::string names;
    for (int i = 0; i < 3 && !objects.empty(); ++i) {
      const fs::path path = objects[random_() % objects.size()];
      const auto size = fs::file_size(path, error);
      if (error)
        continue;
      if (fault == "delete") {
        fs::remove(path, error);
      } else if (fault == "truncate") {
        fs::resize_file(path, size / 2, error);
      } else if (size > 0) {
        std::fstream file(path,
                          std::ios::in | std::ios::out | std::ios::binary);
        file.seekg(std::streamoff(size / 2));
        char byte = 0;
        file.read(&byte, 1);
        byte = char(byte ^ 0x5a);
        file.seekp(std::streamoff(size / 2));
        file.write(&byte, 1);
      }
      names += " " + path.filename().string();
    }
    return names.empty() ? "skipped (no objects)" : "objects" + names;
  }

  Soak &soak_;
  test::RedisCluster &cluster_;
  std::string disk_;
  bool tmpfs_;
  std::mt19937_64 random_;
  int killed_ = -1, frozen_ = -1;
};

nlohmann::json phaseJson(const Phase &phase) {
  return {{"requests", phase.requests},
          {"failed", phase.failed},
          {"wrong_caches", phase.wrong},
          {"chunks_loaded", phase.chunksLoaded},
          {"chunks_recomputed", phase.chunksRecomputed},
          {"loaded_nothing", phase.loadedNothing},
          {"blocks_left_to_server", phase.blocksLeftToServer},
          {"p50_ms", phase.percentile(0.5) * 1e3},
          {"p99_ms", phase.percentile(0.99) * 1e3},
          {"peak_rss_mb", double(phase.peakRssBytes) / (1 << 20)}};
}

StatusOr<int> run(const Flags &flags) {
  setComputeThreads(1);
  const std::string scratch =
      (fs::temp_directory_path() / ("kvc-soak-" + std::to_string(::getpid())))
          .string();
  fs::create_directories(scratch + "/disk");
  // The file tier on a filesystem of its own, which a fault can fill.
  const std::string disk = scratch + "/disk";
  const bool tmpfs =
      ::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=64m") == 0;
  struct Cleanup {
    std::string scratch, disk;
    bool tmpfs;
    ~Cleanup() {
      if (tmpfs)
        ::umount2(disk.c_str(), MNT_DETACH);
      std::error_code ignored;
      fs::remove_all(scratch, ignored);
    }
  } cleanup{scratch, disk, tmpfs};

  test::RedisCluster cluster(scratch + "/cluster", 3, /*replicas=*/0,
                             /*fullCoverage=*/false);
  if (!cluster.ready()) {
    std::fprintf(stderr, "kvc-soak: no Redis Cluster (redis-server and "
                         "redis-cli are needed): skipped\n");
    return 77;
  }
  GenModelOptions gen;
  gen.layers = 4;
  gen.hidden = 256;
  gen.heads = 4;
  gen.kvHeads = 2;
  gen.ffn = 512;
  gen.vocab = 512;
  gen.maxPositions = 4096;
  gen.seed = 1;
  KVC_RETURN_IF_ERROR(generateModel(scratch + "/model", gen));
  KVC_ASSIGN_OR_RETURN(model, LlamaModel::load(scratch + "/model"));
  KVC_ASSIGN_OR_RETURN(
      target, loadTargetDesc(KVC_SOURCE_DIR "/targets/cpu-2core.json"));

  // Blocks: a range per client and one for the saver.
  const int64_t perRequest = (flags.tokens + kOwnTokens + 15) / 16;
  Server server{*model, perRequest * (flags.clients + 1), {}};
  const std::string clusterUrl = cluster.url("?timeout_ms=200"),
                    fileUrl = "file://" + disk + "/store?capacity_mb=24";
  ConnectorOptions options;
  options.model = model.get();
  options.target = target;
  options.planner = compilerPlanHook();
  options.saveLayout = {kChunkTokens, model->config().numLayers};

  // The prompts, their full prefills (what every restore is held to), and
  // their KV stored: odd ones on the disk (whose first save makes the
  // store), even ones in the cluster.
  std::mt19937_64 random(flags.seed);
  std::vector<std::vector<int32_t>> prompts(std::size_t(flags.prompts));
  std::vector<ModelCompute::Cache> references;
  for (std::vector<int32_t> &prompt : prompts) {
    for (int64_t i = 0; i < flags.tokens; ++i)
      prompt.push_back(int32_t(random() % model->config().vocabSize));
    KVC_ASSIGN_OR_RETURN(reference, fullPrefill(*server.runner, prompt));
    references.push_back(std::move(reference));
  }
  const std::vector<int32_t> saverIds =
      blockRange(int32_t(perRequest * flags.clients), flags.tokens);
  std::vector<std::unique_ptr<Connector>> writers(2);
  for (std::size_t w : {1, 0}) {
    options.stores = {{fileUrl, ""}, {clusterUrl, ""}};
    if (w == 0)
      std::swap(options.stores[0], options.stores[1]);
    KVC_ASSIGN_OR_RETURN(writer, connect(options, server));
    writers[w] = std::move(writer);
    for (std::size_t p = w; p < prompts.size(); p += 2) {
      KVC_RETURN_IF_ERROR(server.prefill(prompts[p], 0, saverIds));
      KVC_RETURN_IF_ERROR(saveAll(*writers[w], "p" + std::to_string(p),
                                  prompts[p], saverIds,
                                  model->config().numLayers));
    }
  }
  options.createStores = false;
  options.policy = LoadPolicy::Always;
  options.plans.strategies = {planning::Strategy::Kv};
  KVC_ASSIGN_OR_RETURN(serving, connect(options, server));

  Soak soak{flags,
            *model,
            server,
            *serving,
            {writers[0].get(), writers[1].get()},
            prompts,
            references};
  std::printf("kvc-soak: %lld clients, %lld prompts of %lld tokens (+%lld of "
              "each request's own), %.0f s: %.0f without faults, then a "
              "fault every %.0f s; the file tier %s\n",
              (long long)flags.clients, (long long)flags.prompts,
              (long long)flags.tokens, (long long)kOwnTokens, flags.seconds,
              flags.faultFree, flags.faultEvery,
              tmpfs ? "on a 64 MiB tmpfs" : "on the scratch disk (no fill)");
  std::fflush(stdout);
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < flags.clients; ++c)
    threads.emplace_back(
        client, std::ref(soak), c,
        blockRange(int32_t(c * perRequest), flags.tokens + kOwnTokens));
  threads.emplace_back(saver, std::ref(soak), saverIds);

  Faults faults(soak, cluster, disk, tmpfs);
  int64_t step = 0;
  while (secondsSince(soak.start) < flags.seconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double at = secondsSince(soak.start);
    {
      std::lock_guard<std::mutex> lock(soak.mutex);
      Phase &phase = soak.phase();
      const int64_t resident = residentBytes();
      phase.peakRssBytes = std::max(phase.peakRssBytes, resident);
      if (at >= 30.0 * double(soak.rss.size()))
        soak.rss.emplace_back(at, resident);
    }
    if (at < flags.faultFree)
      continue;
    soak.faulting = true;
    if (at >= flags.faultFree + double(step) * flags.faultEvery)
      faults.inject(step++);
  }
  soak.done = true;
  for (std::thread &thread : threads)
    thread.join();
  faults.heal();

  const char *names[] = {"fault-free", "faults"};
  std::printf("%-11s %8s %6s %6s %8s %10s %8s %8s %8s %9s\n", "phase",
              "requests", "failed", "wrong", "chunks", "recomputed", "no load",
              "p50 ms", "p99 ms", "peak RSS");
  for (int i = 0; i < 2; ++i) {
    const Phase &phase = soak.phases[i];
    std::printf("%-11s %8lld %6lld %6lld %8lld %10lld %8lld %8.1f %8.1f "
                "%6.0f MB\n",
                names[i], (long long)phase.requests, (long long)phase.failed,
                (long long)phase.wrong, (long long)phase.chunksLoaded,
                (long long)phase.chunksRecomputed,
                (long long)phase.loadedNothing, phase.percentile(0.5) * 1e3,
                phase.percentile(0.99) * 1e3,
                double(phase.peakRssBytes) / (1 << 20));
  }
  std::printf("saves: %lld, %lld failed\n", (long long)soak.saves,
              (long long)soak.savesFailed);
  std::printf("resident memory every 30 s, MB:");
  nlohmann::json rss = nlohmann::json::array();
  for (const auto &[at, bytes] : soak.rss) {
    std::printf(" %.0f", double(bytes) / (1 << 20));
    rss.push_back({{"seconds", at}, {"mb", double(bytes) / (1 << 20)}});
  }
  std::printf("\n");
  std::map<std::string, int64_t> injected;
  for (const std::string &fault : soak.faults)
    ++injected[fault.substr(0, fault.find(':'))];
  std::printf("faults:");
  for (const auto &[fault, count] : injected)
    std::printf(" %s %lld", fault.c_str(), (long long)count);
  std::printf("\n");
  for (const std::string &fault : soak.faults)
    std::printf("  %s\n", fault.c_str());
  std::printf("first-token times by the fault last injected:\n");
  nlohmann::json byFault;
  for (const auto &[fault, times] : soak.byFault) {
    Phase window;
    window.firstToken = times;
    std::printf("  %-9s %6zu requests, p50 %6.1f ms, p99 %6.1f ms\n",
                fault.c_str(), times.size(), window.percentile(0.5) * 1e3,
                window.percentile(0.99) * 1e3);
    byFault[fault] = {{"requests", times.size()},
                      {"p50_ms", window.percentile(0.5) * 1e3},
                      {"p99_ms", window.percentile(0.99) * 1e3}};
  }
  std::printf("why chunks were recomputed, saves failed:\n");
  for (const auto &[what, count] : soak.why)
    std::printf("  %lldx %s\n", (long long)count, what.c_str());
  const int64_t failed = soak.phases[0].failed + soak.phases[1].failed,
                wrong = soak.phases[0].wrong + soak.phases[1].wrong;
  const double baseline = soak.phases[0].percentile(0.99);
  std::printf("wrong caches: %lld, failed requests: %lld; p99 with faults "
              "%.2fx the fault-free run's\n",
              (long long)wrong, (long long)failed,
              baseline > 0 ? soak.phases[1].percentile(0.99) / baseline : 0.0);

  if (!flags.json.empty()) {
    nlohmann::json out = {{"seconds", flags.seconds},
                          {"fault_free_seconds", flags.faultFree},
                          {"fault_every_seconds", flags.faultEvery},
                          {"clients", flags.clients},
                          {"prompts", flags.prompts},
                          {"tokens", flags.tokens},
                          {"tmpfs", tmpfs},
                          {"fault_free", phaseJson(soak.phases[0])},
                          {"faults", phaseJson(soak.phases[1])},
                          {"saves", soak.saves},
                          {"saves_failed", soak.savesFailed},
                          {"injected", soak.faults},
                          {"by_fault", byFault},
                          {"rss", rss},
                          {"reasons", soak.why}};
    std::ofstream file(flags.json);
    file << out.dump(1) << "\n";
    if (!file)
      return unavailable(flags.json + ": cannot write");
  }
  return failed == 0 && wrong == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  StatusOr<Flags> flags = parse(argc, argv);
  if (!flags) {
    std::fprintf(stderr, "kvc-soak: %s\n", flags.status().toString().c_str());
    return 2;
  }
  StatusOr<int> code = run(*flags);
  if (!code) {
    std::fprintf(stderr, "kvc-soak: %s\n", code.status().toString().c_str());
    return 1;
  }
  return *code;
}
