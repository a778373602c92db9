//===- LayerProgress.cpp - Layer-wise completion of a restore -------------===//

#include "kvc/Runtime/Exec/LayerProgress.h"

#include <algorithm>
#include <string>

namespace kvc {

LayerProgress::~LayerProgress() {
  for (auto &[layer, then] : whenReady_)
    then();
}

void LayerProgress::reset(int64_t layers, int64_t tokens) {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    written_.assign(std::max<int64_t>(layers, 0), 0);
    // A restore of no tokens has every layer complete.
    completed_.assign(written_.size(),
                      tokens <= 0 ? std::optional(Clock::now()) : std::nullopt);
    settling_.assign(written_.size(), false);
    tokens_ = tokens;
    started_ = true;
    finished_.reset();
    due = dueLocked();
  }
  changed(std::move(due));
}

void LayerProgress::add(int64_t layerBegin, int64_t layerEnd, int64_t tokens) {
  (void)add(layerBegin, layerEnd, tokens, {});
}

Status LayerProgress::add(int64_t layerBegin, int64_t layerEnd, int64_t tokens,
                          const std::function<Status()> &settle) {
  std::vector<int64_t> completing;
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t l = std::max<int64_t>(layerBegin, 0);
         l < std::min<int64_t>(layerEnd, written_.size()); ++l) {
      written_[l] += tokens;
      if (!completed_[l] && !settling_[l] && written_[l] >= tokens_) {
        settling_[l] = true;
        completing.push_back(l);
      }
    }
    if (completing.empty() || !settle) {
      const Clock::time_point now = Clock::now();
      for (int64_t l : completing) {
        settling_[l] = false;
        completed_[l] = now;
      }
      due = dueLocked();
      completing.clear();
    }
  }
  changed(std::move(due));
  if (completing.empty())
    return Status::ok();
  // Every write counted before this one was enqueued before it: the settle
  // waits for them too.
  Status settled = settle();
  {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t l : completing) {
      if (l >= int64_t(completed_.size()))
        break; // Reset meanwhile: a new restore's layers.
      settling_[l] = false;
      if (settled.isOk())
        completed_[l] = now;
    }
    due = dueLocked();
  }
  changed(std::move(due));
  return settled;
}

void LayerProgress::finish(const Status &status) {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started_ = true;
    finished_ = status;
    due = dueLocked();
  }
  changed(std::move(due));
}

void LayerProgress::whenReady(int64_t layer, std::function<void()> then) {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    whenReady_.emplace_back(layer, std::move(then));
    due = dueLocked();
  }
  for (std::function<void()> &run : due)
    run();
}

std::vector<std::function<void()>> LayerProgress::dueLocked() {
  std::vector<std::function<void()>> due;
  auto isDue = [&](int64_t layer) {
    return finished_ ||
           (started_ && (layer < 0 || layer >= int64_t(written_.size()) ||
                         readyLocked(layer)));
  };
  for (auto it = whenReady_.begin(); it != whenReady_.end();) {
    if (isDue(it->first)) {
      due.push_back(std::move(it->second));
      it = whenReady_.erase(it);
    } else {
      ++it;
    }
  }
  return due;
}

void LayerProgress::changed(std::vector<std::function<void()>> due) {
  changed_.notify_all();
  for (std::function<void()> &run : due)
    run();
}

bool LayerProgress::readyLocked(int64_t layer, int64_t tokens) const {
  if (finished_ && finished_->isOk())
    return true;
  return tokens < 0 ? completed_[layer].has_value() : written_[layer] >= tokens;
}

Status
LayerProgress::wait(int64_t layer,
                    std::optional<std::chrono::milliseconds> timeout) const {
  return waitTokens(layer, -1, timeout);
}

Status LayerProgress::waitTokens(
    int64_t layer, int64_t tokens,
    std::optional<std::chrono::milliseconds> timeout) const {
  const auto deadline = std::chrono::steady_clock::now() +
                        timeout.value_or(std::chrono::milliseconds(0));
  std::unique_lock<std::mutex> lock(mutex_);
  auto waitFor = [&](auto done) {
    if (!timeout) {
      changed_.wait(lock, done);
      return true;
    }
    return changed_.wait_until(lock, deadline, done);
  };
  auto late = [&] {
    return unavailable("layer " + std::to_string(layer) +
                       " not written after " +
                       std::to_string(timeout->count()) + " ms");
  };
  if (!waitFor([&] { return started_; }))
    return late();
  if (layer < 0 || layer >= int64_t(written_.size()))
    return invalidArgument("no layer " + std::to_string(layer) +
                           " in a restore of " +
                           std::to_string(written_.size()) + " layers");
  if (!waitFor([&] { return readyLocked(layer, tokens) || finished_; }))
    return late();
  if (readyLocked(layer, tokens))
    return Status::ok();
  return *finished_;
}

bool LayerProgress::ready(int64_t layer, int64_t tokens) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layer >= 0 && layer < int64_t(written_.size()) &&
         readyLocked(layer, tokens);
}

std::optional<Clock::time_point>
LayerProgress::completedAt(int64_t layer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (layer < 0 || layer >= int64_t(completed_.size()))
    return std::nullopt;
  return completed_[layer];
}

std::vector<double> LayerProgress::readySeconds(Clock::time_point begin,
                                                double end) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<double> out;
  for (const std::optional<Clock::time_point> &at : completed_)
    out.push_back(at ? std::chrono::duration<double>(*at - begin).count()
                     : end);
  return out;
}

} // namespace kvc
