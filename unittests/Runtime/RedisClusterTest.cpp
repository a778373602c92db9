//===- RedisClusterTest.cpp - The redis-cluster:// tier and its drills ----===//
//
// Each test that needs a cluster starts its own on loopback: three masters
// with a replica each (Debian's redis-server, --cluster-enabled yes, joined
// by redis-cli --cluster create), and stops it by the PIDs it started. The
// drills kill, freeze and reshard nodes while restores run; each ends with
// a restore equal to a full prefill.
//
//===----------------------------------------------------------------------===//

#include "ExecutorFixture.h"
#include "RedisClusterTier.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvc {
namespace {

using namespace exec_test;
namespace fs = std::filesystem;

/// Runs `command` through the shell; its standard output.
std::string shell(const std::string &command) {
  std::string out;
  if (FILE *pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe))
      out.append(buffer, n);
    pclose(pipe);
  }
  return out;
}

/// Six redis-server processes of this test's own, joined into a cluster of
/// three masters with a replica each.
class RedisCluster {
public:
  static constexpr int kNodes = 6;

  RedisCluster() {
    if (system("command -v redis-server >/dev/null 2>&1 && "
               "command -v redis-cli >/dev/null 2>&1") != 0)
      return;
    dir_ = test::tempPath("redis-cluster-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Six free ports whose cluster bus ports (10000 above) are free too.
    base_ = freeBase();
    if (base_ == 0)
      return;
    for (int i = 0; i < kNodes; ++i)
      start(i);
    std::string create = "redis-cli --cluster create";
    for (int i = 0; i < kNodes; ++i)
      create += " 127.0.0.1:" + std::to_string(port(i));
    create += " --cluster-replicas 1 --cluster-yes >" + dir_ + "/create.log 2>&1";
    // Healthy: every replica in sync with its master.
    if (system(create.c_str()) != 0 || !waitHealthy()) {
      stop();
      return;
    }
    ready_ = true;
  }
  ~RedisCluster() { stop(); }

  bool ready() const { return ready_; }
  int port(int node) const { return base_ + node; }
  std::string url(const std::string &options = "") const {
    return "redis-cluster://127.0.0.1:" + std::to_string(port(0)) +
           ",127.0.0.1:" + std::to_string(port(1)) + options;
  }

  /// A redis-cli command against `node`.
  std::string cli(int node, const std::string &args) const {
    return shell("redis-cli -p " + std::to_string(port(node)) + " " + args +
                 " 2>/dev/null");
  }

  /// The nodes that are masters now.
  std::vector<int> masters() const {
    std::vector<int> out;
    for (int i = 0; i < kNodes; ++i)
      if (pids_[i] > 0 && cli(i, "ROLE").rfind("master", 0) == 0)
        out.push_back(i);
    return out;
  }

  /// The node whose master serves `slot`.
  int masterOf(int slot) const {
    for (int i : masters()) {
      std::string nodes = cli(i, "CLUSTER NODES");
      std::string me = cli(i, "CLUSTER MYID");
      me.erase(me.find_last_not_of("\r\n") + 1);
      for (size_t at = 0; at < nodes.size();) {
        size_t end = nodes.find('\n', at);
        std::string line = nodes.substr(at, end - at);
        at = end == std::string::npos ? nodes.size() : end + 1;
        if (line.rfind(me, 0) != 0 || line.find("myself") == std::string::npos)
          continue;
        // Fields 9 on: slot ranges "a-b" or "a".
        std::istringstream fields(line);
        std::string field;
        for (int f = 0; f < 8 && fields >> field; ++f) {
        }
        while (fields >> field) {
          if (field[0] == '[')
            continue;
          size_t dash = field.find('-');
          int first = std::stoi(field.substr(0, dash));
          int last =
              dash == std::string::npos ? first : std::stoi(field.substr(dash + 1));
          if (first <= slot && slot <= last)
            return i;
        }
      }
    }
    return -1;
  }

  void kill(int node) { signal(node, SIGKILL, true); }
  void freeze(int node) { signal(node, SIGSTOP, false); }
  void thaw(int node) { signal(node, SIGCONT, false); }

  /// Waits until every running node says the cluster is ok and three of
  /// them are masters (after a master's death, once its replica took over).
  bool waitHealthy(int seconds = 30) const {
    for (int tries = 0; tries < seconds * 10; ++tries) {
      bool ok = masters().size() == 3;
      for (int i = 0; i < kNodes && ok; ++i)
        if (pids_[i] > 0) {
          const std::string role = cli(i, "INFO replication");
          ok = cli(i, "CLUSTER INFO").find("cluster_state:ok") !=
                   std::string::npos &&
               (role.find("role:slave") == std::string::npos ||
                role.find("master_link_status:up") != std::string::npos);
        }
      if (ok)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  void stop() {
    for (int i = 0; i < kNodes; ++i)
      if (pids_[i] > 0) {
        ::kill(pids_[i], SIGCONT);
        signal(i, SIGKILL, true);
      }
    if (!dir_.empty())
      fs::remove_all(dir_);
  }

private:
  static bool bindable(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(uint16_t(port));
    const bool free =
        ::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)) == 0;
    ::close(fd);
    return free;
  }

  /// A base port for six nodes, picked from this process's id and checked.
  static int freeBase() {
    for (int attempt = 0; attempt < 50; ++attempt) {
      const int base = 21000 + int((getpid() * 7 + attempt * 131) % 900) * 10;
      bool free = true;
      for (int i = 0; i < kNodes && free; ++i)
        free = bindable(base + i) && bindable(base + i + 10000);
      if (free)
        return base;
    }
    return 0;
  }

  void start(int node) {
    const std::string p = std::to_string(port(node));
    const std::string conf = dir_ + "/nodes-" + p + ".conf";
    pid_t pid = fork();
    if (pid == 0) {
      execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind",
             "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file",
             conf.c_str(), "--cluster-node-timeout", "1000",
             "--cluster-replica-validity-factor", "0",
             "--repl-diskless-sync-delay", "0", "--save", "",
             "--appendonly", "no", "--dir", dir_.c_str(), "--logfile",
             (dir_ + "/" + p + ".log").c_str(), "--loglevel",
             "warning", nullptr);
      _exit(127);
    }
    pids_[node] = pid;
    for (int i = 0; i < 100; ++i) {
      if (cli(node, "PING").rfind("PONG", 0) == 0)
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  void signal(int node, int sig, bool reap) {
    if (pids_[node] <= 0)
      return;
    ::kill(pids_[node], sig);
    if (reap) {
      waitpid(pids_[node], nullptr, 0);
      pids_[node] = -1;
    }
  }

  std::string dir_;
  int base_ = 0;
  pid_t pids_[kNodes] = {-1, -1, -1, -1, -1, -1};
  bool ready_ = false;
};

TEST(RedisHashSlot, MatchesRedisCluster) {
  // The specification's check value, and slots redis-cli reports
  // (CLUSTER KEYSLOT).
  EXPECT_EQ(redisCrc16("123456789"), 0x31C3);
  EXPECT_EQ(redisHashSlot("foo"), 12182);
  EXPECT_EQ(redisHashSlot("bar"), 5061);
  // Hash tags: the first {...} with something inside.
  EXPECT_EQ(redisHashSlot("{user1000}.following"), redisHashSlot("user1000"));
  EXPECT_EQ(redisHashSlot("foo{}{bar}"), redisHashSlot("foo{}{bar}"));
  EXPECT_NE(redisHashSlot("foo{}{bar}"), redisHashSlot("bar"));
  EXPECT_EQ(redisHashSlot("foo{{bar}}zap"), redisHashSlot("{bar"));
}

TEST(RedisClusterUrl, BadUrlsAreClearErrors) {
  for (const char *url :
       {"redis-cluster://", "redis-cluster://host", "redis-cluster://h:0",
        "redis-cluster://h:1,,h:2"}) {
    StatusOr<std::unique_ptr<Tier>> tier = openTier(url);
    ASSERT_FALSE(tier.isOk()) << url;
    EXPECT_EQ(tier.status().code(), StatusCode::InvalidArgument) << url;
  }
  // Credentials never show in a message.
  StatusOr<std::unique_ptr<Tier>> secret =
      openTier("redis-cluster://user:pw-secret@127.0.0.1:1");
  ASSERT_FALSE(secret.isOk());
  EXPECT_EQ(secret.status().message().find("pw-secret"), std::string::npos)
      << secret.status().message();
  // Nobody listening: unavailable, at once.
  StatusOr<std::unique_ptr<Tier>> none = openTier("redis-cluster://127.0.0.1:1");
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(chunkFault(none.status()), ChunkFault::Unavailable);
}

class RedisClusterTest : public ExecutorTest {
protected:
  void SetUp() override {
    ExecutorTest::SetUp();
    cluster_ = std::make_unique<RedisCluster>();
    if (!cluster_->ready())
      GTEST_SKIP() << "no redis cluster (redis-server and redis-cli needed)";
  }
  void TearDown() override { cluster_.reset(); }

  /// The request's KV saved into the cluster, in 64-token objects of two
  /// layers each (spread over every node by their keys' slots).
  std::unique_ptr<ChunkStore> clusterStore(const std::string &options = "") {
    StatusOr<std::unique_ptr<Tier>> tier = openTier(cluster_->url(options));
    EXPECT_TRUE(tier.isOk()) << tier.status().toString();
    if (!tier.isOk())
      return nullptr;
    StoreLayout layout;
    layout.chunkTokens = 64;
    layout.layerGroup = 2;
    auto store = std::make_unique<ChunkStore>(
        std::shared_ptr<Tier>(std::move(*tier)), model_->config(),
        model_->fingerprint(), "", layout);
    SaveOptions save;
    save.forms = {Form::KV};
    Status saved = saveContext(*model_, *store, tokens_, save).status();
    EXPECT_TRUE(saved.isOk()) << saved.toString();
    return store;
  }

  /// Restores the request by loading every chunk from `store`; the
  /// restore's metrics, after checking it equals a full prefill.
  StatusOr<RestoreMetrics> restoreFrom(ChunkStore &store) {
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<RestoreMetrics> metrics =
        run(makePlan({0, 0, 64}, model_->config().numLayers), table, &store);
    if (metrics)
      EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
    return metrics;
  }

  std::unique_ptr<RedisCluster> cluster_;
};

TEST_F(RedisClusterTest, ObjectsSpreadOverEveryMasterAndRestoreExactly) {
  std::unique_ptr<ChunkStore> store = clusterStore();
  ASSERT_TRUE(store);
  for (int master : cluster_->masters())
    EXPECT_NE(cluster_->cli(master, "DBSIZE"), "0\n") << "node " << master;
  StatusOr<RestoreMetrics> metrics = restoreFrom(*store);
  ASSERT_TRUE(metrics) << metrics.status().toString();
  EXPECT_TRUE(metrics->fallbacks.empty());
  // Listing sees every master's objects once.
  StatusOr<std::vector<std::string>> names = store->tier().list("");
  ASSERT_TRUE(names) << names.status().toString();
  EXPECT_GE(int64_t(names->size()),
            kTokens / 64 * ((model_->config().numLayers + 1) / 2));
}

TEST_F(RedisClusterTest, ADeadMastersChunksAreRecomputedThenFailedOver) {
  std::unique_ptr<ChunkStore> store = clusterStore("?timeout_ms=2000&replicas=1");
  ASSERT_TRUE(store);
  const std::vector<int> masters = cluster_->masters();
  ASSERT_EQ(masters.size(), 3u);
  cluster_->kill(masters[0]);
  // Its chunks cannot be read until its replica takes over: recomputed.
  StatusOr<RestoreMetrics> during = restoreFrom(*store);
  ASSERT_TRUE(during) << during.status().toString();
  EXPECT_FALSE(during->fallbacks.empty());
  // After the failover, every chunk loads again (from the promoted
  // replica, found by refreshing the slot map).
  ASSERT_TRUE(cluster_->waitHealthy());
  StatusOr<RestoreMetrics> after = restoreFrom(*store);
  ASSERT_TRUE(after) << after.status().toString();
  EXPECT_TRUE(after->fallbacks.empty())
      << after->fallbacks.size() << " fallbacks, first: "
      << after->fallbacks.front();
}

TEST_F(RedisClusterTest, AFrozenNodeTimesOutAndRecovers) {
  std::unique_ptr<ChunkStore> store = clusterStore("?timeout_ms=300&replicas=1");
  ASSERT_TRUE(store);
  const int frozen = cluster_->masters()[1];
  cluster_->freeze(frozen);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<RestoreMetrics> during = restoreFrom(*store);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  cluster_->thaw(frozen);
  ASSERT_TRUE(during) << during.status().toString();
  EXPECT_FALSE(during->fallbacks.empty());
  EXPECT_LT(seconds, 30.0); // Bounded: no hang.
  ASSERT_TRUE(cluster_->waitHealthy());
  StatusOr<RestoreMetrics> after = restoreFrom(*store);
  ASSERT_TRUE(after) << after.status().toString();
  EXPECT_TRUE(after->fallbacks.empty());
}

TEST_F(RedisClusterTest, ASlotMovedWhileRestoringIsFollowed) {
  std::unique_ptr<ChunkStore> store = clusterStore();
  ASSERT_TRUE(store);
  // Move one object's slot from its master to another (MIGRATING /
  // IMPORTING, MIGRATE, then SETSLOT NODE): reads see ASK, then MOVED.
  StatusOr<std::vector<std::string>> names = store->tier().list("");
  ASSERT_TRUE(names && !names->empty());
  const std::string key = names->front();
  const int slot = redisHashSlot(key);
  const int from = cluster_->masterOf(slot);
  ASSERT_GE(from, 0);
  int to = -1;
  for (int m : cluster_->masters())
    if (m != from)
      to = m;
  auto id = [&](int node) {
    std::string out = cluster_->cli(node, "CLUSTER MYID");
    return out.substr(0, out.find_first_of("\r\n"));
  };
  const std::string s = std::to_string(slot);
  cluster_->cli(to, "CLUSTER SETSLOT " + s + " IMPORTING " + id(from));
  cluster_->cli(from, "CLUSTER SETSLOT " + s + " MIGRATING " + id(to));
  // Mid-migration: the key still on its source is read there; moved, ASK.
  StatusOr<RestoreMetrics> migrating = restoreFrom(*store);
  ASSERT_TRUE(migrating) << migrating.status().toString();
  EXPECT_TRUE(migrating->fallbacks.empty());
  cluster_->cli(from, "MIGRATE 127.0.0.1 " + std::to_string(cluster_->port(to)) +
                          " \"\" 0 5000 KEYS " + key);
  StatusOr<RestoreMetrics> asked = restoreFrom(*store);
  ASSERT_TRUE(asked) << asked.status().toString();
  EXPECT_TRUE(asked->fallbacks.empty());
  for (int m : cluster_->masters())
    cluster_->cli(m, "CLUSTER SETSLOT " + s + " NODE " + id(to));
  StatusOr<RestoreMetrics> moved = restoreFrom(*store);
  ASSERT_TRUE(moved) << moved.status().toString();
  EXPECT_TRUE(moved->fallbacks.empty());
  EXPECT_EQ(cluster_->masterOf(slot), to);
}

} // namespace
} // namespace kvc
