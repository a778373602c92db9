//===- UcxLink.cpp - Links over UCX ---------------------------------------===//
//
// One UCP context and worker per listener or connection (the links a
// listener accepts share its worker), with the stream API: a message is an
// 8-byte little-endian length followed by its bytes, sent as one gathered
// send and received with WAITALL. Waits progress the worker and sleep on
// its event fd between progress calls, so an idle side costs no CPU; a
// deadline cancels the request and breaks the link. Peer failure is UCX's
// (UCP_ERR_HANDLING_MODE_PEER): a dead peer completes every pending request
// with an error.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Net/Link.h"

#include <ucp/api/ucp.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>

namespace kvc {

namespace {

using SteadyClock = std::chrono::steady_clock;

/// The largest message a link accepts (a chunk is megabytes; a length
/// beyond this is a corrupt stream, not a message).
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 31;

Status ucxError(const std::string &what, ucs_status_t status) {
  return unavailable(what + ": " + ucs_status_string(status));
}

/// A UCP context and its worker; UCX calls on the worker hold `mutex`.
struct Worker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int eventFd = -1;
  std::mutex mutex;

  ~Worker() {
    if (worker)
      ucp_worker_destroy(worker);
    if (context)
      ucp_cleanup(context);
  }

  /// Progresses the worker, then sleeps until it has events or `until`
  /// passes (at most a few milliseconds: another thread may take the
  /// event).
  void progressOrSleep(SteadyClock::time_point until) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (ucp_worker_progress(worker) != 0)
        return;
      if (ucp_worker_arm(worker) == UCS_ERR_BUSY)
        return;
    }
    auto left =
        std::chrono::duration_cast<Milliseconds>(until - SteadyClock::now());
    pollfd fd{eventFd, POLLIN, 0};
    ::poll(&fd, 1, int(std::clamp<int64_t>(left.count(), 0, 5)));
  }
};

StatusOr<std::shared_ptr<Worker>> createWorker() {
  auto w = std::make_shared<Worker>();
  ucp_config_t *config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK)
    return ucxError("ucx: reading its configuration", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &w->context);
  ucp_config_release(config);
  if (s != UCS_OK)
    return ucxError("ucx: initializing", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if ((s = ucp_worker_create(w->context, &wp, &w->worker)) != UCS_OK)
    return ucxError("ucx: creating a worker", s);
  if ((s = ucp_worker_get_efd(w->worker, &w->eventFd)) != UCS_OK)
    return ucxError("ucx: the worker's event fd", s);
  return w;
}

StatusOr<sockaddr_storage> resolve(const std::string &host, int port,
                                   socklen_t &length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host.empty() ? AI_PASSIVE : 0;
  addrinfo *found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                       &hints, &found);
  if (rc != 0 || !found)
    return unavailable("cannot resolve " + host + ": " + gai_strerror(rc));
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

void noSend(void *, ucs_status_t, void *) {}
void noRecv(void *, ucs_status_t, size_t, void *) {}

class UcxLink : public Link {
public:
  UcxLink(std::shared_ptr<Worker> worker, std::string peer)
      : worker_(std::move(worker)), peer_(std::move(peer)) {}

  ~UcxLink() override {
    if (!endpoint_)
      return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = broken_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void *request;
    {
      std::lock_guard<std::mutex> lock(worker_->mutex);
      request = ucp_ep_close_nbx(endpoint_, &param);
    }
    // A graceful close flushes what was sent; a peer that is gone does not
    // hold it up for long.
    (void)wait(request, SteadyClock::now() + std::chrono::seconds(2),
               /*cancelOnDeadline=*/false);
  }

  /// Creates the endpoint (a client's to `address`, or an accepted one).
  Status open(ucp_ep_params_t params) {
    params.field_mask |=
        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void *self, ucp_ep_h, ucs_status_t status) {
      auto *link = static_cast<UcxLink *>(self);
      link->failure_ = status;
      link->broken_ = true;
    };
    params.err_handler.arg = this;
    std::lock_guard<std::mutex> lock(worker_->mutex);
    ucs_status_t s = ucp_ep_create(worker_->worker, &params, &endpoint_);
    if (s != UCS_OK) {
      endpoint_ = nullptr;
      return ucxError("ucx: connecting to " + peer_, s);
    }
    return Status::ok();
  }

  /// Waits until the endpoint reaches the peer.
  Status flush(Milliseconds timeout) {
    ucp_request_param_t param{};
    void *request;
    {
      std::lock_guard<std::mutex> lock(worker_->mutex);
      request = ucp_ep_flush_nbx(endpoint_, &param);
    }
    return check("connecting to", wait(request, SteadyClock::now() + timeout));
  }

  Status send(std::string_view message) override {
    std::lock_guard<std::mutex> serial(sendMutex_);
    if (broken_)
      return brokenError("sending to");
    uint64_t length = message.size();
    ucp_dt_iov_t iov[2] = {
        {&length, sizeof length},
        {const_cast<char *>(message.data()), message.size()}};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_CALLBACK;
    param.datatype = ucp_dt_make_iov();
    param.cb.send = noSend;
    void *request;
    {
      std::lock_guard<std::mutex> lock(worker_->mutex);
      request = ucp_stream_send_nbx(endpoint_, iov, 2, &param);
    }
    return check("sending to",
                 wait(request, SteadyClock::now() + kSendTimeout));
  }

  StatusOr<std::string> receive(Milliseconds timeout) override {
    std::lock_guard<std::mutex> serial(receiveMutex_);
    const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
    uint64_t length = 0;
    KVC_RETURN_IF_ERROR(receiveExactly(&length, sizeof length, deadline));
    if (length > kMaxMessageBytes) {
      broken_ = true;
      return dataLoss("ucx: a message of " + std::to_string(length) +
                      " bytes from " + peer_ + " (the stream is corrupt)");
    }
    std::string message(length, '\0');
    KVC_RETURN_IF_ERROR(receiveExactly(message.data(), length, deadline));
    return message;
  }

  std::string describe() const override { return "ucx " + peer_; }

private:
  /// How long a send may wait for a peer that does not read.
  static constexpr Milliseconds kSendTimeout{30000};

  Status receiveExactly(void *buffer, size_t bytes,
                        SteadyClock::time_point deadline) {
    // No early out on a broken link: what the peer sent before it closed
    // is still delivered.
    if (bytes == 0)
      return Status::ok();
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
    param.flags = UCP_STREAM_RECV_FLAG_WAITALL;
    param.cb.recv_stream = noRecv;
    size_t received = 0;
    void *request;
    {
      std::lock_guard<std::mutex> lock(worker_->mutex);
      request =
          ucp_stream_recv_nbx(endpoint_, buffer, bytes, &received, &param);
    }
    return check("receiving from", wait(request, deadline));
  }

  /// Progresses until `request` completes, the endpoint fails, or
  /// `deadline` passes (UCS_ERR_TIMED_OUT); a request given up on is
  /// cancelled when asked to, and released by UCX whenever it completes.
  ucs_status_t wait(void *request, SteadyClock::time_point deadline,
                    bool cancelOnDeadline = true) {
    if (request == nullptr)
      return UCS_OK;
    if (UCS_PTR_IS_ERR(request))
      return UCS_PTR_STATUS(request);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(worker_->mutex);
        // Progress first: what the peer sent before failing completes.
        ucp_worker_progress(worker_->worker);
        ucs_status_t s = ucp_request_check_status(request);
        if (s != UCS_INPROGRESS) {
          ucp_request_free(request);
          return s;
        }
        const bool failed = broken_.load();
        if (failed || SteadyClock::now() >= deadline) {
          if (cancelOnDeadline)
            ucp_request_cancel(worker_->worker, request);
          ucp_request_free(request);
          return failed ? UCS_ERR_CONNECTION_RESET : UCS_ERR_TIMED_OUT;
        }
      }
      worker_->progressOrSleep(deadline);
    }
  }

  Status check(const char *what, ucs_status_t status) {
    if (status == UCS_OK)
      return Status::ok();
    broken_ = true;
    if (status == UCS_ERR_TIMED_OUT)
      return unavailable(std::string("ucx: timed out ") + what + " " + peer_);
    return brokenError(what, status);
  }

  Status brokenError(const char *what, ucs_status_t status = UCS_OK) {
    ucs_status_t why =
        failure_ != UCS_OK ? ucs_status_t(failure_.load()) : status;
    return unavailable(
        std::string("ucx: ") + what + " " + peer_ + ": the link is down (" +
        (why != UCS_OK ? ucs_status_string(why) : "after an earlier error") +
        ")");
  }

  std::shared_ptr<Worker> worker_;
  std::string peer_;
  ucp_ep_h endpoint_ = nullptr;
  std::mutex sendMutex_, receiveMutex_;
  std::atomic<bool> broken_{false};
  std::atomic<int> failure_{UCS_OK};
};

class UcxListener : public Listener {
public:
  ~UcxListener() override {
    if (listener_) {
      std::lock_guard<std::mutex> lock(worker_->mutex);
      for (ucp_conn_request_h request : pending_)
        ucp_listener_reject(listener_, request);
      ucp_listener_destroy(listener_);
    }
  }

  Status open(std::shared_ptr<Worker> worker, const sockaddr_storage &address,
              socklen_t length) {
    worker_ = std::move(worker);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                        UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr *>(&address);
    params.sockaddr.addrlen = length;
    params.conn_handler.cb = [](ucp_conn_request_h request, void *self) {
      static_cast<UcxListener *>(self)->pending_.push_back(request);
    };
    params.conn_handler.arg = this;
    std::lock_guard<std::mutex> lock(worker_->mutex);
    ucs_status_t s = ucp_listener_create(worker_->worker, &params, &listener_);
    if (s != UCS_OK) {
      listener_ = nullptr;
      // UCX reports an address already in use as "Device is busy".
      if (s == UCS_ERR_BUSY)
        return unavailable(
            "ucx: listening: the address is already in use (another "
            "listener holds the port)");
      return ucxError("ucx: listening", s);
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if ((s = ucp_listener_query(listener_, &attr)) != UCS_OK)
      return ucxError("ucx: the listener's address", s);
    char service[NI_MAXSERV] = {};
    getnameinfo(reinterpret_cast<const sockaddr *>(&attr.sockaddr),
                sizeof attr.sockaddr, nullptr, 0, service, sizeof service,
                NI_NUMERICSERV);
    port_ = std::atoi(service);
    return Status::ok();
  }

  int port() const override { return port_; }

  StatusOr<std::unique_ptr<Link>> accept(Milliseconds timeout) override {
    const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
    ucp_conn_request_h request = nullptr;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(worker_->mutex);
        if (!pending_.empty()) {
          request = pending_.front();
          pending_.pop_front();
        }
      }
      if (request)
        break;
      if (SteadyClock::now() >= deadline)
        return unavailable("ucx: no sender connected to port " +
                           std::to_string(port_) + " in " +
                           std::to_string(timeout.count()) + " ms");
      worker_->progressOrSleep(deadline);
    }
    std::string peer = "peer";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      char host[NI_MAXHOST] = {}, service[NI_MAXSERV] = {};
      if (getnameinfo(reinterpret_cast<const sockaddr *>(&attr.client_address),
                      sizeof attr.client_address, host, sizeof host, service,
                      sizeof service, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        peer = std::string(host) + ":" + service;
    }
    auto link = std::make_unique<UcxLink>(worker_, peer);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    KVC_RETURN_IF_ERROR(link->open(params));
    return std::unique_ptr<Link>(std::move(link));
  }

private:
  std::shared_ptr<Worker> worker_;
  ucp_listener_h listener_ = nullptr;
  std::deque<ucp_conn_request_h> pending_;
  int port_ = 0;
};

} // namespace

StatusOr<std::unique_ptr<Listener>> listenUcx(const std::string &host,
                                              int port) {
  socklen_t length = 0;
  KVC_ASSIGN_OR_RETURN(address, resolve(host, port, length));
  KVC_ASSIGN_OR_RETURN(worker, createWorker());
  auto listener = std::make_unique<UcxListener>();
  KVC_RETURN_IF_ERROR(
      listener->open(std::move(worker), address, length)
          .withContext("on " + host + ":" + std::to_string(port)));
  return std::unique_ptr<Listener>(std::move(listener));
}

StatusOr<std::unique_ptr<Link>> connectUcx(const std::string &host, int port,
                                           Milliseconds timeout) {
  socklen_t length = 0;
  KVC_ASSIGN_OR_RETURN(address, resolve(host, port, length));
  KVC_ASSIGN_OR_RETURN(worker, createWorker());
  auto link = std::make_unique<UcxLink>(std::move(worker),
                                        host + ":" + std::to_string(port));
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr *>(&address);
  params.sockaddr.addrlen = length;
  KVC_RETURN_IF_ERROR(link->open(params));
  KVC_RETURN_IF_ERROR(link->flush(timeout));
  return std::unique_ptr<Link>(std::move(link));
}

} // namespace kvc
