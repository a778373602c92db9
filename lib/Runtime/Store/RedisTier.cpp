//===- RedisTier.cpp - The redis:// tier ----------------------------------===//
//
// One connection per tier, serialized by a mutex; reads of many objects are
// pipelined (all GETs sent, then all replies read), which is what makes a
// remote pool fast for chunked restores. Connections time out (1 s to
// connect, 10 s per command) and are re-established after a failure, so an
// unreachable server is an error value, not a hang.
//
//===----------------------------------------------------------------------===//

#include "RedisTier.h"

#include "kvc/Runtime/Store/ChunkFormat.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <mutex>

namespace kvc {

namespace {

using ReplyPtr = std::unique_ptr<redisReply, void (*)(void *)>;

/// Reply functions that copy each bulk string straight into its caller's
/// buffer, skipping hiredis' own copy of multi-megabyte values.
struct DirectTarget {
  std::vector<std::string> *buffers = nullptr;
  size_t index = 0;
  std::string error;
};
struct DirectReply {
  int type;
};

void *directString(const redisReadTask *task, char *str, size_t len) {
  auto *target = static_cast<DirectTarget *>(task->privdata);
  if (task->type == REDIS_REPLY_STRING && !task->parent)
    (*target->buffers)[target->index].assign(str, len);
  else if (task->type == REDIS_REPLY_ERROR)
    target->error.assign(str, len);
  return new DirectReply{task->type};
}
void *directArray(const redisReadTask *task, int) {
  return new DirectReply{task->type};
}
void *directInteger(const redisReadTask *task, long long) {
  return new DirectReply{task->type};
}
void *directNil(const redisReadTask *) {
  // The task of a nil bulk string still says "string".
  return new DirectReply{REDIS_REPLY_NIL};
}
void directFree(void *reply) { delete static_cast<DirectReply *>(reply); }

redisReplyObjectFunctions kDirectFunctions = {
    directString, directArray, directInteger, directNil, directFree};

class RedisTier final : public Tier {
public:
  RedisTier(std::string url, std::string host, int port, int db)
      : url_(std::move(url)), host_(std::move(host)), port_(port), db_(db) {}
  ~RedisTier() override {
    if (context_)
      redisFree(context_);
  }

  const std::string &url() const override { return url_; }

  Status connect() {
    std::lock_guard<std::mutex> lock(mutex_);
    return connectLocked();
  }

  Status put(const std::string &name, std::string_view bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<ReplyPtr> reply = command("SET %b %b", name.data(), name.size(),
                                       bytes.data(), bytes.size());
    if (!reply.isOk())
      return reply.status();
    return Status::ok();
  }

  Status get(const std::string &name, std::string &buffer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<ReplyPtr> reply = command("GET %b", name.data(), name.size());
    if (!reply.isOk())
      return reply.status();
    return takeString(**reply, name, buffer);
  }

  std::vector<Status> getMany(const std::vector<std::string> &names,
                              std::vector<std::string> &buffers) override {
    std::lock_guard<std::mutex> lock(mutex_);
    buffers.resize(names.size());
    std::vector<Status> out(names.size());
    Status connected = connectLocked();
    if (!connected.isOk()) {
      std::fill(out.begin(), out.end(), connected);
      return out;
    }
    for (const std::string &name : names)
      redisAppendCommand(context_, "GET %b", name.data(), name.size());
    DirectTarget target;
    target.buffers = &buffers;
    redisReplyObjectFunctions *saved = context_->reader->fn;
    context_->reader->fn = &kDirectFunctions;
    context_->reader->privdata = &target;
    auto restore = [&] {
      context_->reader->fn = saved;
      context_->reader->privdata = nullptr;
    };
    for (size_t i = 0; i < names.size(); ++i) {
      target.index = i;
      void *raw = nullptr;
      if (redisGetReply(context_, &raw) != REDIS_OK) {
        restore();
        Status lost = lostConnection();
        for (size_t j = i; j < names.size(); ++j)
          out[j] = lost;
        return out;
      }
      auto *reply = static_cast<DirectReply *>(raw);
      if (reply->type == REDIS_REPLY_NIL)
        out[i] = chunkError(ChunkFault::Missing,
                            url_ + ": no object " + names[i]);
      else if (reply->type == REDIS_REPLY_ERROR)
        out[i] = unavailable("redis error: " + target.error);
      else if (reply->type != REDIS_REPLY_STRING)
        out[i] = unavailable("unexpected reply to GET " + names[i]);
      directFree(reply);
    }
    restore();
    return out;
  }

  StatusOr<bool> exists(const std::string &name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<ReplyPtr> reply = command("EXISTS %b", name.data(), name.size());
    if (!reply.isOk())
      return reply.status();
    return (*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer > 0;
  }

  Status remove(const std::string &name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<ReplyPtr> reply = command("DEL %b", name.data(), name.size());
    return reply.isOk() ? Status::ok() : reply.status();
  }

  StatusOr<std::vector<std::string>> list(const std::string &prefix) override {
    std::lock_guard<std::mutex> lock(mutex_);
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

  Status connectLocked() {
    if (context_)
      return Status::ok();
    timeval connectTimeout{1, 0}, commandTimeout{10, 0};
    context_ = redisConnectWithTimeout(host_.c_str(), port_, connectTimeout);
    if (!context_ || context_->err) {
      std::string why = context_ ? context_->errstr : "out of memory";
      if (context_)
        redisFree(context_);
      context_ = nullptr;
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
      bool ok = reply && reply->type != REDIS_REPLY_ERROR;
      if (reply)
        freeReplyObject(reply);
      if (!ok)
        return lostConnection();
    }
    return Status::ok();
  }

  /// Drops the connection (the next call reconnects) and reports it.
  Status lostConnection() {
    std::string why = context_ && context_->err ? context_->errstr
                                                : "connection lost";
    if (context_)
      redisFree(context_);
    context_ = nullptr;
    return unavailable(why);
  }

  template <typename... Args>
  StatusOr<ReplyPtr> command(const char *format, Args... args) {
    KVC_RETURN_IF_ERROR(connectLocked());
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

  std::string url_, host_;
  int port_, db_;
  std::mutex mutex_;
  redisContext *context_ = nullptr;
};

} // namespace

StatusOr<std::unique_ptr<Tier>> openRedisTier(const std::string &url,
                                              const std::string &hostPortDb) {
  std::string rest = hostPortDb, host;
  int port = 6379, db = 0;
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
