//===- RedisCluster.h - A Redis Cluster of a test's own ---------*- C++ -*-===//
//
// Starts redis-server processes on free loopback ports, joins them into a
// cluster (redis-cli --cluster create, or the slots assigned by hand below
// three masters), waits until every replica is in sync, and stops them by
// the PIDs it started. For tests (failure drills) and benchmarks.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TESTING_REDISCLUSTER_H
#define KVC_TESTING_REDISCLUSTER_H

#include <sys/types.h>

#include <string>
#include <vector>

namespace kvc::test {

class RedisCluster {
public:
  /// `masters` masters with `replicas` replicas each, their files under
  /// `dir` (made, and removed by stop()). ready() says whether it came up
  /// (redis-server and redis-cli are needed). Without `fullCoverage` the
  /// nodes serve their slots while another's are down (Redis'
  /// cluster-require-full-coverage no), as a cluster without replicas is
  /// run.
  RedisCluster(std::string dir, int masters = 3, int replicas = 1,
               bool fullCoverage = true);
  ~RedisCluster();
  RedisCluster(const RedisCluster &) = delete;
  RedisCluster &operator=(const RedisCluster &) = delete;

  bool ready() const { return ready_; }
  int nodes() const { return int(pids_.size()); }
  int port(int node) const { return base_ + node; }
  /// redis-cluster://127.0.0.1:PORT,... (two nodes to start from), with
  /// `options` ("?replicas=1", ...) appended.
  std::string url(const std::string &options = "") const;

  /// A redis-cli command against `node`; its output.
  std::string cli(int node, const std::string &args) const;
  /// The running nodes that are masters now.
  std::vector<int> masters() const;
  /// The node that serves `slot` now (-1: none).
  int masterOf(int slot) const;

  void kill(int node);
  void freeze(int node);
  void thaw(int node);
  /// Starts a killed node again on its port: it rejoins with its slots
  /// (its cluster config is kept) and no data (the nodes persist nothing).
  /// Whether it answers.
  bool restart(int node);
  /// Whether `node` is running (started and not killed).
  bool running(int node) const { return pids_[node] > 0; }
  /// Moves `slots` slots and the keys they hold from master `from` to
  /// master `to` (redis-cli --cluster reshard); whether it did.
  bool migrate(int from, int to, int slots);

  /// Waits until every running node says the cluster is ok, every running
  /// replica is in sync and `masters` (the constructor's) nodes are
  /// masters: after a master's death, once its replica took over.
  bool waitHealthy(int seconds = 30) const;
  /// Waits until every master's CLUSTER SLOTS lists every running node (a
  /// node learns its peers' replicas by gossip, seconds after they sync).
  bool waitReplicasListed(int seconds = 30) const;
  void stop();

private:
  void start(int node);
  void signal(int node, int sig, bool reap);

  std::string dir_;
  int wantMasters_;
  bool fullCoverage_;
  int base_ = 0;
  std::vector<pid_t> pids_;
  bool ready_ = false;
};

} // namespace kvc::test

#endif // KVC_TESTING_REDISCLUSTER_H
