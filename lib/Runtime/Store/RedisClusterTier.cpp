//===- RedisClusterTier.cpp - The redis-cluster:// tier -------------------===//
//
// A tier over a Redis Cluster, routed on the client as the cluster asks:
// a key's hash slot is CRC16 (XMODEM) of the key, or of its hash tag (the
// part between the first "{" and the next "}", when not empty), modulo
// 16384. The slot map comes from CLUSTER SLOTS, asked of any node that
// answers; a MOVED reply, or a node that cannot be reached, makes the tier
// ask again (a failover moves a master's slots to its replica), and an ASK
// reply (a slot being resharded) sends the one command to the node it
// names, after ASKING. Reads of many objects are split by node, pipelined
// per node (RedisNode::getMany) and run on all nodes at once, so that a
// restore reads at the cluster's aggregate bandwidth.
//
// Failures stay values: a key whose node is down, or whose slot the cluster
// does not serve (CLUSTERDOWN), is Unavailable (a restore recomputes its
// chunk, and loads the others), a listing holds what the masters that
// answer hold, and every wait is bounded by the nodes' timeouts.
//
//===----------------------------------------------------------------------===//

#include "RedisClusterTier.h"

#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Store/ChunkFormat.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <thread>

namespace kvc {

uint16_t redisCrc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (unsigned char byte : bytes) {
    crc ^= uint16_t(byte) << 8;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 0x8000) ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
  }
  return crc;
}

int redisHashSlot(std::string_view key) {
  if (size_t open = key.find('{'); open != std::string_view::npos)
    if (size_t close = key.find('}', open + 1);
        close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  return redisCrc16(key) % kRedisSlots;
}

namespace {

/// A reply that sends the command elsewhere: MOVED (the slot lives there
/// now) or ASK (this once, during resharding).
struct Redirect {
  bool ask = false;
  std::string node;
};

/// Whether a reply said the cluster does not serve the key's slot now.
bool clusterDown(const Status &status) {
  return status.message().find("redis error: CLUSTERDOWN") != std::string::npos;
}

std::optional<Redirect> redirectOf(const Status &status) {
  const std::string &text = status.message();
  for (const char *kind : {"MOVED ", "ASK "}) {
    size_t at = text.find(std::string("redis error: ") + kind);
    if (at == std::string::npos)
      continue;
    at += std::string("redis error: ").size() + std::string(kind).size();
    size_t space = text.find(' ', at); // After the slot number.
    if (space == std::string::npos)
      return std::nullopt;
    size_t end = text.find_first_of(" \r\n", space + 1);
    return Redirect{kind[0] == 'A', text.substr(space + 1, end - space - 1)};
  }
  return std::nullopt;
}

class RedisClusterTier final : public Tier {
public:
  /// Redirects and map refreshes one command follows before it gives up.
  static constexpr int kAttempts = 5;

  RedisClusterTier(std::string url, std::vector<std::string> seeds,
                   RedisOptions options, bool readReplicas)
      : url_(std::move(url)), seeds_(std::move(seeds)),
        options_(std::move(options)), readReplicas_(readReplicas) {
    slots_.fill(-1);
  }

  const std::string &url() const override { return url_; }

  /// Reads the slot map from the first node that answers.
  /// Reads the slot map again; not when another refresh ended after
  /// `unlessSince` (readers that failed together ask once).
  Status refresh(std::optional<Clock::time_point> unlessSince = std::nullopt) {
    std::unique_lock<std::mutex> refreshing(refreshMutex_);
    if (unlessSince && refreshed_.load() > *unlessSince)
      return Status::ok();
    std::vector<std::string> candidates = seeds_;
    {
      std::shared_lock<std::shared_mutex> lock(mapMutex_);
      for (const std::vector<std::string> &group : groups_)
        for (const std::string &node : group)
          if (std::find(candidates.begin(), candidates.end(), node) ==
              candidates.end())
            candidates.push_back(node);
    }
    // Nodes that did not answer lately are asked last: a frozen one would
    // hold every refresh for its timeout.
    std::stable_partition(
        candidates.begin(), candidates.end(),
        [&](const std::string &address) { return !isDown(address); });
    Status last = chunkError(ChunkFault::Unavailable,
                             url_ + ": no cluster node to ask for slots");
    for (const std::string &address : candidates) {
      StatusOr<RedisNode *> node = nodeAt(address);
      if (!node.isOk()) {
        last = node.status();
        continue;
      }
      StatusOr<std::vector<RedisSlotRange>> ranges = (*node)->clusterSlots();
      if (!ranges.isOk()) {
        markDown(address);
        last = ranges.status();
        continue;
      }
      std::array<int16_t, kRedisSlots> slots;
      slots.fill(-1);
      std::vector<std::vector<std::string>> groups;
      for (const RedisSlotRange &range : *ranges) {
        if (range.nodes.empty() || range.first < 0 ||
            range.last >= kRedisSlots || range.first > range.last)
          continue;
        auto it = std::find(groups.begin(), groups.end(), range.nodes);
        const int16_t index = int16_t(it - groups.begin());
        if (it == groups.end())
          groups.push_back(range.nodes);
        std::fill(slots.begin() + range.first, slots.begin() + range.last + 1,
                  index);
      }
      if (groups.empty()) {
        last = chunkError(ChunkFault::Unavailable,
                          url_ + ": " + address + " serves no slots");
        continue;
      }
      std::unique_lock<std::shared_mutex> lock(mapMutex_);
      slots_ = slots;
      groups_ = std::move(groups);
      refreshed_ = Clock::now();
      return Status::ok();
    }
    return last;
  }

  Status put(const std::string &name, std::string_view bytes) override {
    return routed(name, [&](RedisNode &node, bool ask) {
      return ask ? node.askingPut(name, bytes) : node.put(name, bytes);
    });
  }

  Status get(const std::string &name, std::string &buffer) override {
    if (RedisNode *replica = replicaFor(name)) {
      Status read = replica->get(name, buffer);
      if (read.isOk())
        return read;
      // Missing there may be a replica behind its master: ask the master.
    }
    return masterGet(name, buffer);
  }

  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    buffers.resize(names.size());
    std::vector<Status> out(names.size());
    // Split by the node each key's slot maps to; a key with no node yet
    // goes the single-key way, which refreshes the map.
    std::map<RedisNode *, std::vector<size_t>> byNode;
    std::vector<size_t> unrouted;
    for (size_t i = 0; i < names.size(); ++i) {
      if (RedisNode *replica = replicaFor(names[i])) {
        byNode[replica].push_back(i);
        continue;
      }
      StatusOr<RedisNode *> node = masterFor(names[i]);
      if (node.isOk())
        byNode[*node].push_back(i);
      else
        unrouted.push_back(i);
    }
    auto readNode = [&](RedisNode *node, const std::vector<size_t> &keys) {
      std::vector<std::string> batch, got;
      for (size_t i : keys)
        batch.push_back(names[i]);
      std::vector<Status> results = node->getMany(batch, got);
      for (size_t k = 0; k < keys.size(); ++k) {
        out[keys[k]] = std::move(results[k]);
        buffers[keys[k]] = std::move(got[k]);
      }
    };
    std::vector<std::thread> threads;
    for (auto it = std::next(byNode.begin(), byNode.empty() ? 0 : 1);
         it != byNode.end(); ++it)
      threads.emplace_back(readNode, it->first, std::cref(it->second));
    if (!byNode.empty())
      readNode(byNode.begin()->first, byNode.begin()->second);
    for (std::thread &thread : threads)
      thread.join();
    // Redirected or failed keys (and, read from a replica, missing ones):
    // one by one from their master, following the cluster.
    for (size_t i = 0; i < names.size(); ++i) {
      const bool retry =
          std::find(unrouted.begin(), unrouted.end(), i) != unrouted.end() ||
          (!out[i].isOk() &&
           (readReplicas_ || chunkFault(out[i]) != ChunkFault::Missing));
      if (retry)
        out[i] = masterGet(names[i], buffers[i]);
    }
    return out;
  }

  StatusOr<bool> exists(const std::string &name) override {
    bool found = false;
    KVC_RETURN_IF_ERROR(routed(name, [&](RedisNode &node, bool) -> Status {
      StatusOr<bool> there = node.exists(name);
      if (!there.isOk())
        return there.status();
      found = *there;
      return Status::ok();
    }));
    return found;
  }

  Status remove(const std::string &name) override {
    return routed(name, [&](RedisNode &node, bool) { return node.remove(name); });
  }

  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    std::vector<std::string> masters;
    {
      std::shared_lock<std::shared_mutex> lock(mapMutex_);
      for (const std::vector<std::string> &group : groups_)
        masters.push_back(group.front());
    }
    // What the masters that answer hold: a master that cannot be reached
    // (dead with no replica to take over, frozen) holds nothing for now,
    // and its chunks are recomputed, as its keys' reads fail. Unavailable
    // only when none answers.
    std::set<std::string> names;
    Status last = Status::ok();
    bool answered = false;
    for (const std::string &address : masters) {
      StatusOr<std::vector<std::string>> listed =
          isDown(address) ? StatusOr<std::vector<std::string>>(chunkError(
                                ChunkFault::Unavailable,
                                url_ + ": node " + address +
                                    " did not answer within the last second"))
                          : listing(address, prefix);
      if (!listed.isOk()) {
        last = listed.status();
        continue;
      }
      answered = true;
      names.insert(listed->begin(), listed->end());
    }
    if (!answered && !masters.empty())
      return last;
    return std::vector<std::string>(names.begin(), names.end());
  }

  bool partlyDown() override {
    std::lock_guard<std::mutex> lock(nodesMutex_);
    const Clock::time_point now = Clock::now();
    return std::any_of(down_.begin(), down_.end(),
                       [&](const auto &node) { return now < node.second; });
  }

  bool answers(const std::string &name) override {
    std::vector<std::string> group;
    {
      std::shared_lock<std::shared_mutex> lock(mapMutex_);
      const int index = slots_[redisHashSlot(name)];
      if (index < 0)
        return true; // Not known: the read will say.
      group = groups_[index];
    }
    if (!readReplicas_)
      group.resize(1); // Its master.
    return std::any_of(group.begin(), group.end(),
                       [&](const std::string &node) { return !isDown(node); });
  }

private:
  /// The names under `prefix` on the node at `address`; a node that does
  /// not answer is skipped for a second (markDown).
  StatusOr<std::vector<std::string>> listing(const std::string &address,
                                             const std::string &prefix) {
    KVC_ASSIGN_OR_RETURN(node, nodeAt(address));
    StatusOr<std::vector<std::string>> listed = node->list(prefix);
    if (!listed.isOk())
      markDown(address);
    return listed;
  }

  Status masterGet(const std::string &name, std::string &buffer) {
    return routed(name, [&](RedisNode &node, bool ask) {
      return ask ? node.askingGet(name, buffer) : node.get(name, buffer);
    });
  }

  /// With replica reads, a replica of `name`'s slot (the slot picks which,
  /// so that reads spread over them); else, or when the map knows none,
  /// null.
  RedisNode *replicaFor(const std::string &name) {
    if (!readReplicas_)
      return nullptr;
    const int slot = redisHashSlot(name);
    std::string address;
    for (int attempt = 0; attempt < 2 && address.empty(); ++attempt) {
      {
        std::shared_lock<std::shared_mutex> lock(mapMutex_);
        if (slots_[slot] >= 0 && groups_[slots_[slot]].size() >= 2) {
          const std::vector<std::string> &group = groups_[slots_[slot]];
          address = group[1 + size_t(slot) % (group.size() - 1)];
        }
      }
      // A node lists a replica once gossip told it: a map without one
      // is asked again, at most once a second.
      if (address.empty() &&
          (attempt > 0 || secondsSince(refreshed_.load()) < 1 ||
           !refresh().isOk()))
        return nullptr;
    }
    StatusOr<RedisNode *> node = nodeAt(address, /*readOnly=*/true);
    return node.isOk() ? *node : nullptr;
  }

  /// Runs `command` on the master of `name`'s slot, following MOVED and
  /// ASK and refreshing the map when a node cannot be reached (a failover),
  /// up to kAttempts times.
  template <typename Command>
  Status routed(const std::string &name, Command command) {
    Status status = Status::ok();
    std::optional<Redirect> redirect;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      const Clock::time_point asked = Clock::now();
      StatusOr<std::string> address =
          redirect ? StatusOr<std::string>(redirect->node) : masterOf(name);
      const bool ask = redirect && redirect->ask;
      redirect.reset();
      if (!address.isOk()) {
        status = address.status();
      } else if (isDown(*address)) {
        status = chunkError(ChunkFault::Unavailable,
                            url_ + ": node " + *address +
                                " did not answer within the last second");
      } else {
        StatusOr<RedisNode *> node = nodeAt(*address);
        status = node.isOk() ? command(**node, ask) : node.status();
        if (status.isOk() || chunkFault(status) == ChunkFault::Missing ||
            status.code() == StatusCode::InvalidArgument)
          return status;
        redirect = redirectOf(status);
        if (redirect && redirect->ask)
          continue;
        // CLUSTERDOWN: the node answers but the cluster does not serve the
        // slot (its master gone with no replica, with full coverage not
        // required): the key is unavailable, the node's other keys are not.
        if (!redirect && !clusterDown(status))
          markDown(*address);
      }
      if (attempt + 1 == kAttempts)
        break;
      // MOVED, or a node that did not answer: the map may be stale (a
      // failover promotes a replica within the cluster's node timeout).
      // When the map still names the same silent node, fail now: a restore
      // recomputes the chunk sooner than the cluster fails over.
      const std::string before = address.isOk() ? *address : "";
      if (!refresh(asked).isOk()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
        continue;
      }
      StatusOr<std::string> after = masterOf(name);
      if (!redirect && after.isOk() && *after == before)
        break;
    }
    return status;
  }

  /// A node that failed a command other than by a redirect is skipped for
  /// a second: the keys it holds fail at once rather than each waiting out
  /// its timeout (a node frozen, or dead before its replica takes over).
  void markDown(const std::string &address) {
    std::lock_guard<std::mutex> lock(nodesMutex_);
    down_[address] = Clock::now() + std::chrono::seconds(1);
  }
  bool isDown(const std::string &address) {
    std::lock_guard<std::mutex> lock(nodesMutex_);
    auto it = down_.find(address);
    return it != down_.end() && Clock::now() < it->second;
  }

  /// The address of the master serving `name`'s slot.
  StatusOr<std::string> masterOf(const std::string &name) {
    const int slot = redisHashSlot(name);
    {
      std::shared_lock<std::shared_mutex> lock(mapMutex_);
      if (slots_[slot] >= 0)
        return groups_[slots_[slot]].front();
    }
    KVC_RETURN_IF_ERROR(refresh());
    std::shared_lock<std::shared_mutex> lock(mapMutex_);
    if (slots_[slot] < 0)
      return chunkError(ChunkFault::Unavailable,
                        url_ + ": no node serves slot " + std::to_string(slot));
    return groups_[slots_[slot]].front();
  }

  /// The node serving `name`'s slot (the map read first when empty).
  StatusOr<RedisNode *> masterFor(const std::string &name) {
    KVC_ASSIGN_OR_RETURN(address, masterOf(name));
    return nodeAt(address);
  }

  /// The pool of connections to `address` (read-only ones, for replica
  /// reads), made on first use.
  StatusOr<RedisNode *> nodeAt(const std::string &address,
                               bool readOnly = false) {
    std::lock_guard<std::mutex> lock(nodesMutex_);
    auto &nodes = readOnly ? readers_ : nodes_;
    auto it = nodes.find(address);
    if (it == nodes.end()) {
      KVC_ASSIGN_OR_RETURN(where, parseHostPort(url_, address));
      RedisOptions options = options_;
      options.readOnly = readOnly;
      it = nodes
               .emplace(address, std::make_unique<RedisNode>(
                                     url_ + " node " + address, where.first,
                                     where.second, std::move(options)))
               .first;
    }
    return it->second.get();
  }

  std::string url_;
  std::vector<std::string> seeds_;
  RedisOptions options_;
  bool readReplicas_;
  std::mutex refreshMutex_; ///< One refresh at a time.
  std::shared_mutex mapMutex_;
  /// Per slot, its group in groups_ (-1: none): each group a master and
  /// its replicas, "HOST:PORT".
  std::array<int16_t, kRedisSlots> slots_;
  std::vector<std::vector<std::string>> groups_;
  std::atomic<Clock::time_point> refreshed_{Clock::time_point()};
  std::mutex nodesMutex_;
  std::map<std::string, std::unique_ptr<RedisNode>> nodes_, readers_;
  std::map<std::string, Clock::time_point> down_;
};

} // namespace

StatusOr<std::unique_ptr<Tier>>
openRedisClusterTier(const std::string &url, const std::string &nodes,
                     RedisOptions options, bool readReplicas) {
  std::vector<std::string> seeds;
  for (size_t at = 0; at <= nodes.size();) {
    size_t comma = nodes.find(',', at);
    std::string node = nodes.substr(at, comma - at);
    if (node.empty())
      return invalidArgument(url + ": an empty node in the node list");
    KVC_RETURN_IF_ERROR(parseHostPort(url, node).status());
    seeds.push_back(node);
    if (comma == std::string::npos)
      break;
    at = comma + 1;
  }
  auto tier = std::make_unique<RedisClusterTier>(url, std::move(seeds),
                                                 std::move(options),
                                                 readReplicas);
  // Ask for the slot map now, so that an unreachable cluster is reported
  // at open.
  KVC_RETURN_IF_ERROR(tier->refresh());
  return std::unique_ptr<Tier>(std::move(tier));
}

} // namespace kvc
