//===- StoreTest.cpp - Tiers, chunk checks and the save path --------------===//

#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Save/SavePlan.h"
#include "kvc/Runtime/Save/Saver.h"
#include "kvc/Runtime/Store/ChunkStore.h"
#include "kvc/Testing/RedisCluster.h"

#include "StoreObjects.h"
#include "TestModel.h"
#include "Tolerance.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <random>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace kvc;

namespace {

namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// A redis-server of the test's own on loopback.
//===----------------------------------------------------------------------===//

class RedisServer {
public:
  RedisServer() {
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
      return;
    port_ = 20000 + int(getpid() % 20000);
    pid_ = fork();
    if (pid_ == 0) {
      std::string port = std::to_string(port_);
      execlp("redis-server", "redis-server", "--port", port.c_str(),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--loglevel", "warning", nullptr);
      _exit(127);
    }
    // Wait until it answers.
    for (int i = 0; i < 100; ++i) {
      if (openTier(url()).isOk())
        return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop();
  }
  ~RedisServer() { stop(); }
  bool running() const { return pid_ > 0; }
  std::string url() const {
    return "redis://127.0.0.1:" + std::to_string(port_);
  }
  int port() const { return port_; }
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

private:
  int port_ = 0;
  pid_t pid_ = -1;
};

RedisServer &redis() {
  static RedisServer server;
  return server;
}

/// Three masters of a Redis Cluster of this process's own (no replicas).
test::RedisCluster &cluster() {
  static test::RedisCluster cluster(
      test::tempPath("store-test-cluster-" + std::to_string(getpid())), 3, 0);
  return cluster;
}

//===----------------------------------------------------------------------===//
// Tiers
//===----------------------------------------------------------------------===//

std::string tempDir(const std::string &name) {
  std::string dir = test::tempPath("store-test-" + name);
  fs::remove_all(dir);
  return dir;
}

class EveryTier : public ::testing::TestWithParam<std::string> {
protected:
  /// The tier under test, opened for each test (skipped where its server
  /// cannot run).
  void SetUp() override {
    tier_ = open();
    if (!tier_)
      GTEST_SKIP() << "redis-server (and redis-cli) are not installed";
  }

  std::unique_ptr<Tier> tier_;

private:
  std::unique_ptr<Tier> open() {
    std::string kind = GetParam();
    if (kind == "redis" && !redis().running())
      return nullptr;
    if (kind == "cluster" && !cluster().ready())
      return nullptr;
    std::string url = kind == "mem"     ? "mem://"
                      : kind == "file"  ? "file://" + tempDir("tier")
                      : kind == "redis" ? redis().url()
                                        : cluster().url();
    StatusOr<std::unique_ptr<Tier>> tier = openTier(url);
    EXPECT_TRUE(tier.isOk()) << tier.status().toString();
    return tier.isOk() ? std::move(*tier) : nullptr;
  }
};

TEST_P(EveryTier, PutGetListRemove) {
  Tier *tier = tier_.get();
  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(tier->put("p1/kv/0-4", binary).isOk());
  ASSERT_TRUE(tier->put("p1/hidden/0-4", "hidden").isOk());
  ASSERT_TRUE(tier->put("p2/kv/0-4", "other").isOk());
  std::string buffer;
  ASSERT_TRUE(tier->get("p1/kv/0-4", buffer).isOk());
  EXPECT_EQ(buffer, binary); // Binary-safe.
  EXPECT_TRUE(*tier->exists("p2/kv/0-4"));
  EXPECT_EQ(*tier->list("p1/"),
            (std::vector<std::string>{"p1/hidden/0-4", "p1/kv/0-4"}));
  std::vector<std::string> buffers;
  std::vector<Status> many =
      tier->getMany({"p1/kv/0-4", "nope", "p2/kv/0-4"}, buffers);
  EXPECT_TRUE(many[0].isOk());
  EXPECT_EQ(chunkFault(many[1]), ChunkFault::Missing);
  EXPECT_EQ(buffers[2], "other");
  ASSERT_TRUE(tier->remove("p2/kv/0-4").isOk());
  Status gone = tier->get("p2/kv/0-4", buffer);
  EXPECT_EQ(gone.code(), StatusCode::NotFound);
  EXPECT_EQ(chunkFault(gone), ChunkFault::Missing);
}

// getInto puts an object into the caller's parts when their sizes add up to
// its own, and otherwise says its size (the reader then reads it whole);
// a missing object is Missing, as for get.
TEST_P(EveryTier, GetIntoFillsThePartsOrSaysTheSize) {
  Tier *tier = tier_.get();
  std::string bytes("header|pay\0load", 15);
  ASSERT_TRUE(tier->put("o/kv/0-4", bytes).isOk());
  std::string head(7, '?'), tail(8, '?');
  StatusOr<size_t> got =
      tier->getInto("o/kv/0-4", {{head.data(), 7}, {tail.data(), 8}});
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, 15u);
  EXPECT_EQ(head + tail, bytes);
  std::string shorter(14, '?');
  got = tier->getInto("o/kv/0-4", {{shorter.data(), 14}});
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, 15u);
  got = tier->getInto("o/kv/none", {{shorter.data(), 14}});
  EXPECT_EQ(chunkFault(got.status()), ChunkFault::Missing);
  // Reading in place is what the local tiers do; the others read through
  // get().
  EXPECT_EQ(tier->readsInPlace(), GetParam() == "mem" || GetParam() == "file");
}

INSTANTIATE_TEST_SUITE_P(Tiers, EveryTier,
                         ::testing::Values("mem", "file", "redis", "cluster"));

TEST(RedisTier, PipelinedGetsReadEveryKindOfReply) {
  if (!redis().running() ||
      system("command -v redis-cli >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "redis-server or redis-cli is not installed";
  std::shared_ptr<Tier> tier = std::move(*openTier(redis().url() + "/2"));
  // Larger than the reply header buffer and the socket buffers.
  std::string large(3 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i)
    large[i] = char(i * 2654435761u >> 13);
  ASSERT_TRUE(tier->put("large", large).isOk());
  ASSERT_TRUE(tier->put("empty", "").isOk());
  ASSERT_TRUE(tier->put("crlf", "\r\n$5\r\n").isOk());
  std::string port = std::to_string(redis().port());
  ASSERT_EQ(system(("redis-cli -p " + port +
                    " -n 2 rpush a-list x >/dev/null").c_str()),
            0);
  std::vector<std::string> buffers(5, "stale");
  std::vector<Status> got = tier->getMany(
      {"large", "a-list", "empty", "missing", "crlf"}, buffers);
  ASSERT_TRUE(got[0].isOk()) << got[0].toString();
  EXPECT_EQ(buffers[0], large);
  // A reply of the wrong type is this object's error, not the stream's.
  EXPECT_EQ(chunkFault(got[1]), ChunkFault::Unavailable);
  EXPECT_NE(got[1].message().find("WRONGTYPE"), std::string::npos)
      << got[1].toString();
  ASSERT_TRUE(got[2].isOk());
  EXPECT_EQ(buffers[2], "");
  EXPECT_EQ(chunkFault(got[3]), ChunkFault::Missing);
  ASSERT_TRUE(got[4].isOk());
  EXPECT_EQ(buffers[4], "\r\n$5\r\n");
  // The connection is still in step: a plain GET follows.
  std::string buffer;
  ASSERT_TRUE(tier->get("crlf", buffer).isOk());
  EXPECT_EQ(buffer, buffers[4]);
}

// Callers on many threads (an executor's IO lanes) share the tier: each
// takes a connection of its own, and every reply lands with its caller.
TEST(RedisTier, ConcurrentCallersEachGetTheirOwnObjects) {
  if (!redis().running())
    GTEST_SKIP() << "redis-server is not installed";
  std::shared_ptr<Tier> tier = std::move(*openTier(redis().url() + "/3"));
  constexpr int kThreads = 12, kObjects = 20; // More threads than connections.
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<std::string> names;
      for (int i = 0; i < kObjects; ++i) {
        names.push_back("t" + std::to_string(t) + "/" + std::to_string(i));
        std::string value(1000 + 37 * i, char('a' + t));
        if (!tier->put(names.back(), value).isOk())
          ++wrong[t];
      }
      for (int round = 0; round < 5; ++round) {
        std::vector<std::string> buffers;
        std::vector<Status> got = tier->getMany(names, buffers);
        for (int i = 0; i < kObjects; ++i)
          if (!got[i].isOk() || buffers[i] != std::string(1000 + 37 * i,
                                                          char('a' + t)))
            ++wrong[t];
        std::string one;
        if (!tier->get(names[round], one).isOk() ||
            one != std::string(1000 + 37 * round, char('a' + t)))
          ++wrong[t];
      }
    });
  for (std::thread &thread : threads)
    thread.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(wrong[t], 0) << "thread " << t;
  // They did not queue on one socket: the tier holds several connections
  // (to database 3, which only this test uses).
  if (system("command -v redis-cli >/dev/null 2>&1") == 0) {
    std::string port = std::to_string(redis().port());
    std::string command =
        "test $(redis-cli -p " + port + " CLIENT LIST | grep -c ' db=3 ') -gt 1";
    EXPECT_EQ(system(command.c_str()), 0);
  }
}

/// A one-shot server on loopback that answers the first request of its one
/// client with `reply` and closes the connection.
class CannedServer {
public:
  explicit CannedServer(std::string reply) : reply_(std::move(reply)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(listener_, reinterpret_cast<sockaddr *>(&address), length) ||
        ::listen(listener_, 1) ||
        ::getsockname(listener_, reinterpret_cast<sockaddr *>(&address),
                      &length))
      return;
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0)
        return;
      char request[4096];
      if (::read(client, request, sizeof(request)) > 0)
        (void)!::write(client, reply_.data(), reply_.size());
      ::close(client);
    });
  }
  ~CannedServer() {
    ::shutdown(listener_, SHUT_RDWR);
    if (thread_.joinable())
      thread_.join();
    ::close(listener_);
  }
  std::string url() const {
    return "redis://127.0.0.1:" + std::to_string(port_);
  }
  int port() const { return port_; }

private:
  std::string reply_;
  int listener_ = -1, port_ = 0;
  std::thread thread_;
};

// A server that lies about a value's size or hangs up in the middle of one
// costs an Unavailable error for the objects not read, never a crash.
TEST(RedisTier, SurvivesMalformedAndCutReplies) {
  for (auto [reply, why] :
       {std::pair<std::string, std::string>{"$1099511627776000\r\n",
                                            "cannot hold a reply"},
        {"$10\r\nabc", "server closed the connection"},
        {"$3\r\nabcXY", "malformed reply"},
        {"*1\r\n$1\r\na\r\n", "unexpected reply"},
        {"$x\r\n", "malformed reply header"}}) {
    CannedServer server(reply);
    StatusOr<std::unique_ptr<Tier>> tier = openTier(server.url());
    ASSERT_TRUE(tier.isOk()) << tier.status().toString();
    std::vector<std::string> buffers;
    std::vector<Status> got = (*tier)->getMany({"a", "b"}, buffers);
    for (const Status &status : got) {
      EXPECT_EQ(chunkFault(status), ChunkFault::Unavailable) << reply;
      EXPECT_NE(status.message().find(why), std::string::npos)
          << status.toString();
    }
  }
}

// A cluster node that answers the slot map with garbage, or a map whose
// slots are not all served: a clear error, at once, never a hang.
TEST(RedisClusterTier, GarbageAndUncoveredSlotsAreClearErrors) {
  for (auto [reply, why] :
       {std::pair<std::string, std::string>{"+OK\r\n",
                                            "unexpected CLUSTER SLOTS reply"},
        {"*1\r\n*1\r\n:0\r\n", "malformed CLUSTER SLOTS range"},
        {"*0\r\n", "serves no slots"}}) {
    CannedServer server(reply);
    StatusOr<std::unique_ptr<Tier>> tier = openTier(
        "redis-cluster://127.0.0.1:" + std::to_string(server.port()));
    ASSERT_FALSE(tier.isOk()) << reply;
    EXPECT_EQ(chunkFault(tier.status()), ChunkFault::Unavailable);
    EXPECT_NE(tier.status().message().find(why), std::string::npos)
        << tier.status().toString();
  }
  // Slots 0 to 100 served by a node nobody runs; every other slot by none.
  CannedServer partial("*1\r\n*3\r\n:0\r\n:100\r\n*2\r\n$9\r\n127.0.0.1\r\n"
                       ":1\r\n");
  StatusOr<std::unique_ptr<Tier>> tier = openTier(
      "redis-cluster://127.0.0.1:" + std::to_string(partial.port()) +
      "?timeout_ms=200");
  ASSERT_TRUE(tier.isOk()) << tier.status().toString();
  const auto start = std::chrono::steady_clock::now();
  std::string buffer;
  Status got = (*tier)->get("foo", buffer); // Slot 12182.
  EXPECT_EQ(chunkFault(got), ChunkFault::Unavailable) << got.toString();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          start)
                .count(),
            10.0);
}

TEST(MemTier, EvictsLeastRecentlyUsed) {
  auto tier = std::move(*openTier("mem://?capacity_mb=0.000016")); // 16 bytes.
  ASSERT_TRUE(tier->put("a", "12345678").isOk());
  ASSERT_TRUE(tier->put("b", "12345678").isOk());
  std::string buffer;
  ASSERT_TRUE(tier->get("a", buffer).isOk()); // a is now the most recent.
  ASSERT_TRUE(tier->put("c", "12345678").isOk());
  EXPECT_TRUE(*tier->exists("a"));
  EXPECT_FALSE(*tier->exists("b"));
  EXPECT_FALSE(tier->put("big", std::string(64, 'x')).isOk());
}

// A tier of a new scheme is one TierScheme registered: openTier opens its
// URLs (the scheme's own options taken, any other refused before it opens,
// credentials kept out of its name, gbps and key_file as for every tier),
// and its kind is what a target prices it as.
TEST(TierScheme, ANewSchemeOpensThroughTheRegistry) {
  struct Seen {
    std::string location, size, user;
    int opened = 0;
  };
  auto seen = std::make_shared<Seen>();
  registerTierScheme({"toy",
                      TierDesc::Kind::DRAM,
                      "toy://NAME",
                      {"size"},
                      true,
                      [seen](TierUrl &url) -> StatusOr<std::unique_ptr<Tier>> {
                        ++seen->opened;
                        seen->location = url.location;
                        seen->size = url.take("size").value_or("");
                        seen->user = url.user;
                        return openTier("mem://");
                      }});
  StatusOr<std::unique_ptr<Tier>> tier =
      openTier("toy://alice:secret@shelf?size=3&gbps=100");
  ASSERT_TRUE(tier) << tier.status().toString();
  EXPECT_EQ(seen->location, "shelf");
  EXPECT_EQ(seen->size, "3");
  EXPECT_EQ(seen->user, "alice");
  EXPECT_EQ((*tier)->url(), "toy://shelf?size=3&gbps=100"); // The throttle's.
  EXPECT_DOUBLE_EQ((*tier)->throttleGBs(), 12.5);
  ASSERT_TRUE((*tier)->put("a", "1").isOk());

  Status unknown = openTier("toy://shelf?colour=red").status();
  EXPECT_EQ(unknown.code(), StatusCode::InvalidArgument);
  EXPECT_NE(unknown.message().find("unknown option colour"), std::string::npos);
  EXPECT_EQ(seen->opened, 1); // Refused before it opened.
  StatusOr<TierScheme> scheme = tierSchemeOf("toy://shelf");
  ASSERT_TRUE(scheme);
  EXPECT_EQ(scheme->kind, TierDesc::Kind::DRAM);
  Status none = openTier("nope://x").status();
  EXPECT_EQ(none.code(), StatusCode::InvalidArgument);
  EXPECT_NE(none.message().find("toy://NAME"), std::string::npos);
  EXPECT_NE(none.message().find("file:///DIR"), std::string::npos);
}

// `mem://?from=DIR` holds what the file store at DIR holds, byte for byte,
// and refuses a store it cannot hold whole rather than evict part of it.
TEST(MemTier, IsFilledFromAFileStore) {
  const std::string dir = tempDir("fill-from");
  auto file = std::move(*openTier("file://" + dir));
  ASSERT_TRUE(file->put("k/kv/0-1", std::string(4096, 'a')).isOk());
  ASSERT_TRUE(file->put("k/layout", "layout").isOk());
  StatusOr<std::unique_ptr<Tier>> memory = openTier("mem://?from=" + dir);
  ASSERT_TRUE(memory) << memory.status().toString();
  EXPECT_EQ(*(*memory)->list(""), *file->list(""));
  std::string bytes;
  ASSERT_TRUE((*memory)->get("k/kv/0-1", bytes).isOk());
  EXPECT_EQ(bytes, std::string(4096, 'a'));
  ASSERT_TRUE((*memory)->get("k/layout", bytes).isOk());
  EXPECT_EQ(bytes, "layout");

  Status small =
      openTier("mem://?capacity_mb=0.001&from=" + dir).status(); // 1 KiB.
  EXPECT_EQ(small.code(), StatusCode::FailedPrecondition) << small.toString();
  EXPECT_NE(small.message().find("capacity"), std::string::npos);
  EXPECT_EQ(openTier("mem://?from=" + dir + "/none").status().code(),
            StatusCode::NotFound);
  EXPECT_EQ(openTier("mem://?from=relative").status().code(),
            StatusCode::InvalidArgument);
  // Only a memory tier is filled.
  EXPECT_EQ(openTier("file://" + dir + "?from=" + dir).status().code(),
            StatusCode::InvalidArgument);
  fs::remove_all(dir);
}

TEST(FileTier, WritesAtomically) {
  std::string dir = tempDir("atomic");
  auto tier = std::move(*openTier("file://" + dir));
  ASSERT_TRUE(tier->put("k/kv/0-1", std::string(1 << 20, 'x')).isOk());
  // No temporary file is left, and listing never shows one.
  for (const auto &entry : fs::recursive_directory_iterator(dir))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos);
  // Concurrent readers and a writer replacing the object: readers see
  // either the old or the new object in full.
  std::atomic<bool> torn{false};
  std::thread writer([&] {
    for (int i = 0; i < 20; ++i)
      (void)tier->put("k/kv/0-1", std::string(1 << 20, char('a' + i % 2)));
  });
  std::thread reader([&] {
    std::string buffer;
    for (int i = 0; i < 50; ++i)
      if (tier->get("k/kv/0-1", buffer).isOk() &&
          (buffer.size() != (1 << 20) ||
           buffer.find_first_not_of(buffer[0]) != std::string::npos))
        torn = true;
  });
  writer.join();
  reader.join();
  EXPECT_FALSE(torn);
}

// A file:// store with a capacity keeps itself within it: past it, the
// objects used least recently go (a read is a use), down to 90%; layout
// records stay.
TEST(FileTier, EvictsWhatWasUsedLeastRecently) {
  std::string dir = tempDir("capacity");
  auto tier = std::move(*openTier("file://" + dir + "?capacity_mb=1",
                                  TierAccess::Create));
  const std::string object(200 << 10, 'x'); // 200 KiB: five fit in 1 MiB.
  ASSERT_TRUE(tier->put("layouts/model/64x1", "layout").isOk());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(tier->put("k" + std::to_string(i) + "/kv/0-1", object).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string buffer;
  ASSERT_TRUE(tier->get("k0/kv/0-1", buffer).isOk()); // k1 is now the oldest.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 4; i < 7; ++i) {
    ASSERT_TRUE(tier->put("k" + std::to_string(i) + "/kv/0-1", object).isOk());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::uintmax_t total = 0;
  for (const auto &entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      total += entry.file_size();
  EXPECT_LE(total, std::uintmax_t(1) << 20);
  EXPECT_FALSE(*tier->exists("k1/kv/0-1"));
  EXPECT_FALSE(*tier->exists("k2/kv/0-1"));
  EXPECT_TRUE(*tier->exists("k0/kv/0-1")); // Read after k1, k2 were written.
  EXPECT_TRUE(*tier->exists("k6/kv/0-1"));
  EXPECT_TRUE(*tier->exists("layouts/model/64x1"));
  // Without a capacity nothing is evicted.
  std::string unbounded = tempDir("unbounded");
  auto plain = std::move(*openTier("file://" + unbounded, TierAccess::Create));
  for (int i = 0; i < 7; ++i)
    ASSERT_TRUE(plain->put("k" + std::to_string(i) + "/kv/0-1", object).isOk());
  EXPECT_TRUE(*plain->exists("k0/kv/0-1"));
  fs::remove_all(dir);
  fs::remove_all(unbounded);
}

// A Redis tier with a TTL: objects expire that long after their last use.
TEST(RedisTier, ObjectsExpireAfterTheirLastUse) {
  if (!redis().running())
    GTEST_SKIP() << "redis-server is not installed";
  auto tier = std::move(*openTier(redis().url() + "?ttl_s=2"));
  ASSERT_TRUE(tier->put("ttl/used", "a").isOk());
  ASSERT_TRUE(tier->put("ttl/unused", "b").isOk());
  std::string buffer;
  for (int i = 0; i < 3; ++i) { // 3 s, read every second: renewed.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::vector<std::string> buffers;
    EXPECT_TRUE(tier->getMany({"ttl/used"}, buffers).front().isOk()) << i;
  }
  EXPECT_TRUE(tier->get("ttl/used", buffer).isOk());
  EXPECT_EQ(chunkFault(tier->get("ttl/unused", buffer)), ChunkFault::Missing);
}

// An object that is no regular file (a FIFO, a directory) is a corrupt
// one, reported at once: opening a FIFO to read it used to wait forever for
// a writer.
TEST(FileTier, ObjectsThatAreNoFilesAreCorrupt) {
  std::string dir = tempDir("fifo");
  auto tier = std::move(*openTier("file://" + dir));
  fs::create_directories(fs::path(dir) / "k" / "kv");
  ASSERT_EQ(::mkfifo((fs::path(dir) / "k/kv/0-1").c_str(), 0600), 0);
  fs::create_directories(fs::path(dir) / "k/kv/1-2");
  std::string buffer;
  for (const char *name : {"k/kv/0-1", "k/kv/1-2"}) {
    Status got = tier->get(name, buffer);
    EXPECT_EQ(got.code(), StatusCode::DataLoss) << got.toString();
    EXPECT_NE(got.message().find("not a regular file"), std::string::npos)
        << got.message();
  }
}

// A database number the server refuses is named as such (it used to read
// "connection lost").
TEST(Tiers, ARefusedRedisDatabaseIsNamed) {
  if (!redis().running())
    GTEST_SKIP() << "redis-server is not installed";
  StatusOr<std::unique_ptr<Tier>> tier = openTier(redis().url() + "/99999");
  ASSERT_FALSE(tier.isOk());
  EXPECT_EQ(tier.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(tier.status().message().find("database 99999 refused by the "
                                         "server: ERR DB index is out of "
                                         "range"),
            std::string::npos)
      << tier.status().message();
}

// A password or an ACL user, from the URL or the environment; a wrong one
// is a clear error that never echoes it.
TEST(Tiers, RedisCredentials) {
  if (!redis().running())
    GTEST_SKIP() << "redis-server is not installed";
  const std::string port = std::to_string(redis().port());
  auto cli = [&](const std::string &args) {
    return system(("redis-cli -p " + port + " " + args + " >/dev/null 2>&1")
                      .c_str());
  };
  ASSERT_EQ(cli("ACL SETUSER kvc-test on '>acl-pass-42' '~*' '+@all'"), 0);
  ASSERT_EQ(cli("CONFIG SET requirepass shared-pass-17"), 0);
  const std::string at = "127.0.0.1:" + port;
  StatusOr<std::unique_ptr<Tier>> wrong =
      openTier("redis://:not-the-pass-99@" + at);
  ASSERT_FALSE(wrong.isOk());
  EXPECT_EQ(wrong.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(wrong.status().message().find("refused the credentials"),
            std::string::npos);
  EXPECT_EQ(wrong.status().message().find("not-the-pass-99"),
            std::string::npos);
  for (const std::string &url :
       {"redis://:shared-pass-17@" + at, "redis://kvc-test:acl-pass-42@" + at}) {
    StatusOr<std::unique_ptr<Tier>> tier = openTier(url);
    ASSERT_TRUE(tier.isOk()) << tier.status().toString();
    EXPECT_EQ((*tier)->url().find("pass"), std::string::npos) << (*tier)->url();
    ASSERT_TRUE((*tier)->put("credentials", "x").isOk());
  }
  setenv("KVC_REDIS_PASSWORD", "shared-pass-17", 1);
  StatusOr<std::unique_ptr<Tier>> fromEnv = openTier("redis://" + at);
  unsetenv("KVC_REDIS_PASSWORD");
  ASSERT_TRUE(fromEnv.isOk()) << fromEnv.status().toString();
  std::string value;
  EXPECT_TRUE((*fromEnv)->get("credentials", value).isOk());
  // Without a password: refused, by the first command.
  StatusOr<std::unique_ptr<Tier>> none = openTier("redis://" + at);
  if (none.isOk()) {
    Status put = (*none)->put("credentials", "y");
    EXPECT_FALSE(put.isOk());
  }
  ASSERT_EQ(cli("-a shared-pass-17 --no-auth-warning CONFIG SET requirepass "
                "''"),
            0);
  cli("ACL DELUSER kvc-test");
}

TEST(Tiers, BadURLsAndUnreachableServers) {
  EXPECT_EQ(openTier("s3://bucket").status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(openTier("file://relative/dir").status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(openTier("mem://?gbps=-1").status().code(),
            StatusCode::InvalidArgument);
  EXPECT_EQ(openTier("mem://?speed=1").status().code(),
            StatusCode::InvalidArgument);
  // Reading needs the store to exist; saving creates it.
  const std::string missing = test::tempPath("missing-store");
  std::filesystem::remove_all(missing);
  StatusOr<std::unique_ptr<Tier>> absent =
      openTier("file://" + missing, TierAccess::Existing);
  ASSERT_FALSE(absent.isOk());
  EXPECT_EQ(absent.status().code(), StatusCode::NotFound);
  EXPECT_FALSE(std::filesystem::exists(missing));
  // Saving creates it with its first object: a save that writes nothing
  // leaves no empty store behind.
  StatusOr<std::unique_ptr<Tier>> created =
      openTier("file://" + missing + "/store", TierAccess::Create);
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  EXPECT_FALSE(std::filesystem::exists(missing));
  ASSERT_TRUE((*created)->put("a/b/object", "bytes").isOk());
  EXPECT_TRUE(
      openTier("file://" + missing + "/store", TierAccess::Existing).isOk());
  // Removing an object removes the directories it leaves empty, not the
  // store's own.
  ASSERT_TRUE((*created)->remove("a/b/object").isOk());
  EXPECT_FALSE(std::filesystem::exists(missing + "/store/a"));
  EXPECT_TRUE(std::filesystem::is_directory(missing + "/store"));
  // A store under a file cannot be created, and says so when opened.
  std::ofstream(missing + "/file") << "x";
  StatusOr<std::unique_ptr<Tier>> underFile =
      openTier("file://" + missing + "/file/store", TierAccess::Create);
  ASSERT_FALSE(underFile.isOk());
  EXPECT_NE(underFile.status().message().find("is no writable directory"),
            std::string::npos)
      << underFile.status().toString();
  std::filesystem::remove_all(missing);
  // Nothing listens on port 1.
  StatusOr<std::unique_ptr<Tier>> down = openTier("redis://127.0.0.1:1");
  ASSERT_FALSE(down.isOk());
  EXPECT_EQ(down.status().code(), StatusCode::Unavailable);
  EXPECT_EQ(chunkFault(down.status()), ChunkFault::Unavailable);
  EXPECT_NE(down.status().message().find("cannot connect to redis"),
            std::string::npos);
}

TEST(Tiers, ThrottleLimitsBandwidth) {
  // 8 MiB at 0.5 Gbps (62.5 MB/s) takes at least 0.13 s.
  auto tier = std::move(*openTier("mem://?gbps=0.5"));
  std::string payload(1 << 20, 'x');
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i)
    ASSERT_TRUE(tier->put("o" + std::to_string(i), payload).isOk());
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  EXPECT_GT(seconds, 8.0 * (1 << 20) / 62.5e6 * 0.95);
}

TEST(Tiers, ThrottledTransfersOverlapTheInnerTiersWork) {
  // A store whose reads take 300 ms of host work, behind a link that needs
  // 300 ms for the object: the read and the link's time pass together (a
  // network card's DMA runs beside the host), about 300 ms, not 600.
  struct SlowReads final : ForwardingTier {
    SlowReads() : ForwardingTier(std::move(*openTier("mem://"))) {}
    Status get(const std::string &name, std::string &buffer) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return inner().get(name, buffer);
    }
  };
  std::unique_ptr<Tier> tier =
      throttleTier(std::make_unique<SlowReads>(), 0.1, "slow://");
  const std::string payload(3750000, 'x'); // 300 ms at 0.1 Gbps.
  ASSERT_TRUE(tier->put("o", payload).isOk());
  std::string read;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(tier->get("o", read).isOk());
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(read, payload);
  EXPECT_GE(seconds, 0.3);
  EXPECT_LT(seconds, 0.5);
}

//===----------------------------------------------------------------------===//
// Keys and checked chunks
//===----------------------------------------------------------------------===//

TEST(PrefixKeys, SharedPrefixesShareKeysAndTenantsNever) {
  std::vector<int32_t> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i)
    a[i] = b[i] = i % 97;
  b[700] = 5; // Diverges in the third chunk of 256.
  PrefixKeys keys("f00d", "", 256), tenant("f00d", "acme", 256),
      model("beef", "", 256);
  std::vector<Digest> ka = keys.keys(a.data(), 1000),
                      kb = keys.keys(b.data(), 1000);
  ASSERT_EQ(ka.size(), 4u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  EXPECT_NE(ka[3], kb[3]); // Chained: everything after differs.
  EXPECT_NE(tenant.keys(a.data(), 256)[0], ka[0]);
  EXPECT_NE(model.keys(a.data(), 256)[0], ka[0]);
  // Stable across processes: no seed enters it.
  EXPECT_EQ(toHex(keys.keys(a.data(), 3)[0]),
            toHex(PrefixKeys("f00d", "", 256).keys(a.data(), 3)[0]));
}

/// A small model and a store on `url` for it.
struct Fixture {
  std::string modelDir;
  std::unique_ptr<LlamaModel> model;
  std::vector<int32_t> tokens;

  explicit Fixture(uint64_t seed = 11) {
    modelDir = kvc::test::generateTestModel(
        "store-model-" + std::to_string(seed), seed);
    model = std::move(*LlamaModel::load(modelDir));
    std::mt19937_64 rng(3);
    tokens.resize(300);
    for (int32_t &t : tokens)
      t = int32_t(rng() % 512);
  }

  ChunkStore store(std::shared_ptr<Tier> tier, const std::string &salt = "") {
    StoreLayout layout;
    layout.chunkTokens = 128;
    layout.layerGroup = 2;
    return ChunkStore(std::move(tier), model->config(), model->fingerprint(),
                      salt, layout);
  }
};

TEST(ChunkStore, SaveIsIdempotentAndRestoresExactly) {
  Fixture f;
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://"));
  ChunkStore store = f.store(tier);
  SaveOptions options;
  StatusOr<SaveStats> first = saveContext(*f.model, store, f.tokens, options);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  // 3 token chunks x 2 layer groups x 2 forms.
  EXPECT_EQ(first->written, 12);
  StatusOr<SaveStats> second = saveContext(*f.model, store, f.tokens, options);
  ASSERT_TRUE(second.isOk());
  EXPECT_EQ(second->written, 0);
  EXPECT_EQ(second->skipped, 12);

  // Saved hidden states projected with W_k, W_v (+RoPE) reproduce the saved
  // K and V within bf16 rounding.
  const int64_t kv = f.model->kvDim(), h = f.model->config().hiddenSize;
  for (const ChunkRef &hidden :
       store.refs(f.tokens.data(), 300, Form::Hidden, CodecSpec())) {
    ChunkRef kvRef = hidden;
    kvRef.form = Form::KV;
    std::vector<float> hs(store.shape(hidden).numel()),
        saved(store.shape(kvRef).numel());
    ASSERT_TRUE(store.get(hidden, hs.data()).isOk());
    ASSERT_TRUE(store.get(kvRef, saved.data()).isOk());
    int64_t n = hidden.tokenEnd - hidden.tokenBegin;
    for (int64_t l = 0; l < hidden.layerEnd - hidden.layerBegin; ++l) {
      std::vector<float> k(n * kv), v(n * kv);
      f.model->project(hidden.layerBegin + l, hs.data() + l * n * h, n,
                       hidden.tokenBegin, k.data(), v.data());
      const float *sk = saved.data() + (2 * l) * n * kv;
      const float *sv = sk + n * kv;
      EXPECT_LT(test::relativeMaxError(k.data(), sk, size_t(n * kv)),
                2 * test::kOneBf16Step)
          << hidden.name() << " layer " << l << " K";
      EXPECT_LT(test::relativeMaxError(v.data(), sv, size_t(n * kv)),
                2 * test::kOneBf16Step)
          << hidden.name() << " layer " << l << " V";
    }
  }
}

// Encodings of a chunk live side by side: a save with another codec adds
// its objects and leaves the stored ones, a read gets the encoding it names
// (another encoding's bytes under that name are refused), a save in a
// stored codec skips what is there, and a corrupt object is rewritten.
TEST(ChunkStore, EncodingsOfAChunkLiveSideBySide) {
  Fixture f;
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://"));
  ChunkStore store = f.store(tier);
  SaveOptions int2;
  int2.forms = {Form::KV};
  int2.codec = *parseCodecSpec("int2");
  ASSERT_TRUE(saveContext(*f.model, store, f.tokens, int2).isOk());
  SaveOptions raw = int2;
  raw.codec = CodecSpec();
  StatusOr<SaveStats> both = saveContext(*f.model, store, f.tokens, raw);
  ASSERT_TRUE(both.isOk()) << both.status().toString();
  std::vector<ChunkRef> rawRefs =
      store.refs(f.tokens.data(), 300, Form::KV, raw.codec);
  std::vector<ChunkRef> int2Refs =
      store.refs(f.tokens.data(), 300, Form::KV, int2.codec);
  EXPECT_EQ(both->written, int64_t(rawRefs.size()));
  EXPECT_EQ(both->skipped, 0);
  for (size_t i = 0; i < rawRefs.size(); ++i) {
    StatusOr<std::vector<CodecSpec>> codecs = store.encodings(rawRefs[i]);
    ASSERT_TRUE(codecs.isOk());
    ASSERT_EQ(codecs->size(), 2u);
    EXPECT_EQ((*codecs)[0].str(), "int2/g32");
    EXPECT_EQ((*codecs)[1].str(), "raw");
    // Each name reads back its own encoding.
    std::vector<float> exact(store.shape(rawRefs[i]).numel()),
        lossy(exact.size());
    ASSERT_TRUE(store.get(rawRefs[i], exact.data()).isOk());
    ASSERT_TRUE(store.get(int2Refs[i], lossy.data()).isOk());
    EXPECT_NE(exact, lossy);
  }

  // int2 bytes under the raw name: never decoded as raw.
  std::string int2Bytes;
  ASSERT_TRUE(tier->get(int2Refs[0].name(), int2Bytes).isOk());
  std::vector<float> out(store.shape(rawRefs[0]).numel());
  Status misnamed = store.decode(rawRefs[0], int2Bytes, out.data());
  EXPECT_EQ(chunkFault(misnamed), ChunkFault::WrongRange);
  EXPECT_NE(misnamed.message().find("stored with codec int2/g32, not raw"),
            std::string::npos)
      << misnamed.toString();

  // Same codec: kept. A corrupt object: rewritten, its neighbour untouched.
  std::vector<float> values(out.size(), 0.5f);
  bool written = true;
  ASSERT_TRUE(store.put(rawRefs[0], values.data(), &written).isOk());
  EXPECT_FALSE(written);
  ASSERT_TRUE(tier->put(rawRefs[0].name(), "not a chunk").isOk());
  ASSERT_TRUE(store.put(rawRefs[0], values.data(), &written).isOk());
  EXPECT_TRUE(written);
  ASSERT_TRUE(store.get(rawRefs[0], out.data()).isOk());
  EXPECT_EQ(out, values);
  ASSERT_TRUE(store.get(int2Refs[0], out.data()).isOk());
}

TEST(ChunkStore, ReportsTheStoredPrefixPerEncoding) {
  Fixture f;
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://"));
  ChunkStore store = f.store(tier);
  StatusOr<std::vector<StoredExtent>> empty =
      store.stored(f.tokens.data(), 300, Form::KV);
  ASSERT_TRUE(empty.isOk());
  EXPECT_TRUE(empty->empty());
  SaveOptions options;
  options.forms = {Form::KV};
  for (const char *codec : {"int8", "hadamard+int4/g64/k=token+zstd"}) {
    options.codec = *parseCodecSpec(codec);
    ASSERT_TRUE(saveContext(*f.model, store, f.tokens, options).isOk());
  }
  StatusOr<std::vector<StoredExtent>> kv =
      store.stored(f.tokens.data(), 300, Form::KV);
  ASSERT_TRUE(kv.isOk());
  ASSERT_EQ(kv->size(), 2u);
  EXPECT_EQ((*kv)[0].codec.str(), "hadamard+int4/g64/k=token+zstd");
  EXPECT_EQ((*kv)[0].codec, options.codec);
  EXPECT_EQ((*kv)[1].codec.str(), "int8/g32");
  EXPECT_EQ((*kv)[0].tokens, 300);
  EXPECT_EQ((*kv)[1].tokens, 300);
  EXPECT_TRUE(store.stored(f.tokens.data(), 300, Form::Hidden)->empty());
  // One layer group of int8's second chunk gone: only its first chunk
  // counts, and the other encoding still holds every token.
  std::vector<ChunkRef> refs =
      store.refs(f.tokens.data(), 300, Form::KV, (*kv)[1].codec);
  const ChunkRef &lost = refs[3];
  ASSERT_TRUE(tier->remove(lost.name()).isOk());
  kv = store.stored(f.tokens.data(), 300, Form::KV);
  EXPECT_EQ((*kv)[0].tokens, 300);
  EXPECT_EQ((*kv)[1].tokens, lost.tokenBegin);
}

// Object names spell the encoding; only the spelling chunkObjectName writes
// reads back, so no two names alias one encoding.
TEST(ChunkFormat, ObjectNamesSpellTheirEncoding) {
  Digest key{};
  key[0] = 0xab;
  for (const char *text : {"raw", "int8/g32+zstd", "hadamard+int4/bins8-4-2",
                           "int4/g64/k=token/v=channel+lz4", "deflate"}) {
    CodecSpec codec = *parseCodecSpec(text);
    std::string name = chunkObjectName(key, Form::KV, 0, 4, codec);
    std::string prefix = chunkObjectPrefix(key, Form::KV, 0, 4);
    ASSERT_EQ(name.compare(0, prefix.size(), prefix), 0) << name;
    std::string encoding = name.substr(prefix.size());
    EXPECT_EQ(encoding.find('/'), std::string::npos) << name;
    StatusOr<CodecSpec> back = parseEncodingName(encoding);
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_EQ(*back, codec) << encoding;
  }
  EXPECT_EQ(chunkObjectName(key, Form::Hidden, 4, 8, *parseCodecSpec("int8")),
            toHex(key) + "/hidden/4-8/int8.g32");
  for (const char *bad : {"", "int8", "int8.g32.g32", "int8.g032", "zstd+raw",
                          "int8/g32", "int8.g32.k=channel", "tmp.123"})
    EXPECT_FALSE(parseEncodingName(bad).isOk()) << bad;
}

/// Writes one KV chunk and returns its ref and the store.
TEST(ChunkStore, RejectsCorruptTruncatedForeignAndMisfiledChunks) {
  Fixture f, other(12); // Same shape, other weights.
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://"));
  ChunkStore store = f.store(tier);
  ASSERT_TRUE(saveContext(*f.model, store, f.tokens, {}).isOk());
  ChunkRef ref = store.refs(f.tokens.data(), 300, Form::KV, CodecSpec())[0];
  std::vector<float> out(store.shape(ref).numel());
  ASSERT_TRUE(store.get(ref, out.data()).isOk());
  std::string good;
  ASSERT_TRUE(tier->get(ref.name(), good).isOk());

  auto faultAfter = [&](const std::string &bytes) {
    EXPECT_TRUE(tier->put(ref.name(), bytes).isOk());
    Status s = store.get(ref, out.data());
    EXPECT_FALSE(s.isOk());
    return chunkFault(s);
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  EXPECT_EQ(faultAfter(flipped), ChunkFault::Corrupt);
  std::string header = good;
  header[20] ^= 1;
  EXPECT_EQ(faultAfter(header), ChunkFault::Corrupt);
  EXPECT_EQ(faultAfter(good.substr(0, good.size() - 10)),
            ChunkFault::Truncated);
  EXPECT_EQ(faultAfter(good.substr(0, 50)), ChunkFault::Truncated);
  EXPECT_EQ(faultAfter("not a chunk at all, but long enough to have a header "
                       "of one hundred and thirty six bytes if you count "
                       "every character of it slowly and carefully..."),
            ChunkFault::Corrupt);

  // Another model's chunk under this key.
  std::shared_ptr<Tier> otherTier = std::move(*openTier("mem://"));
  ChunkStore otherStore = other.store(otherTier);
  ASSERT_TRUE(saveContext(*other.model, otherStore, other.tokens, {}).isOk());
  ChunkRef otherRef =
      otherStore.refs(other.tokens.data(), 300, Form::KV, CodecSpec())[0];
  std::string foreign;
  ASSERT_TRUE(otherTier->get(otherRef.name(), foreign).isOk());
  EXPECT_EQ(faultAfter(foreign), ChunkFault::WrongModel);

  // The same data saved for another tenant, filed under this key.
  std::shared_ptr<Tier> tenantTier = std::move(*openTier("mem://"));
  ChunkStore tenantStore = f.store(tenantTier, "tenant-b");
  ASSERT_TRUE(saveContext(*f.model, tenantStore, f.tokens, {}).isOk());
  ChunkRef tenantRef =
      tenantStore.refs(f.tokens.data(), 300, Form::KV, CodecSpec())[0];
  EXPECT_NE(tenantRef.name(), ref.name());
  std::string misfiled;
  ASSERT_TRUE(tenantTier->get(tenantRef.name(), misfiled).isOk());
  EXPECT_EQ(faultAfter(misfiled), ChunkFault::WrongKey);

  // Another layer group of the same prefix.
  ChunkRef neighbour =
      store.refs(f.tokens.data(), 300, Form::KV, CodecSpec())[1];
  std::string wrongRange;
  ASSERT_TRUE(tier->get(neighbour.name(), wrongRange).isOk());
  EXPECT_EQ(faultAfter(wrongRange), ChunkFault::WrongRange);

  ASSERT_TRUE(tier->remove(ref.name()).isOk());
  EXPECT_EQ(chunkFault(store.get(ref, out.data())), ChunkFault::Missing);
}

TEST(ChunkStore, RedisTierStoresChunks) {
  if (!redis().running())
    GTEST_SKIP() << "redis-server is not installed";
  Fixture f;
  std::shared_ptr<Tier> tier = std::move(*openTier(redis().url() + "/1"));
  ChunkStore store = f.store(tier, "redis-test");
  SaveOptions options;
  options.codec = *parseCodecSpec("int8+zstd");
  ASSERT_TRUE(saveContext(*f.model, store, f.tokens, options).isOk());
  std::vector<ChunkRef> refs =
      store.refs(f.tokens.data(), 300, Form::KV, options.codec);
  std::vector<std::string> names, buffers;
  for (const ChunkRef &r : refs)
    names.push_back(r.name());
  std::vector<Status> got = tier->getMany(names, buffers);
  for (size_t i = 0; i < refs.size(); ++i) {
    ASSERT_TRUE(got[i].isOk()) << got[i].toString();
    std::vector<float> out(store.shape(refs[i]).numel());
    ASSERT_TRUE(store.decode(refs[i], buffers[i], out.data()).isOk());
  }
}

// A compiled save plan decides what saveContext writes; one that does not
// store every object of the store's layout once, in one encoding, or that
// restores, is refused with what differs, before any prefill.
TEST(Saver, RunsWhatASavePlanChoosesAndRefusesOtherPlans) {
  Fixture f;
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://"));
  ChunkStore store = f.store(tier);
  CodecSpec int8 = *parseCodecSpec("int8+zstd");
  BundlePlan plan = savePlanFor(store, 300, {Form::Hidden}, int8, "ssd");
  plan.name = "s";
  // The tasks that store, in the order of the objects.
  std::vector<int64_t> stores;
  for (const BundleTask &task : plan.tasks)
    if (task.steps[0].kind == StepKind::Store)
      stores.push_back(task.id);
  StatusOr<SaveOptions> options = saveOptionsFor(plan, store, 300);
  ASSERT_TRUE(options.isOk()) << options.status().toString();
  EXPECT_EQ(options->forms, std::vector<Form>{Form::Hidden});
  EXPECT_EQ(options->codec, int8);
  EXPECT_EQ(options->prefillTokens, 0); // The plan names no step: one chunk.
  // The plan's prefill step, unless the caller chose one.
  const int64_t chunk = store.layout().chunkTokens;
  BundlePlan stepped = plan;
  stepped.prefillStep = 2 * chunk;
  EXPECT_EQ(saveOptionsFor(stepped, store, 300)->prefillTokens, 2 * chunk);
  SaveOptions chosen;
  chosen.prefillTokens = chunk;
  EXPECT_EQ(saveOptionsFor(stepped, store, 300, chosen)->prefillTokens, chunk);
  StatusOr<SaveStats> saved = saveContext(*f.model, store, f.tokens, *options);
  ASSERT_TRUE(saved.isOk()) << saved.status().toString();
  std::vector<ChunkRef> refs =
      store.refs(f.tokens.data(), 300, Form::Hidden, int8);
  EXPECT_EQ(saved->written, int64_t(refs.size()));
  std::vector<float> out(store.shape(refs.back()).numel());
  EXPECT_TRUE(store.get(refs.back(), out.data()).isOk());
  EXPECT_TRUE(store.stored(f.tokens.data(), 300, Form::KV)->empty());

  auto refusal = [&](const BundlePlan &p, int64_t tokens = 300) {
    StatusOr<SaveOptions> refused = saveOptionsFor(p, store, tokens);
    EXPECT_FALSE(refused.isOk());
    return refused.status().message();
  };
  EXPECT_EQ(refusal(plan, 256),
            "plan s covers tokens 0 to 300 of layers 0 to 4, the request 256 "
            "tokens of 4 layers");
  BundlePlan mixed = plan;
  mixed.tasks[stores[1]].steps[0].codec = CodecSpec();
  EXPECT_EQ(refusal(mixed),
            "plan s stores encodings int8/g32+zstd and raw; a save has one");
  BundlePlan twice = plan;
  twice.tasks[stores[1]].steps = twice.tasks[stores[0]].steps;
  EXPECT_EQ(refusal(twice), "plan s stores hidden tokens 0 of layer 0 twice");
  BundlePlan partial = plan;
  partial.tasks.pop_back();
  EXPECT_EQ(refusal(partial),
            "plan s stores 5 objects of 6; a save has every one");
  StoreLayout other{256, 2};
  ChunkStore otherStore(tier, f.model->config(), f.model->fingerprint(), "",
                        other);
  BundlePlan otherLayout =
      savePlanFor(otherStore, 300, {Form::KV}, int8, "ssd");
  otherLayout.name = "s";
  EXPECT_EQ(refusal(otherLayout),
            "plan s stores objects of 256 tokens x 2 layers; the store's are "
            "128 x 2 (compile with the store's chunk_tokens and layer_group)");
  BundlePlan restores = plan;
  restores.tasks[0].steps[0].kind = StepKind::Fetch;
  EXPECT_EQ(refusal(restores), "plan s has a fetch; it is no save plan");
  BundlePlan sends = plan;
  sends.tasks.back().steps[0].kind = StepKind::Send;
  EXPECT_EQ(refusal(sends), "plan s has a send; it is no save plan");
  BundlePlan empty = plan;
  empty.tasks.clear();
  EXPECT_EQ(refusal(empty), "plan s stores nothing");
}

TEST(Saver, BoundsItsBuffersAndAppliesBackPressure) {
  Fixture f;
  // A store slower than the prefill: 0.01 Gbps.
  std::shared_ptr<Tier> tier = std::move(*openTier("mem://?gbps=0.01"));
  ChunkStore store = f.store(tier);
  SaveOptions options;
  options.forms = {Form::KV};
  options.writers = 1;
  // One object of 128 tokens x 2 layers x K,V x 64 floats = 128 KiB.
  options.bufferBytes = 200 << 10;
  StatusOr<SaveStats> stats = saveContext(*f.model, store, f.tokens, options);
  ASSERT_TRUE(stats.isOk()) << stats.status().toString();
  EXPECT_LE(stats->peakBufferedBytes, options.bufferBytes);
  EXPECT_GT(stats->stallSeconds, 0.0); // The prefill waited for the store.
  EXPECT_EQ(stats->written, 6);
}

TEST(Saver, ReportsAnUnwritableStore) {
  Fixture f;
  std::shared_ptr<Tier> tier =
      std::move(*openTier("mem://?capacity_mb=0.00001")); // 10 bytes.
  ChunkStore store = f.store(tier);
  StatusOr<SaveStats> stats = saveContext(*f.model, store, f.tokens, {});
  ASSERT_FALSE(stats.isOk());
  EXPECT_NE(stats.status().message().find("exceeds the tier's capacity"),
            std::string::npos);
}

// A prefill step of several chunks hands its objects over layer group by
// layer group, each holding its chunk's rows of the step's K and V.
TEST(Saver, APrefillOfSeveralChunksHandsOverLayerGroupByLayerGroup) {
  Fixture f;
  ChunkStore store = f.store(std::shared_ptr<Tier>(*openTier("mem://")));
  auto order = [&](int64_t prefillTokens) {
    SaveOptions options;
    options.forms = {Form::KV};
    options.writers = 1;
    options.prefillTokens = prefillTokens;
    std::vector<std::pair<int64_t, int64_t>> seen;
    std::vector<std::vector<float>> values;
    StatusOr<SaveStats> streamed = streamContext(
        *f.model, store, f.tokens, options,
        [&](const ChunkRef &ref, const float *v) -> StatusOr<bool> {
          seen.emplace_back(ref.tokenBegin, ref.layerBegin);
          values.emplace_back(v, v + store.shape(ref).numel());
          return true;
        });
    EXPECT_TRUE(streamed.isOk()) << streamed.status().toString();
    return std::make_pair(seen, values);
  };
  using Boxes = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(order(0).first,
            (Boxes{{0, 0}, {0, 2}, {128, 0}, {128, 2}, {256, 0}, {256, 2}}));
  auto [boxes, values] = order(384);
  EXPECT_EQ(boxes,
            (Boxes{{0, 0}, {128, 0}, {256, 0}, {0, 2}, {128, 2}, {256, 2}}));
  // One step over the request is a full prefill: the second chunk's layer
  // 0 holds the full prefill's rows 128 to 256, K then V.
  LlamaModel::Cache full = f.model->newCache();
  ASSERT_TRUE(f.model->prefill(full, f.tokens.data(), 300).isOk());
  const int64_t kv = f.model->kvDim();
  const std::vector<float> &object = values[1];
  EXPECT_TRUE(std::equal(object.begin(), object.begin() + 128 * kv,
                         full.k[0].begin() + 128 * kv));
  EXPECT_TRUE(std::equal(object.begin() + 128 * kv, object.begin() + 256 * kv,
                         full.v[0].begin() + 128 * kv));

  SaveOptions ragged;
  ragged.prefillTokens = 100;
  EXPECT_EQ(saveContext(*f.model, store, f.tokens, ragged).status().message(),
            "stream: prefill steps of 100 tokens; they must be whole chunks "
            "of 128");
}

/// Fails every write after the first `allowed`, as a disk that fills up.
class FillingTier : public ForwardingTier {
public:
  FillingTier(std::shared_ptr<Tier> inner, int allowed)
      : ForwardingTier(std::move(inner)), allowed_(allowed) {}
  Status put(const std::string &name, std::string_view bytes) override {
    if (allowed_-- <= 0)
      return chunkError(ChunkFault::Unavailable, name + ": the disk is full");
    return ForwardingTier::put(name, bytes);
  }

private:
  std::atomic<int> allowed_;
};

// A save that fails part-way takes back the objects it wrote; what the
// store held before (another encoding, the same encoding's first chunk)
// stays.
TEST(Saver, AFailedSaveLeavesNothingBehind) {
  Fixture f;
  std::shared_ptr<Tier> mem = std::move(*openTier("mem://"));
  ChunkStore before = f.store(mem);
  SaveOptions int8;
  int8.forms = {Form::KV};
  int8.codec = *parseCodecSpec("int8");
  ASSERT_TRUE(saveContext(*f.model, before, f.tokens, int8).isOk());
  SaveOptions raw;
  raw.forms = {Form::KV};
  raw.writers = 1;
  ASSERT_TRUE(saveContext(*f.model, before,
                          std::vector<int32_t>(f.tokens.begin(),
                                               f.tokens.begin() + 128),
                          raw)
                  .isOk());
  std::vector<std::string> held = test::chunkObjects(*mem);
  ASSERT_EQ(held.size(), 6u + 2u);

  ChunkStore filling = f.store(std::make_shared<FillingTier>(mem, 2));
  StatusOr<SaveStats> failed = saveContext(*f.model, filling, f.tokens, raw);
  ASSERT_FALSE(failed.isOk());
  EXPECT_NE(failed.status().message().find("the disk is full"),
            std::string::npos)
      << failed.status().toString();
  EXPECT_EQ(test::chunkObjects(*mem), held);
}

} // namespace

namespace kvc {
namespace {

// With a deployment key, every object carries a MAC under it: a chunk
// another writer put there, with a header and payload whose checksums
// hold, is refused as corrupt; so is an altered or renamed one.
TEST(SealedTier, NobodyElsesBytesAreServed) {
  Fixture f;
  const std::string dir = tempDir("sealed");
  const std::string keyFile = test::tempPath("sealed-key");
  std::ofstream(keyFile) << "a deployment key of 32 characters\n";
  const std::string plainUrl = "file://" + dir;
  StatusOr<std::unique_ptr<Tier>> opened =
      openTier(plainUrl + "?key_file=" + keyFile, TierAccess::Create);
  ASSERT_TRUE(opened) << opened.status().toString();
  std::shared_ptr<Tier> sealed = std::move(*opened);
  ChunkStore store = f.store(sealed);
  ASSERT_TRUE(saveContext(*f.model, store, f.tokens, {}).isOk());
  std::vector<ChunkRef> refs =
      store.refs(f.tokens.data(), 300, Form::KV, CodecSpec());
  ASSERT_FALSE(refs.empty());
  std::vector<float> out(store.shape(refs[0]).numel());
  ASSERT_TRUE(store.get(refs[0], out.data()).isOk());

  // A writer without the key: a well-formed chunk (its CRCs hold), the
  // same model's, under the right name.
  std::shared_ptr<Tier> plain = std::move(*openTier(plainUrl));
  ChunkStore forger = f.store(plain);
  std::string forged;
  {
    std::shared_ptr<Tier> scratch = std::move(*openTier("mem://"));
    ChunkStore honest = f.store(scratch);
    ASSERT_TRUE(saveContext(*f.model, honest, f.tokens, {}).isOk());
    ASSERT_TRUE(scratch->get(refs[0].name(), forged).isOk());
  }
  ASSERT_TRUE(plain->put(refs[0].name(), forged).isOk());
  Status refused = store.get(refs[0], out.data());
  EXPECT_EQ(chunkFault(refused), ChunkFault::Corrupt) << refused.toString();
  EXPECT_NE(refused.message().find("deployment key"), std::string::npos);

  // An object sealed under the key but moved to another name, or with a
  // byte changed.
  std::string moved;
  ASSERT_TRUE(plain->get(refs[1].name(), moved).isOk());
  ASSERT_TRUE(plain->put(refs[2].name(), moved).isOk());
  EXPECT_EQ(chunkFault(store.get(refs[2], out.data())), ChunkFault::Corrupt);
  std::string altered;
  ASSERT_TRUE(plain->get(refs[3].name(), altered).isOk());
  altered[altered.size() / 2] ^= 1;
  ASSERT_TRUE(plain->put(refs[3].name(), altered).isOk());
  EXPECT_EQ(chunkFault(store.get(refs[3], out.data())), ChunkFault::Corrupt);
  // Untouched objects still read.
  EXPECT_TRUE(store.get(refs[1], out.data()).isOk());

  // Another key reads nothing; a short key, or none in the file, is refused.
  const std::string otherKey = test::tempPath("sealed-other-key");
  std::ofstream(otherKey) << "another key, also long enough";
  std::shared_ptr<Tier> other =
      std::move(*openTier(plainUrl + "?key_file=" + otherKey));
  std::string bytes;
  EXPECT_EQ(chunkFault(other->get(refs[1].name(), bytes)), ChunkFault::Corrupt);
  const std::string shortKey = test::tempPath("sealed-short-key");
  std::ofstream(shortKey) << "xyzzy";
  StatusOr<std::unique_ptr<Tier>> weak =
      openTier(plainUrl + "?key_file=" + shortKey);
  ASSERT_FALSE(weak);
  EXPECT_EQ(weak.status().message().find("xyzzy"), std::string::npos);
  EXPECT_FALSE(openTier(plainUrl + "?key_file=/nonexistent/key"));
  fs::remove_all(dir);
}

} // namespace
} // namespace kvc
