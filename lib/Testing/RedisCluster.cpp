//===- RedisCluster.cpp - A Redis Cluster of a test's own -----------------===//

#include "kvc/Testing/RedisCluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

namespace kvc::test {

namespace {

namespace fs = std::filesystem;

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

bool bindable(int port) {
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

/// A base port for `count` nodes whose cluster bus ports (10000 above) are
/// free too, picked from this process's id and checked.
int freeBase(int count) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int base = 21000 + int((getpid() * 7 + attempt * 131) % 900) * 10;
    bool free = true;
    for (int i = 0; i < count && free; ++i)
      free = bindable(base + i) && bindable(base + i + 10000);
    if (free)
      return base;
  }
  return 0;
}

} // namespace

RedisCluster::RedisCluster(std::string dir, int masters, int replicas,
                           bool fullCoverage)
    : dir_(std::move(dir)), wantMasters_(masters), fullCoverage_(fullCoverage) {
  if (system("command -v redis-server >/dev/null 2>&1 && "
             "command -v redis-cli >/dev/null 2>&1") != 0)
    return;
  const int count = masters * (1 + replicas);
  base_ = freeBase(count);
  if (base_ == 0)
    return;
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  pids_.assign(count, -1);
  for (int i = 0; i < count; ++i)
    start(i);
  bool joined;
  if (masters >= 3) {
    std::string create = "redis-cli --cluster create";
    for (int i = 0; i < count; ++i)
      create += " 127.0.0.1:" + std::to_string(port(i));
    create += " --cluster-replicas " + std::to_string(replicas) +
              " --cluster-yes >" + dir_ + "/create.log 2>&1";
    joined = system(create.c_str()) == 0;
  } else {
    // redis-cli creates clusters of three masters or more: smaller ones
    // get their slots by hand (no replicas).
    joined = replicas == 0;
    const int per = 16384 / masters;
    for (int m = 0; m < masters && joined; ++m) {
      if (m > 0)
        cli(m, "CLUSTER MEET 127.0.0.1 " + std::to_string(port(0)));
      const int last = m + 1 == masters ? 16383 : (m + 1) * per - 1;
      joined = cli(m, "CLUSTER ADDSLOTSRANGE " + std::to_string(m * per) +
                          " " + std::to_string(last))
                   .rfind("OK", 0) == 0;
    }
  }
  if (!joined || !waitHealthy()) {
    stop();
    return;
  }
  ready_ = true;
}

RedisCluster::~RedisCluster() { stop(); }

std::string RedisCluster::url(const std::string &options) const {
  std::string nodes = "127.0.0.1:" + std::to_string(port(0));
  if (this->nodes() > 1)
    nodes += ",127.0.0.1:" + std::to_string(port(1));
  return "redis-cluster://" + nodes + options;
}

std::string RedisCluster::cli(int node, const std::string &args) const {
  return shell("redis-cli -p " + std::to_string(port(node)) + " " + args +
               " 2>/dev/null");
}

std::vector<int> RedisCluster::masters() const {
  std::vector<int> out;
  for (int i = 0; i < nodes(); ++i)
    if (pids_[i] > 0 && cli(i, "ROLE").rfind("master", 0) == 0)
      out.push_back(i);
  return out;
}

int RedisCluster::masterOf(int slot) const {
  for (int i : masters()) {
    std::istringstream lines(cli(i, "CLUSTER NODES"));
    for (std::string line; std::getline(lines, line);) {
      if (line.find("myself") == std::string::npos)
        continue;
      // Fields 9 on: slot ranges "a-b" or "a" ("[...]" are migrations).
      std::istringstream fields(line);
      std::string field;
      for (int f = 0; f < 8 && fields >> field; ++f) {
      }
      while (fields >> field) {
        if (field[0] == '[')
          continue;
        const size_t dash = field.find('-');
        const int first = std::stoi(field.substr(0, dash));
        const int last = dash == std::string::npos
                             ? first
                             : std::stoi(field.substr(dash + 1));
        if (first <= slot && slot <= last)
          return i;
      }
    }
  }
  return -1;
}

void RedisCluster::kill(int node) { signal(node, SIGKILL, true); }
void RedisCluster::freeze(int node) { signal(node, SIGSTOP, false); }
void RedisCluster::thaw(int node) { signal(node, SIGCONT, false); }

bool RedisCluster::restart(int node) {
  if (pids_[node] > 0)
    return false;
  start(node);
  return cli(node, "PING").rfind("PONG", 0) == 0;
}

bool RedisCluster::migrate(int from, int to, int slots) {
  auto id = [&](int node) {
    std::string out = cli(node, "CLUSTER MYID");
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back())))
      out.pop_back();
    return out;
  };
  const std::string source = id(from), target = id(to);
  if (source.empty() || target.empty())
    return false;
  return system(("redis-cli --cluster reshard 127.0.0.1:" +
                 std::to_string(port(from)) + " --cluster-from " + source +
                 " --cluster-to " + target + " --cluster-slots " +
                 std::to_string(slots) + " --cluster-yes >>" + dir_ +
                 "/reshard.log 2>&1")
                    .c_str()) == 0;
}

bool RedisCluster::waitHealthy(int seconds) const {
  for (int tries = 0; tries < seconds * 10; ++tries) {
    bool ok = int(masters().size()) == wantMasters_;
    for (int i = 0; i < nodes() && ok; ++i)
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

bool RedisCluster::waitReplicasListed(int seconds) const {
  for (int tries = 0; tries < seconds * 10; ++tries) {
    bool ok = true;
    for (int m : masters()) {
      const std::string slots = cli(m, "CLUSTER SLOTS");
      for (int i = 0; i < nodes() && ok; ++i)
        ok = pids_[i] <= 0 ||
             slots.find(std::to_string(port(i))) != std::string::npos;
    }
    if (ok)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

void RedisCluster::stop() {
  for (int i = 0; i < nodes(); ++i)
    if (pids_[i] > 0) {
      ::kill(pids_[i], SIGCONT);
      signal(i, SIGKILL, true);
    }
  if (!dir_.empty())
    fs::remove_all(dir_);
}

void RedisCluster::start(int node) {
  const std::string p = std::to_string(port(node));
  const std::string conf = dir_ + "/nodes-" + p + ".conf";
  const std::string log = dir_ + "/" + p + ".log";
  pid_t pid = fork();
  if (pid == 0) {
    execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind",
           "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file",
           conf.c_str(), "--cluster-node-timeout", "1000",
           "--cluster-replica-validity-factor", "0",
           "--repl-diskless-sync-delay", "0", "--save", "", "--appendonly",
           "no", "--dir", dir_.c_str(), "--logfile", log.c_str(), "--loglevel",
           "warning", "--cluster-require-full-coverage",
           fullCoverage_ ? "yes" : "no", nullptr);
    _exit(127);
  }
  pids_[node] = pid;
  for (int i = 0; i < 100; ++i) {
    if (cli(node, "PING").rfind("PONG", 0) == 0)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void RedisCluster::signal(int node, int sig, bool reap) {
  if (pids_[node] <= 0)
    return;
  ::kill(pids_[node], sig);
  if (reap) {
    waitpid(pids_[node], nullptr, 0);
    pids_[node] = -1;
  }
}

} // namespace kvc::test
