//===- Link.cpp - Message links between nodes -----------------------------===//

#include "kvc/Runtime/Net/Link.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace kvc {

Status parseHostPort(const std::string &address, std::string &host, int &port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size())
    return invalidArgument("'" + address + "': expected HOST:PORT");
  const std::string digits = address.substr(colon + 1);
  if (digits.size() > 5 ||
      digits.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(digits) > 65535)
    return invalidArgument("'" + address + "': the port must be 0 to 65535");
  host = address.substr(0, colon);
  port = std::stoi(digits);
  return Status::ok();
}

ThrottledLink::ThrottledLink(std::unique_ptr<Link> inner, double gbs)
    : inner_(std::move(inner)), gbs_(gbs) {}

void ThrottledLink::setGBs(double gbs) {
  std::lock_guard<std::mutex> lock(mutex_);
  gbs_ = gbs;
}

double ThrottledLink::gbs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gbs_;
}

Status ThrottledLink::send(std::string_view message) {
  std::chrono::steady_clock::time_point until;
  {
    // The emulated wire carries one message after another.
    std::lock_guard<std::mutex> lock(mutex_);
    std::chrono::steady_clock::time_point start =
        std::max(std::chrono::steady_clock::now(), freeAt_);
    freeAt_ = start;
    if (gbs_ > 0)
      freeAt_ +=
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(double(message.size()) /
                                            (gbs_ * 1e9)));
    until = freeAt_;
  }
#ifdef __linux__
  // A sleep ends up to the thread's timer slack late (50 us by default):
  // as much as a 64 KB message takes at 1 GB/s. The emulated link keeps
  // its rate to the microsecond.
  thread_local const bool precise = prctl(PR_SET_TIMERSLACK, 1000UL) == 0;
  (void)precise;
#endif
  std::this_thread::sleep_until(until);
  return inner_->send(message);
}

StatusOr<std::string> ThrottledLink::receive(Milliseconds timeout) {
  return inner_->receive(timeout);
}

std::string ThrottledLink::describe() const {
  const double limit = gbs();
  if (limit <= 0)
    return inner_->describe();
  char rate[48];
  std::snprintf(rate, sizeof rate, " throttled to %g GB/s", limit);
  return inner_->describe() + rate;
}

} // namespace kvc
