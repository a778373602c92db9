//===- ClusterBench.cpp - Restore read bandwidth of Redis tiers -----------===//
//
// How fast a restore's reads come out of one plain Redis and out of Redis
// Clusters of 1, 3 and 6 masters, all on loopback and started here: objects
// of the size kvc writes (by default 1 MiB, a 256-token chunk of one layer
// of a Llama-3-8B-shaped model's K and V in bf16) are written once, then
// read back by --lanes threads (a restore's IO lanes) in pipelined batches
// of --batch objects, as ChunkSteps::fetch asks a tier. Prints, per tier,
// the write and read bandwidth (best and median of --repeat rounds).
//
//   kvc-cluster-bench [--objects N] [--mib M] [--lanes L] [--batch B]
//                     [--repeat R] [--masters 1,3,6]
//
// Exits 77 without redis-server and redis-cli.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Store/Tier.h"
#include "kvc/Testing/RedisCluster.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

using namespace kvc;

namespace {

struct Options {
  int objects = 128;
  double mib = 1.0;
  int lanes = 4;
  int batch = 8;
  int repeat = 3;
  std::vector<int> masters = {1, 3, 6};
};

struct Result {
  double writeGBs = 0;
  std::vector<double> readGBs;
};

/// Writes the objects, then reads them all back --repeat times.
StatusOr<Result> measure(Tier &tier, const Options &o) {
  const size_t bytes = size_t(o.mib * (1 << 20));
  std::vector<std::string> names;
  for (int i = 0; i < o.objects; ++i)
    names.push_back("bench/" + std::to_string(i) + "/kv/0-1/raw");
  std::string payload(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i)
    payload[i] = char(i * 131 + 7);
  Result result;
  Clock::time_point start = Clock::now();
  {
    std::vector<std::thread> writers;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    for (int l = 0; l < o.lanes; ++l)
      writers.emplace_back([&] {
        for (int i; (i = next++) < o.objects;)
          if (!tier.put(names[i], payload).isOk())
            failed = true;
      });
    for (std::thread &t : writers)
      t.join();
    if (failed)
      return unavailable(tier.url() + ": a write failed");
  }
  result.writeGBs = double(bytes) * o.objects / secondsSince(start) * 1e-9;
  for (int round = 0; round < o.repeat; ++round) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    start = Clock::now();
    std::vector<std::thread> readers;
    for (int l = 0; l < o.lanes; ++l)
      readers.emplace_back([&] {
        std::vector<std::string> batch, buffers;
        for (int first; (first = next.fetch_add(o.batch)) < o.objects;) {
          batch.assign(names.begin() + first,
                       names.begin() + std::min(o.objects, first + o.batch));
          for (const Status &s : tier.getMany(batch, buffers))
            if (!s.isOk())
              failed = true;
          for (const std::string &b : buffers)
            if (b.size() != bytes)
              failed = true;
        }
      });
    for (std::thread &t : readers)
      t.join();
    if (failed)
      return unavailable(tier.url() + ": a read failed");
    result.readGBs.push_back(double(bytes) * o.objects / secondsSince(start) *
                             1e-9);
  }
  for (const std::string &name : names)
    (void)tier.remove(name);
  return result;
}

void print(const char *what, const Result &r) {
  std::vector<double> reads = r.readGBs;
  std::sort(reads.begin(), reads.end());
  std::printf("| %-28s | %8.2f | %8.2f | %8.2f |\n", what, r.writeGBs,
              reads.back(), reads[reads.size() / 2]);
  std::fflush(stdout);
}

/// A plain redis-server (no cluster) of this process's own.
class PlainRedis {
public:
  explicit PlainRedis(int port) : port_(port) {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string p = std::to_string(port);
      execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind",
             "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel",
             "warning", nullptr);
      _exit(127);
    }
  }
  ~PlainRedis() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string url() const {
    return "redis://127.0.0.1:" + std::to_string(port_);
  }

private:
  int port_;
  pid_t pid_ = -1;
};

std::vector<int> integers(const char *text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(std::atoi(item.c_str()));
  return out;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvc-cluster-bench: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--objects"))
      o.objects = std::atoi(value());
    else if (!std::strcmp(argv[i], "--mib"))
      o.mib = std::atof(value());
    else if (!std::strcmp(argv[i], "--lanes"))
      o.lanes = std::atoi(value());
    else if (!std::strcmp(argv[i], "--batch"))
      o.batch = std::atoi(value());
    else if (!std::strcmp(argv[i], "--repeat"))
      o.repeat = std::atoi(value());
    else if (!std::strcmp(argv[i], "--masters"))
      o.masters = integers(value());
    else {
      std::fprintf(stderr,
                   "usage: kvc-cluster-bench [--objects N] [--mib M] "
                   "[--lanes L] [--batch B] [--repeat R] [--masters 1,3,6]\n");
      return std::strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  if (o.objects <= 0 || o.mib <= 0 || o.lanes <= 0 || o.batch <= 0 ||
      o.repeat <= 0 || o.masters.empty()) {
    std::fprintf(stderr, "kvc-cluster-bench: every number must be positive\n");
    return 2;
  }
  if (system("command -v redis-server >/dev/null 2>&1 && "
             "command -v redis-cli >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "kvc-cluster-bench: redis-server and redis-cli are "
                         "needed; skipped\n");
    return 77;
  }
  std::printf("%d objects of %.2f MiB, %d lanes reading batches of %d; "
              "GB/s, best and median of %d rounds\n\n",
              o.objects, o.mib, o.lanes, o.batch, o.repeat);
  std::printf("| tier                         |    write | read best | read median |\n"
              "|---|---|---|---|\n");
  {
    PlainRedis plain(20999 - int(getpid() % 900));
    StatusOr<std::unique_ptr<Tier>> tier = openTier(plain.url());
    for (int i = 0; i < 100 && !tier.isOk(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      tier = openTier(plain.url());
    }
    if (!tier.isOk()) {
      std::fprintf(stderr, "kvc-cluster-bench: %s\n",
                   tier.status().toString().c_str());
      return 1;
    }
    StatusOr<Result> r = measure(**tier, o);
    if (!r.isOk()) {
      std::fprintf(stderr, "kvc-cluster-bench: %s\n",
                   r.status().toString().c_str());
      return 1;
    }
    print("redis:// (one server)", *r);
  }
  for (int masters : o.masters) {
    test::RedisCluster cluster("/tmp/kvc-cluster-bench-" +
                                   std::to_string(getpid()),
                               masters, 0);
    if (!cluster.ready()) {
      std::fprintf(stderr, "kvc-cluster-bench: a cluster of %d masters did "
                           "not come up\n",
                   masters);
      return 1;
    }
    StatusOr<std::unique_ptr<Tier>> tier = openTier(cluster.url());
    StatusOr<Result> r = tier.isOk() ? measure(**tier, o)
                                     : StatusOr<Result>(tier.status());
    if (!r.isOk()) {
      std::fprintf(stderr, "kvc-cluster-bench: %s\n",
                   r.status().toString().c_str());
      return 1;
    }
    const std::string what =
        "redis-cluster:// " + std::to_string(masters) + " master" +
        (masters > 1 ? "s" : "");
    print(what.c_str(), *r);
  }
  return 0;
}
