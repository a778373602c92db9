//===- RedisTier.h - The redis:// tier and its nodes ------------*- C++ -*-===//
//
// A RedisNode is a pool of connections to one Redis server: the redis://
// tier itself, and each node of a redis-cluster:// tier (RedisClusterTier).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_STORE_REDISTIER_H
#define KVC_LIB_RUNTIME_STORE_REDISTIER_H

#include "kvc/Runtime/Store/Tier.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace kvc {

class RedisConnection;

/// Credentials a connection sends (AUTH [user] password) when it has a
/// password; never in a message or a tier's name.
struct RedisAuth {
  std::string user, password;
};

/// How a redis:// tier, or each node of a redis-cluster:// one, talks to
/// its server (openTier's URL options).
struct RedisOptions {
  int db = 0;
  /// Each command waits at most this long (?timeout_ms; connecting, 1 s).
  int commandTimeoutMs = 10000;
  /// A put returns once this many replicas hold the object (?replicas:
  /// WAIT, bounded by the timeout), so that a failover keeps it.
  int waitReplicas = 0;
  /// Every object expires this long after its last write or read (?ttl_s).
  int64_t ttlSeconds = 0;
  RedisAuth auth;
  /// Connections send READONLY: a cluster replica serves reads.
  bool readOnly = false;
};

/// One range of a cluster's hash slots: its master first, then replicas,
/// each "HOST:PORT".
struct RedisSlotRange {
  int first = 0, last = 0;
  std::vector<std::string> nodes;
};

/// A pool of connections to one server, one per concurrent caller (up to
/// kMaxConnections, made as callers need them), so that an executor's IO
/// lanes read in parallel instead of queueing on one socket. Commands time
/// out and a failure drops the connection, which the next call
/// re-establishes.
class RedisNode final : public Tier {
public:
  static constexpr std::size_t kMaxConnections = 8;

  RedisNode(std::string url, std::string host, int port,
            RedisOptions options = {});
  ~RedisNode() override;

  const std::string &url() const override { return url_; }
  /// Connects one connection now (an unreachable server is an error).
  Status connect();

  Status put(const std::string &name, std::string_view bytes) override;
  Status get(const std::string &name, std::string &buffer) override;
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override;
  StatusOr<bool> exists(const std::string &name) override;
  Status remove(const std::string &name) override;
  StatusOr<std::vector<std::string>> list(const std::string &prefix) override;

  /// The same after ASKING, on one connection (a cluster's ASK redirect).
  Status askingPut(const std::string &name, std::string_view bytes);
  Status askingGet(const std::string &name, std::string &buffer);
  /// CLUSTER SLOTS.
  StatusOr<std::vector<RedisSlotRange>> clusterSlots();

private:
  class Lease;

  std::string url_, host_;
  int port_;
  RedisOptions options_;
  std::mutex mutex_; ///< Guards the pool below.
  std::condition_variable released_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
  std::size_t connections_ = 0;
};

/// "HOST:PORT" (or "HOST" when `defaultPort` is given) as host and port;
/// `url` names the tier in the error. InvalidArgument for an empty host, a
/// missing port or one outside 1-65535.
StatusOr<std::pair<std::string, int>>
parseHostPort(const std::string &url, const std::string &text,
              std::optional<int> defaultPort = std::nullopt);

/// Connects to `hostPortDb` ("HOST:PORT[/DB]", the database overriding
/// options.db); `url` names it in messages.
StatusOr<std::unique_ptr<Tier>> openRedisTier(const std::string &url,
                                              const std::string &hostPortDb,
                                              RedisOptions options = {});

} // namespace kvc

#endif // KVC_LIB_RUNTIME_STORE_REDISTIER_H
