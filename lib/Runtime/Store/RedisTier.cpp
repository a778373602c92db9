//===- RedisTier.cpp - The redis:// tier ----------------------------------===//
//
// A pool of connections, one per concurrent caller, so that a restore's IO
// lanes read in parallel; reads of many objects are pipelined (all GETs
// sent, then all replies read straight into the callers' buffers), which is
// what makes a remote pool fast for chunked restores. Connections time out
// (1 s to connect, 10 s per command) and are re-established after a
// failure, so an unreachable server is an error value, not a hang.
//
//===----------------------------------------------------------------------===//

#include "RedisTier.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include <unistd.h>

namespace kvc {

namespace {

using ReplyPtr = std::unique_ptr<redisReply, void (*)(void *)>;

/// Reads the replies to pipelined GETs from the socket into their callers'
/// buffers. hiredis' reader copies every byte twice before a caller sees it
/// (socket -> a 16 KiB stack buffer -> its reply buffer); here a bulk string
/// goes from the socket to its destination in one read() of up to its whole
/// length, and only the short reply headers pass through a small buffer.
/// Used only between complete commands, when hiredis' reader holds nothing;
/// any failure leaves the stream position unknown, so the caller drops the
/// connection.
class ReplyStream {
public:
  ReplyStream(int fd, const std::string &url) : fd_(fd), url_(url) {}

  /// Reads one reply header line (without its CRLF).
  StatusOr<std::string_view> line() {
    for (;;) {
      const char *begin = buffer_ + pos_;
      const void *cr = std::memchr(begin, '\r', len_ - pos_);
      if (cr && static_cast<const char *>(cr) + 1 < buffer_ + len_) {
        size_t n = static_cast<const char *>(cr) - begin;
        pos_ += n + 2;
        return std::string_view(begin, n);
      }
      if (pos_ == 0 && len_ == sizeof(buffer_))
        return fail("reply header too long");
      std::memmove(buffer_, buffer_ + pos_, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
      StatusOr<size_t> n = readSome(buffer_ + len_, sizeof(buffer_) - len_);
      if (!n.isOk())
        return n.status();
      len_ += *n;
    }
  }

  /// Reads exactly `size` bytes into `out`: first what is buffered, then
  /// straight from the socket.
  Status read(char *out, size_t size) {
    size_t buffered = std::min(size, len_ - pos_);
    std::memcpy(out, buffer_ + pos_, buffered);
    pos_ += buffered;
    for (size_t done = buffered; done < size;) {
      StatusOr<size_t> n = readSome(out + done, size - done);
      if (!n.isOk())
        return n.status();
      done += *n;
    }
    return Status::ok();
  }

  bool drained() const { return pos_ == len_; }

private:
  StatusOr<size_t> readSome(char *out, size_t capacity) {
    for (;;) {
      ssize_t n = ::read(fd_, out, capacity);
      if (n > 0)
        return size_t(n);
      if (n < 0 && errno == EINTR)
        continue;
      std::string why = n == 0 ? "server closed the connection"
                        : (errno == EAGAIN || errno == EWOULDBLOCK)
                            ? "timed out waiting for redis"
                            : std::strerror(errno);
      return fail(why);
    }
  }

  Status fail(const std::string &why) const {
    return chunkError(ChunkFault::Unavailable, url_ + ": " + why);
  }

  int fd_;
  const std::string &url_;
  char buffer_[4096];
  size_t pos_ = 0, len_ = 0;
};

} // namespace

/// One connection to the server, used by one caller at a time (the tier's
/// pool hands it out). Commands time out (1 s to connect, 10 s each) and a
/// failure drops the connection, which the next command re-establishes.
class RedisConnection {
public:
  RedisConnection(const std::string &url, const std::string &host, int port,
                  const RedisOptions &options)
      : url_(url), host_(host), port_(port), options_(options) {}
  ~RedisConnection() { disconnect(); }
  RedisConnection(const RedisConnection &) = delete;
  RedisConnection &operator=(const RedisConnection &) = delete;

  /// Connects unless connected.
  Status connect() {
    if (context_)
      return Status::ok();
    timeval connectTimeout{1, 0},
        commandTimeout{options_.commandTimeoutMs / 1000,
                       (options_.commandTimeoutMs % 1000) * 1000};
    context_ = redisConnectWithTimeout(host_.c_str(), port_, connectTimeout);
    if (!context_ || context_->err) {
      std::string why = context_ ? context_->errstr : "out of memory";
      disconnect();
      return unavailable("cannot connect to redis at " + host_ + ":" +
                         std::to_string(port_) + ": " + why);
    }
    redisSetTimeout(context_, commandTimeout);
    // Keep the reply buffer between multi-megabyte replies instead of
    // shrinking it after each (hiredis' default frees above 16 KiB).
    context_->reader->maxbuf = 0;
    // The connection's set-up: each refusal drops it, with the reason.
    auto setUp = [&](void *raw, auto refusal) -> Status {
      auto *reply = static_cast<redisReply *>(raw);
      if (!reply)
        return lostConnection();
      const bool refused = reply->type == REDIS_REPLY_ERROR;
      const std::string why =
          refused ? std::string(reply->str, reply->len) : std::string();
      freeReplyObject(reply);
      if (!refused)
        return Status::ok();
      disconnect();
      return refusal(why);
    };
    if (!options_.auth.password.empty())
      KVC_RETURN_IF_ERROR(setUp(
          options_.auth.user.empty()
              ? redisCommand(context_, "AUTH %b", options_.auth.password.data(),
                             options_.auth.password.size())
              : redisCommand(context_, "AUTH %b %b", options_.auth.user.data(),
                             options_.auth.user.size(),
                             options_.auth.password.data(),
                             options_.auth.password.size()),
          [&](const std::string &) {
            // Not the server's words: they may quote what it was sent.
            return invalidArgument(url_ +
                                   ": redis refused the credentials (AUTH): a "
                                   "wrong password or user, or one it does "
                                   "not know");
          }));
    if (options_.readOnly)
      KVC_RETURN_IF_ERROR(setUp(
          redisCommand(context_, "READONLY"), [&](const std::string &why) {
            return unavailable("READONLY refused: " + why);
          }));
    if (options_.db != 0)
      KVC_RETURN_IF_ERROR(
          setUp(redisCommand(context_, "SELECT %d", options_.db),
                [&](const std::string &why) {
                  return invalidArgument(url_ + ": database " +
                                         std::to_string(options_.db) +
                                         " refused by the server: " + why);
                }));
    return Status::ok();
  }

  Status put(const std::string &name, std::string_view bytes) {
    // With a TTL, an object lives that long past its last use (GETEX
    // renews it on every read).
    StatusOr<ReplyPtr> reply =
        options_.ttlSeconds > 0
            ? command("SET %b %b EX %lld", name.data(), name.size(),
                      bytes.data(), bytes.size(),
                      (long long)options_.ttlSeconds)
            : command("SET %b %b", name.data(), name.size(), bytes.data(),
                      bytes.size());
    if (!reply.isOk())
      return reply.status();
    if (options_.waitReplicas > 0) {
      // Acknowledged once replicated (bounded by the command timeout):
      // what a failover promotes holds it. Fewer replicas in time is no
      // error; the master holds the object.
      StatusOr<ReplyPtr> waited = command("WAIT %d %d", options_.waitReplicas,
                                          options_.commandTimeoutMs);
      if (!waited.isOk())
        return waited.status();
    }
    return Status::ok();
  }

  Status get(const std::string &name, std::string &buffer) {
    StatusOr<ReplyPtr> reply =
        options_.ttlSeconds > 0
            ? command("GETEX %b EX %lld", name.data(), name.size(),
                      (long long)options_.ttlSeconds)
            : command("GET %b", name.data(), name.size());
    if (!reply.isOk())
      return reply.status();
    return takeString(**reply, name, buffer);
  }

  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) {
    buffers.resize(names.size());
    std::vector<Status> out(names.size());
    Status connected = connect();
    if (!connected.isOk()) {
      std::fill(out.begin(), out.end(), connected);
      return out;
    }
    for (const std::string &name : names)
      if (options_.ttlSeconds > 0)
        redisAppendCommand(context_, "GETEX %b EX %lld", name.data(),
                           name.size(), (long long)options_.ttlSeconds);
      else
        redisAppendCommand(context_, "GET %b", name.data(), name.size());
    for (int done = 0; !done;)
      if (redisBufferWrite(context_, &done) != REDIS_OK) {
        std::fill(out.begin(), out.end(), lostConnection());
        return out;
      }
    ReplyStream stream(context_->fd, url_);
    for (size_t i = 0; i < names.size(); ++i) {
      Status read = readGetReply(stream, names[i], buffers[i], out[i]);
      if (!read.isOk()) {
        disconnect();
        for (size_t j = i; j < names.size(); ++j)
          out[j] = read;
        return out;
      }
    }
    if (!stream.drained()) {
      disconnect();
      std::fill(out.begin(), out.end(),
                unavailable("unexpected data after the replies to GET"));
    }
    return out;
  }

  StatusOr<bool> exists(const std::string &name) {
    StatusOr<ReplyPtr> reply = command("EXISTS %b", name.data(), name.size());
    if (!reply.isOk())
      return reply.status();
    return (*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer > 0;
  }

  Status remove(const std::string &name) {
    StatusOr<ReplyPtr> reply = command("DEL %b", name.data(), name.size());
    return reply.isOk() ? Status::ok() : reply.status();
  }

  StatusOr<std::vector<std::string>> list(const std::string &prefix) {
    std::vector<std::string> names;
    std::string pattern = prefix + "*";
    std::string cursor = "0";
    do {
      StatusOr<ReplyPtr> reply =
          command("SCAN %s MATCH %b COUNT 1000", cursor.c_str(), pattern.data(),
                  pattern.size());
      if (!reply.isOk())
        return reply.status();
      redisReply *r = reply->get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
        return unavailable("unexpected SCAN reply");
      cursor.assign(r->element[0]->str, r->element[0]->len);
      for (size_t i = 0; i < r->element[1]->elements; ++i)
        names.emplace_back(r->element[1]->element[i]->str,
                           r->element[1]->element[i]->len);
    } while (cursor != "0");
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  /// Sends ASKING: the next command on this connection may address a
  /// slot the node is importing (a redirect during resharding).
  Status asking() {
    StatusOr<ReplyPtr> reply = command("ASKING");
    return reply.isOk() ? Status::ok() : reply.status();
  }

  /// CLUSTER SLOTS: each slot range's master and replicas.
  StatusOr<std::vector<RedisSlotRange>> clusterSlots() {
    KVC_ASSIGN_OR_RETURN(reply, command("CLUSTER SLOTS"));
    const redisReply &r = *reply;
    if (r.type != REDIS_REPLY_ARRAY)
      return unavailable("unexpected CLUSTER SLOTS reply");
    std::vector<RedisSlotRange> ranges;
    for (size_t i = 0; i < r.elements; ++i) {
      const redisReply &range = *r.element[i];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
          range.element[0]->type != REDIS_REPLY_INTEGER ||
          range.element[1]->type != REDIS_REPLY_INTEGER)
        return unavailable("malformed CLUSTER SLOTS range");
      RedisSlotRange out;
      out.first = int(range.element[0]->integer);
      out.last = int(range.element[1]->integer);
      for (size_t n = 2; n < range.elements; ++n) {
        const redisReply &node = *range.element[n];
        if (node.type != REDIS_REPLY_ARRAY || node.elements < 2 ||
            node.element[0]->type != REDIS_REPLY_STRING ||
            node.element[1]->type != REDIS_REPLY_INTEGER)
          return unavailable("malformed CLUSTER SLOTS node");
        std::string host(node.element[0]->str, node.element[0]->len);
        if (host.empty()) // The node that answered: its own address.
          host = host_;
        out.nodes.push_back(host + ":" +
                            std::to_string(node.element[1]->integer));
      }
      ranges.push_back(std::move(out));
    }
    return ranges;
  }

private:
  Status unavailable(const std::string &message) {
    return chunkError(ChunkFault::Unavailable, url_ + ": " + message);
  }

  /// Reads the reply to one GET into `buffer`; `result` says what it was.
  /// An error return means the stream can no longer be trusted.
  Status readGetReply(ReplyStream &stream, const std::string &name,
                      std::string &buffer, Status &result) {
    StatusOr<std::string_view> header = stream.line();
    if (!header.isOk())
      return header.status();
    std::string_view text = *header;
    if (text.empty())
      return unavailable("empty reply header");
    if (text[0] == '-') {
      result = unavailable("redis error: " + std::string(text.substr(1)));
      return Status::ok();
    }
    if (text[0] != '$')
      return unavailable("unexpected reply to GET " + name);
    long long size = 0;
    auto [end, ec] =
        std::from_chars(text.data() + 1, text.data() + text.size(), size);
    if (ec != std::errc() || end != text.data() + text.size() || size < -1)
      return unavailable("malformed reply header to GET " + name);
    if (size == -1) {
      result = chunkError(ChunkFault::Missing, url_ + ": no object " + name);
      return Status::ok();
    }
    // A server's word is not a size to allocate: kvc's objects are chunks of
    // megabytes, far below redis' own bulk limit (512 MiB by default).
    constexpr long long kMaxValueBytes = 1ll << 30;
    if (size > kMaxValueBytes)
      return unavailable("cannot hold a reply of " + std::to_string(size) +
                         " bytes to GET " + name + " (more than 1 GiB)");
    try {
      if (buffer.size() != size_t(size))
        buffer.resize(size_t(size));
    } catch (const std::bad_alloc &) {
      return unavailable("cannot hold a reply of " + std::to_string(size) +
                         " bytes to GET " + name);
    }
    char crlf[2];
    KVC_RETURN_IF_ERROR(stream.read(buffer.data(), buffer.size()));
    KVC_RETURN_IF_ERROR(stream.read(crlf, 2));
    if (crlf[0] != '\r' || crlf[1] != '\n')
      return unavailable("malformed reply to GET " + name);
    result = Status::ok();
    return Status::ok();
  }

  /// Drops the connection; the next call reconnects.
  void disconnect() {
    if (context_)
      redisFree(context_);
    context_ = nullptr;
  }

  /// Drops the connection and reports why.
  Status lostConnection() {
    std::string why =
        context_ && context_->err ? context_->errstr : "connection lost";
    disconnect();
    return unavailable(why);
  }

  template <typename... Args>
  StatusOr<ReplyPtr> command(const char *format, Args... args) {
    KVC_RETURN_IF_ERROR(connect());
    auto *raw =
        static_cast<redisReply *>(redisCommand(context_, format, args...));
    if (!raw)
      return lostConnection();
    ReplyPtr reply(raw, freeReplyObject);
    if (reply->type == REDIS_REPLY_ERROR)
      return unavailable(std::string("redis error: ") +
                         std::string(reply->str, reply->len));
    return reply;
  }

  Status takeString(const redisReply &reply, const std::string &name,
                    std::string &buffer) {
    if (reply.type == REDIS_REPLY_NIL)
      return chunkError(ChunkFault::Missing, url_ + ": no object " + name);
    if (reply.type != REDIS_REPLY_STRING)
      return unavailable("unexpected reply to GET " + name);
    buffer.assign(reply.str, reply.len);
    return Status::ok();
  }

  const std::string &url_;
  const std::string &host_;
  int port_;
  const RedisOptions &options_; ///< The node's, which outlives it.
  redisContext *context_ = nullptr;
};

//===----------------------------------------------------------------------===//
// RedisNode
//===----------------------------------------------------------------------===//

/// Exclusive use of one connection of the node's pool for one call.
class RedisNode::Lease {
public:
  explicit Lease(RedisNode &node) : node_(node) {
    std::unique_lock<std::mutex> lock(node_.mutex_);
    node_.released_.wait(lock, [&] {
      return !node_.idle_.empty() || node_.connections_ < kMaxConnections;
    });
    if (!node_.idle_.empty()) {
      connection_ = std::move(node_.idle_.back());
      node_.idle_.pop_back();
      return;
    }
    ++node_.connections_;
    lock.unlock();
    connection_ = std::make_unique<RedisConnection>(
        node_.url_, node_.host_, node_.port_, node_.options_);
  }
  ~Lease() {
    {
      std::lock_guard<std::mutex> lock(node_.mutex_);
      node_.idle_.push_back(std::move(connection_));
    }
    node_.released_.notify_one();
  }
  RedisConnection *operator->() { return connection_.get(); }

private:
  RedisNode &node_;
  std::unique_ptr<RedisConnection> connection_;
};

RedisNode::RedisNode(std::string url, std::string host, int port,
                     RedisOptions options)
    : url_(std::move(url)), host_(std::move(host)), port_(port),
      options_(std::move(options)) {}

RedisNode::~RedisNode() = default;

Status RedisNode::connect() { return Lease(*this)->connect(); }

Status RedisNode::put(const std::string &name, std::string_view bytes) {
  return Lease(*this)->put(name, bytes);
}

Status RedisNode::get(const std::string &name, std::string &buffer) {
  return Lease(*this)->get(name, buffer);
}

std::vector<Status> RedisNode::getMany(const std::vector<std::string> &names,
                                       std::vector<std::string> &buffers) {
  return Lease(*this)->getMany(names, buffers);
}

StatusOr<bool> RedisNode::exists(const std::string &name) {
  return Lease(*this)->exists(name);
}

Status RedisNode::remove(const std::string &name) {
  return Lease(*this)->remove(name);
}

StatusOr<std::vector<std::string>> RedisNode::list(const std::string &prefix) {
  return Lease(*this)->list(prefix);
}

Status RedisNode::askingPut(const std::string &name, std::string_view bytes) {
  Lease lease(*this);
  KVC_RETURN_IF_ERROR(lease->asking());
  return lease->put(name, bytes);
}

Status RedisNode::askingGet(const std::string &name, std::string &buffer) {
  Lease lease(*this);
  KVC_RETURN_IF_ERROR(lease->asking());
  return lease->get(name, buffer);
}

StatusOr<std::vector<RedisSlotRange>> RedisNode::clusterSlots() {
  return Lease(*this)->clusterSlots();
}

StatusOr<std::pair<std::string, int>>
parseHostPort(const std::string &url, const std::string &text,
              std::optional<int> defaultPort) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos && !defaultPort)
    return invalidArgument(url + ": " + text + " is not HOST:PORT");
  const std::string host = text.substr(0, colon);
  int port = defaultPort.value_or(0);
  if (colon != std::string::npos) {
    const std::string portText = text.substr(colon + 1);
    char *end = nullptr;
    const long parsed = std::strtol(portText.c_str(), &end, 10);
    if (portText.empty() || *end || parsed <= 0 || parsed > 65535)
      return invalidArgument(url + ": bad port " + portText);
    port = int(parsed);
  }
  if (host.empty())
    return invalidArgument(url + ": missing host");
  return std::make_pair(host, port);
}

StatusOr<std::unique_ptr<Tier>> openRedisTier(const std::string &url,
                                              const std::string &hostPortDb,
                                              RedisOptions options) {
  std::string rest = hostPortDb;
  int db = options.db;
  size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    std::string dbText = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!dbText.empty()) {
      char *end = nullptr;
      db = int(std::strtol(dbText.c_str(), &end, 10));
      if (*end || db < 0)
        return invalidArgument(url + ": bad database number " + dbText);
    }
  }
  KVC_ASSIGN_OR_RETURN(address, parseHostPort(url, rest, 6379));
  options.db = db;
  auto tier = std::make_unique<RedisNode>(url, address.first, address.second,
                                          std::move(options));
  // Connect now so that an unreachable server is reported at open; later
  // failures reconnect lazily.
  KVC_RETURN_IF_ERROR(tier->connect());
  return std::unique_ptr<Tier>(std::move(tier));
}

} // namespace kvc
