//===- Tier.cpp - The mem:// tier, throttling, URLs
//------------------------===//

#include "kvc/Runtime/Store/Tier.h"

#include "LocalTiers.h"
#include "RedisClusterTier.h"
#include "RedisTier.h"
#include "SealedTier.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <unordered_map>

namespace kvc {

Tier::~Tier() = default;

std::vector<Status> Tier::getMany(const std::vector<std::string> &names,
                                  std::vector<std::string> &buffers) {
  buffers.resize(names.size());
  std::vector<Status> out;
  for (size_t i = 0; i < names.size(); ++i)
    out.push_back(get(names[i], buffers[i]));
  return out;
}

namespace {

/// Copies `bytes` into `parts` when they are as long; their length.
size_t copyInto(std::string_view bytes, const std::vector<ByteSpan> &parts) {
  if (bytes.size() != totalSize(parts))
    return bytes.size();
  const char *from = bytes.data();
  for (const ByteSpan &part : parts) {
    std::memcpy(part.data, from, part.size);
    from += part.size;
  }
  return bytes.size();
}

} // namespace

Status missingObject(const std::string &url, const std::string &name) {
  return chunkError(ChunkFault::Missing, url + ": no object " + name);
}

StatusOr<size_t> Tier::getInto(const std::string &name,
                               const std::vector<ByteSpan> &parts) {
  thread_local std::string buffer;
  KVC_RETURN_IF_ERROR(get(name, buffer));
  return copyInto(buffer, parts);
}

namespace {

namespace fs = std::filesystem;

/// Host DRAM, bounded by `capacity` bytes; the least recently used objects
/// are evicted to make room.
class MemTier final : public Tier {
public:
  MemTier(std::string url, size_t capacity)
      : url_(std::move(url)), capacity_(capacity) {}

  const std::string &url() const override { return url_; }
  size_t capacity() const { return capacity_; }

  Status put(const std::string &name, std::string_view bytes) override {
    if (bytes.size() > capacity_)
      return failedPrecondition(url_ + ": object of " +
                                std::to_string(bytes.size()) +
                                " bytes exceeds the tier's capacity");
    auto stored = std::make_shared<const std::string>(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    eraseLocked(name);
    while (used_ + bytes.size() > capacity_ && !lru_.empty())
      eraseLocked(lru_.back());
    lru_.push_front(name);
    objects_[name] = {std::move(stored), lru_.begin()};
    used_ += bytes.size();
    return Status::ok();
  }

  Status get(const std::string &name, std::string &buffer) override {
    KVC_ASSIGN_OR_RETURN(bytes, find(name));
    buffer.assign(*bytes);
    return Status::ok();
  }

  StatusOr<size_t> getInto(const std::string &name,
                           const std::vector<ByteSpan> &parts) override {
    KVC_ASSIGN_OR_RETURN(bytes, find(name));
    return copyInto(*bytes, parts);
  }
  bool readsInPlace() const override { return true; }

  StatusOr<bool> exists(const std::string &name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return objects_.count(name) > 0;
  }

  Status remove(const std::string &name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    eraseLocked(name);
    return Status::ok();
  }

  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> names;
    for (const auto &[name, object] : objects_)
      if (name.compare(0, prefix.size(), prefix) == 0)
        names.push_back(name);
    std::sort(names.begin(), names.end());
    return names;
  }

private:
  /// The bytes of `name`, marked used. Copied out after the lock is let go,
  /// so that readers copy side by side; the object outlives its removal or
  /// replacement while a reader holds it.
  StatusOr<std::shared_ptr<const std::string>> find(const std::string &name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(name);
    if (it == objects_.end())
      return missingObject(url_, name);
    lru_.splice(lru_.begin(), lru_, it->second.position);
    return it->second.bytes;
  }

  void eraseLocked(const std::string &name) {
    auto it = objects_.find(name);
    if (it == objects_.end())
      return;
    used_ -= it->second.bytes->size();
    lru_.erase(it->second.position);
    objects_.erase(it);
  }

  struct Object {
    std::shared_ptr<const std::string> bytes;
    std::list<std::string>::iterator position;
  };
  std::string url_;
  size_t capacity_;
  size_t used_ = 0;
  std::mutex mutex_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, Object> objects_;
};

/// Copies every object of the file store at `directory` into `memory`;
/// refused when they do not all fit (the tier would evict some of them).
Status fillMemory(MemTier &memory, const std::string &directory) {
  if (directory.empty() || directory[0] != '/')
    return invalidArgument("from=" + directory +
                           ": a file store's absolute path, as from=/tmp/kv");
  KVC_ASSIGN_OR_RETURN(source,
                       openTier("file://" + directory, TierAccess::Existing));
  KVC_ASSIGN_OR_RETURN(names, source->list(""));
  std::string bytes;
  size_t total = 0;
  for (const std::string &name : names) {
    KVC_RETURN_IF_ERROR(source->get(name, bytes));
    total += bytes.size();
    if (total > memory.capacity())
      return failedPrecondition(
          "from=" + directory + ": the store holds more than the " +
          "tier's capacity of " + std::to_string(memory.capacity() >> 20) +
          " MiB (set capacity_mb)");
    KVC_RETURN_IF_ERROR(memory.put(name, bytes));
  }
  return Status::ok();
}

/// Throttles another tier to `gbps` gigabits per second: every transfer
/// reserves its share of a single timeline, so concurrent users share the
/// bandwidth as they would share a link. The inner tier's own work (a
/// file's read, say) runs while the transfer's time passes, as a network
/// card's DMA runs beside the host: a transfer takes the longer of the two,
/// not their sum.
class ThrottledTier final : public ForwardingTier {
public:
  ThrottledTier(std::unique_ptr<Tier> inner, double gbps, std::string url)
      : ForwardingTier(std::move(inner)), bytesPerSecond_(gbps * 1e9 / 8),
        url_(std::move(url)) {}

  const std::string &url() const override { return url_; }

  Status put(const std::string &name, std::string_view bytes) override {
    const Clock::time_point started = Clock::now();
    Status status = inner().put(name, bytes);
    wait(started, bytes.size());
    return status;
  }
  Status get(const std::string &name, std::string &buffer) override {
    const Clock::time_point started = Clock::now();
    Status status = inner().get(name, buffer);
    if (status.isOk())
      wait(started, buffer.size());
    return status;
  }
  /// Into the caller's memory as the inner tier reads, throttled alike.
  StatusOr<size_t> getInto(const std::string &name,
                           const std::vector<ByteSpan> &parts) override {
    const Clock::time_point started = Clock::now();
    StatusOr<size_t> size = inner().getInto(name, parts);
    if (size.isOk())
      wait(started, *size);
    return size;
  }
  bool readsInPlace() const override { return inner().readsInPlace(); }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    const Clock::time_point started = Clock::now();
    std::vector<Status> out = inner().getMany(names, buffers);
    size_t total = 0;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].isOk())
        total += buffers[i].size();
    wait(started, total);
    return out;
  }
  double throttleGBs() const override { return bytesPerSecond_ * 1e-9; }

private:
  using Clock = std::chrono::steady_clock;

  /// Waits until `bytes`, sent from `started` on (or from when the link is
  /// free, if later), have crossed the link.
  void wait(Clock::time_point started, size_t bytes) {
    Clock::time_point until;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      next_ =
          std::max(next_, started) +
          std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double>(double(bytes) / bytesPerSecond_));
      until = next_;
    }
    std::this_thread::sleep_until(until);
  }

  double bytesPerSecond_;
  std::string url_;
  std::mutex mutex_;
  Clock::time_point next_{};
};

/// "a=1&b=2" -> map.
std::map<std::string, std::string> parseQuery(const std::string &query) {
  std::map<std::string, std::string> out;
  size_t at = 0;
  while (at < query.size()) {
    size_t end = query.find('&', at);
    std::string item = query.substr(at, end - at);
    size_t eq = item.find('=');
    out[item.substr(0, eq)] = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  return out;
}

} // namespace

namespace {

/// Takes `[user[:password]@]` out of `url` into `user` and `password`, so
/// that no message and no tier's name holds it.
void takeCredentials(std::string &url, std::string &user,
                     std::string &password) {
  const size_t from = url.find("://") + 3;
  const size_t end = url.find_first_of("/?", from);
  const size_t at = url.rfind('@', end == std::string::npos ? url.size() : end);
  if (at == std::string::npos || at < from)
    return;
  const std::string info = url.substr(from, at - from);
  const size_t colon = info.find(':');
  user = colon == std::string::npos ? "" : info.substr(0, colon);
  password = colon == std::string::npos ? info : info.substr(colon + 1);
  url.erase(from, at + 1 - from);
}

/// The options of the redis schemes, shared by their nodes; credentials
/// from the URL, else from $KVC_REDIS_USER and $KVC_REDIS_PASSWORD.
StatusOr<RedisOptions> redisOptions(TierUrl &url) {
  RedisOptions options;
  KVC_ASSIGN_OR_RETURN(timeoutMs, url.number("timeout_ms", 10000));
  KVC_ASSIGN_OR_RETURN(replicas, url.number("replicas", 0));
  KVC_ASSIGN_OR_RETURN(ttl, url.number("ttl_s", 0));
  options.commandTimeoutMs = int(timeoutMs);
  options.waitReplicas = int(replicas);
  options.ttlSeconds = int64_t(ttl);
  options.auth = {url.user, url.password};
  if (url.user.empty() && url.password.empty()) {
    if (const char *password = std::getenv("KVC_REDIS_PASSWORD"))
      options.auth.password = password;
    if (const char *user = std::getenv("KVC_REDIS_USER"))
      options.auth.user = user;
  }
  return options;
}

StatusOr<std::unique_ptr<Tier>> openMemTier(TierUrl &url) {
  KVC_ASSIGN_OR_RETURN(capacityMb, url.number("capacity_mb", 1024));
  // A memory tier filled at open with a file store's objects (a server's
  // DRAM tier warmed from its disk).
  const std::optional<std::string> from = url.take("from");
  auto memory =
      std::make_unique<MemTier>(url.url, size_t(capacityMb * (1 << 20)));
  if (from)
    KVC_RETURN_IF_ERROR(fillMemory(*memory, *from).withContext(url.url));
  return std::unique_ptr<Tier>(std::move(memory));
}

StatusOr<std::unique_ptr<Tier>> openRedisUrl(TierUrl &url) {
  KVC_ASSIGN_OR_RETURN(options, redisOptions(url));
  return openRedisTier(url.url, url.location, std::move(options));
}

StatusOr<std::unique_ptr<Tier>> openRedisClusterUrl(TierUrl &url) {
  KVC_ASSIGN_OR_RETURN(options, redisOptions(url));
  bool readReplicas = false;
  if (std::optional<std::string> read = url.take("read")) {
    if (*read != "replicas" && *read != "masters")
      return invalidArgument(url.url + ": read must be replicas or masters");
    readReplicas = *read == "replicas";
  }
  return openRedisClusterTier(url.url, url.location, std::move(options),
                              readReplicas);
}

/// The schemes openTier knows: the built-in ones first, then those
/// registered (registerTierScheme).
struct TierSchemes {
  std::mutex mutex;
  std::vector<TierScheme> schemes = {
      {"mem",
       TierDesc::Kind::DRAM,
       "mem://",
       {"capacity_mb", "from"},
       false,
       openMemTier},
      {"file",
       TierDesc::Kind::Disk,
       "file:///DIR",
       {"capacity_mb"},
       false,
       openFileTier},
      {"redis",
       TierDesc::Kind::Remote,
       "redis://HOST:PORT[/DB]",
       {"timeout_ms", "replicas", "ttl_s"},
       true,
       openRedisUrl},
      {"redis-cluster",
       TierDesc::Kind::Remote,
       "redis-cluster://HOST:PORT[,HOST:PORT...]",
       {"timeout_ms", "replicas", "ttl_s", "read"},
       true,
       openRedisClusterUrl},
  };
};

TierSchemes &tierSchemes() {
  static TierSchemes *schemes = new TierSchemes;
  return *schemes;
}

} // namespace

std::optional<std::string> TierUrl::take(const std::string &key) {
  auto it = options.find(key);
  if (it == options.end())
    return std::nullopt;
  std::string value = std::move(it->second);
  options.erase(it);
  return value;
}

StatusOr<double> TierUrl::number(const std::string &key, double fallback) {
  std::optional<std::string> text = take(key);
  if (!text)
    return fallback;
  char *end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end || !(value > 0))
    return invalidArgument(url + ": " + key + " must be a positive number");
  return value;
}

void registerTierScheme(TierScheme scheme) {
  TierSchemes &all = tierSchemes();
  std::lock_guard<std::mutex> lock(all.mutex);
  for (TierScheme &known : all.schemes)
    if (known.scheme == scheme.scheme) {
      known = std::move(scheme);
      return;
    }
  all.schemes.push_back(std::move(scheme));
}

StatusOr<TierScheme> tierSchemeOf(const std::string &url) {
  const size_t colon = url.find("://");
  TierSchemes &all = tierSchemes();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::string known;
  for (const TierScheme &scheme : all.schemes) {
    if (colon != std::string::npos &&
        url.compare(0, colon, scheme.scheme) == 0 &&
        colon == scheme.scheme.size())
      return scheme;
    known += (known.empty() ? "" : ", ") + scheme.form;
  }
  return invalidArgument(url + ": unknown tier (expected " + known + ")");
}

StatusOr<std::unique_ptr<Tier>> openTier(const std::string &given,
                                         TierAccess access) {
  KVC_ASSIGN_OR_RETURN(scheme, tierSchemeOf(given));
  TierUrl url;
  url.url = given;
  url.access = access;
  if (scheme.credentials)
    takeCredentials(url.url, url.user, url.password);
  const size_t q = url.url.find('?');
  url.location = url.url.substr(0, q).substr(scheme.scheme.size() + 3);
  if (q != std::string::npos)
    url.options = parseQuery(url.url.substr(q + 1));
  // The options of every scheme: a throttle, and a deployment key that
  // seals every object (SealedTier.h), from the URL or for every store
  // from the environment.
  KVC_ASSIGN_OR_RETURN(gbps, url.number("gbps", 0));
  std::string keyFile;
  if (std::optional<std::string> key = url.take("key_file"))
    keyFile = *key;
  else if (const char *env = std::getenv("KVC_STORE_KEY_FILE"))
    keyFile = env;
  for (const auto &[option, value] : url.options)
    if (std::find(scheme.options.begin(), scheme.options.end(), option) ==
        scheme.options.end())
      return invalidArgument(url.url + ": unknown option " + option);
  KVC_ASSIGN_OR_RETURN(tier, scheme.open(url));
  if (!keyFile.empty()) {
    KVC_ASSIGN_OR_RETURN(key, readDeploymentKey(keyFile));
    KVC_ASSIGN_OR_RETURN(sealed, sealTier(std::move(tier), std::move(key)));
    tier = std::move(sealed);
  }
  if (gbps > 0)
    return throttleTier(std::move(tier), gbps, url.url);
  return tier;
}

std::unique_ptr<Tier> throttleTier(std::unique_ptr<Tier> inner, double gbps,
                                   std::string url) {
  return std::make_unique<ThrottledTier>(std::move(inner), gbps,
                                         std::move(url));
}

} // namespace kvc
