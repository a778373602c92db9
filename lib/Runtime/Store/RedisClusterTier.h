//===- RedisClusterTier.h - The redis-cluster:// tier -----------*- C++ -*-===//

#ifndef KVC_LIB_RUNTIME_STORE_REDISCLUSTERTIER_H
#define KVC_LIB_RUNTIME_STORE_REDISCLUSTERTIER_H

#include "RedisTier.h"

#include "kvc/Runtime/Store/Tier.h"

#include <cstdint>
#include <string_view>

namespace kvc {

/// The hash slots of a Redis Cluster.
constexpr int kRedisSlots = 16384;

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
uint16_t redisCrc16(std::string_view bytes);
/// The slot of `key`: of its hash tag (the text between its first "{" and
/// the next "}", when not empty), else of the whole key.
int redisHashSlot(std::string_view key);

/// Connects to the cluster `nodes` ("HOST:PORT[,HOST:PORT...]", any of its
/// nodes) and reads its slot map; `url` names it in messages. `options`
/// hold for every node; with `readReplicas`, reads go to a replica of each
/// key's slot first (the master when it fails).
StatusOr<std::unique_ptr<Tier>>
openRedisClusterTier(const std::string &url, const std::string &nodes,
                     RedisOptions options = {}, bool readReplicas = false);

} // namespace kvc

#endif // KVC_LIB_RUNTIME_STORE_REDISCLUSTERTIER_H
