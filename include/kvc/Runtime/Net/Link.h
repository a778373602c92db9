//===- Link.h - Message links between nodes ---------------------*- C++ -*-===//
//
// The network seam of a transfer: a Link carries whole messages, in order,
// between two nodes (a prefill and a decode node). UCX implements it
// (UcxLink.cpp: TCP or shared memory here, RDMA or CUDA-IPC where the
// hardware has them, as UCX picks); ThrottledLink emulates a slower link
// over any other.
//
// Every call has a deadline, so no side ever hangs on a peer that died or
// stopped talking: a lost peer or a passed deadline is Unavailable, and the
// link is unusable after it. send() may be called from several threads
// (it serializes them); receive() from one.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_NET_LINK_H
#define KVC_RUNTIME_NET_LINK_H

#include "kvc/Runtime/Base/Status.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace kvc {

using Milliseconds = std::chrono::milliseconds;

class Link {
public:
  virtual ~Link() = default;

  /// Sends one message; returns once its bytes are handed to the transport
  /// (the caller may reuse them).
  virtual Status send(std::string_view message) = 0;

  /// The next message, waiting at most `timeout` for it.
  virtual StatusOr<std::string> receive(Milliseconds timeout) = 0;

  /// "ucx 127.0.0.1:41234", for messages.
  virtual std::string describe() const = 0;
};

/// Accepts links from senders.
class Listener {
public:
  virtual ~Listener() = default;
  /// The port it listens on (the one the OS chose for port 0).
  virtual int port() const = 0;
  /// The next peer's link, waiting at most `timeout` for one.
  virtual StatusOr<std::unique_ptr<Link>> accept(Milliseconds timeout) = 0;
};

/// Listens for UCX links on `host`:`port` (port 0: any free port).
StatusOr<std::unique_ptr<Listener>> listenUcx(const std::string &host,
                                              int port);
/// A UCX link to a listener at `host`:`port`.
StatusOr<std::unique_ptr<Link>> connectUcx(const std::string &host, int port,
                                           Milliseconds timeout);

/// "HOST:PORT" split (the port a number in 0..65535).
Status parseHostPort(const std::string &address, std::string &host, int &port);

/// A link that sends no faster than a set bandwidth, over another: what a
/// slower network would do to the same transfer. The bandwidth may change
/// while the link is in use (an emulated link's throttle changing
/// mid-transfer); 0 means unthrottled.
class ThrottledLink : public Link {
public:
  ThrottledLink(std::unique_ptr<Link> inner, double gbs);

  void setGBs(double gbs);
  double gbs() const;

  Status send(std::string_view message) override;
  StatusOr<std::string> receive(Milliseconds timeout) override;
  std::string describe() const override;

private:
  std::unique_ptr<Link> inner_;
  mutable std::mutex mutex_;
  double gbs_;
  /// When the emulated wire is free again.
  std::chrono::steady_clock::time_point freeAt_{};
};

} // namespace kvc

#endif // KVC_RUNTIME_NET_LINK_H
