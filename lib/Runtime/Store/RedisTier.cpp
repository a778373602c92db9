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
#include <cstring>
#include <condition_variable>
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

/// One connection to the server, used by one caller at a time (the tier's
/// pool hands it out). Commands time out (1 s to connect, 10 s each) and a
/// failure drops the connection, which the next command re-establishes.
class RedisConnection {
public:
  RedisConnection(const std::string &url, const std::string &host, int port,
                  int db)
      : url_(url), host_(host), port_(port), db_(db) {}
  ~RedisConnection() { disconnect(); }
  RedisConnection(const RedisConnection &) = delete;
  RedisConnection &operator=(const RedisConnection &) = delete;

  /// Connects unless connected.
  Status connect() {
    if (context_)
      return Status::ok();
    timeval connectTimeout{1, 0}, commandTimeout{10, 0};
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
    if (db_ != 0) {
      auto *reply = static_cast<redisReply *>(
          redisCommand(context_, "SELECT %d", db_));
      if (!reply)
        return lostConnection();
      const bool refused = reply->type == REDIS_REPLY_ERROR;
      const std::string why = refused ? std::string(reply->str, reply->len)
                                      : std::string();
      freeReplyObject(reply);
      if (refused) {
        disconnect();
        return Status(StatusCode::InvalidArgument,
                      url_ + ": database " + std::to_string(db_) +
                          " refused by the server: " + why);
      }
    }
    return Status::ok();
  }

  Status put(const std::string &name, std::string_view bytes) {
    StatusOr<ReplyPtr> reply = command("SET %b %b", name.data(), name.size(),
                                       bytes.data(), bytes.size());
    if (!reply.isOk())
      return reply.status();
    return Status::ok();
  }

  Status get(const std::string &name, std::string &buffer) {
    StatusOr<ReplyPtr> reply = command("GET %b", name.data(), name.size());
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
          command("SCAN %s MATCH %b COUNT 1000", cursor.c_str(),
                  pattern.data(), pattern.size());
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
    auto [end, ec] = std::from_chars(text.data() + 1,
                                     text.data() + text.size(), size);
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
    std::string why = context_ && context_->err ? context_->errstr
                                                : "connection lost";
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
  int port_, db_;
  redisContext *context_ = nullptr;
};


/// The redis:// tier: a pool of connections, one per concurrent caller (up
/// to kMaxConnections, made as callers need them), so that an executor's IO
/// lanes read in parallel instead of queueing on one socket.
class RedisTier final : public Tier {
public:
  static constexpr std::size_t kMaxConnections = 8;

  RedisTier(std::string url, std::string host, int port, int db)
      : url_(std::move(url)), host_(std::move(host)), port_(port), db_(db) {}

  const std::string &url() const override { return url_; }

  /// Connects one connection now, so that an unreachable server is an
  /// error at open.
  Status connect() { return Lease(*this)->connect(); }

  Status put(const std::string &name, std::string_view bytes) override {
    return Lease(*this)->put(name, bytes);
  }
  Status get(const std::string &name, std::string &buffer) override {
    return Lease(*this)->get(name, buffer);
  }
  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    return Lease(*this)->getMany(names, buffers);
  }
  StatusOr<bool> exists(const std::string &name) override {
    return Lease(*this)->exists(name);
  }
  Status remove(const std::string &name) override {
    return Lease(*this)->remove(name);
  }
  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    return Lease(*this)->list(prefix);
  }

private:
  /// Exclusive use of one connection for one call.
  class Lease {
  public:
    explicit Lease(RedisTier &tier) : tier_(tier) {
      std::unique_lock<std::mutex> lock(tier_.mutex_);
      tier_.released_.wait(lock, [&] {
        return !tier_.idle_.empty() ||
               tier_.connections_ < kMaxConnections;
      });
      if (!tier_.idle_.empty()) {
        connection_ = std::move(tier_.idle_.back());
        tier_.idle_.pop_back();
        return;
      }
      ++tier_.connections_;
      lock.unlock();
      connection_ = std::make_unique<RedisConnection>(
          tier_.url_, tier_.host_, tier_.port_, tier_.db_);
    }
    ~Lease() {
      {
        std::lock_guard<std::mutex> lock(tier_.mutex_);
        tier_.idle_.push_back(std::move(connection_));
      }
      tier_.released_.notify_one();
    }
    RedisConnection *operator->() { return connection_.get(); }

  private:
    RedisTier &tier_;
    std::unique_ptr<RedisConnection> connection_;
  };

  std::string url_, host_;
  int port_, db_;
  std::mutex mutex_; ///< Guards the pool below.
  std::condition_variable released_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
  std::size_t connections_ = 0;
};

} // namespace

StatusOr<std::unique_ptr<Tier>> openRedisTier(const std::string &url,
                                              const std::string &hostPortDb) {
  std::string rest = hostPortDb, host;
  int port = 6379, db = 0;
  // A user or password in the URL is never echoed: not in this error, and
  // not in the tier's name.
  if (size_t at = rest.rfind('@'); at != std::string::npos)
    return invalidArgument("redis://(user information hidden)@" +
                           rest.substr(at + 1) +
                           ": a user or password in a redis URL is not "
                           "supported");
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
  size_t colon = rest.rfind(':');
  host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    char *end = nullptr;
    std::string portText = rest.substr(colon + 1);
    port = int(std::strtol(portText.c_str(), &end, 10));
    if (*end || port <= 0 || port > 65535)
      return invalidArgument(url + ": bad port " + portText);
  }
  if (host.empty())
    return invalidArgument(url + ": missing host");
  auto tier = std::make_unique<RedisTier>(url, host, port, db);
  // Connect now so that an unreachable server is reported at open; later
  // failures reconnect lazily.
  KVC_RETURN_IF_ERROR(tier->connect());
  return std::unique_ptr<Tier>(std::move(tier));
}

} // namespace kvc
