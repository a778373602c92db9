//===- CodecController.cpp - KVServe's codec choice per link --------------===//

#include "kvc/Runtime/Net/CodecController.h"

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <limits>

namespace kvc {

/// Runs of each candidate's encoding and decoding when probing.
constexpr int kProbeRuns = 3;
/// Sends whose sizes differ by this factor measure the link's 1/B.
constexpr double kDistinctSizes = 1.25;
/// 1/B of the fastest link it believes in (1 PB/s): a fit may measure no
/// cost per byte at all, which would make every choice a tie.
constexpr double kFastestLink = 1e-15;

CodecController::CodecController(CodecControllerOptions options)
    : options_(std::move(options)) {
  if (options_.candidates.empty())
    options_.candidates.push_back(CodecSpec());
  for (const CodecSpec &codec : options_.candidates)
    estimates_.push_back({codec});
}

double CodecController::chunkSecondsLocked(const Estimate &e,
                                           double rawBytes) const {
  const double codec = rawBytes *
                       (e.encodeSecondsPerByte + e.decodeSecondsPerByte) /
                       std::max(options_.parallelism, 1);
  return messageSeconds_ + rawBytes / e.ratio * linkSecondsPerByte_ + codec;
}

CodecSpec CodecController::choose(const ChunkObjects &objects,
                                  const ChunkRef &ref, const float *values) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!probed_) {
    // Every candidate once on this chunk's values: its ratio, and the time
    // its encoding and decoding take per raw byte.
    probed_ = true;
    std::vector<float> decoded(size_t(objects.shape(ref).numel()));
    ChunkRef probe = ref;
    probe.codec = CodecSpec();
    const StatusOr<std::string> raw = objects.encode(probe, values);
    const double rawBytes = raw.isOk() ? double(raw->size()) : 1;
    for (Estimate &e : estimates_) {
      probe.codec = e.codec;
      StatusOr<std::string> encoded = objects.encode(probe, values);
      Status decodedOk = encoded.isOk()
                             ? objects.decode(probe, *encoded, decoded.data())
                             : encoded.status();
      if (!decodedOk.isOk()) {
        // A codec that cannot round-trip this chunk is never chosen.
        e.ratio = std::numeric_limits<double>::min();
        e.encodeSecondsPerByte = std::numeric_limits<double>::infinity();
        continue;
      }
      // The fastest of a few runs: what the codec costs, not what a busy
      // machine made one run cost.
      e.ratio = rawBytes / double(encoded->size());
      e.encodeSecondsPerByte =
          bestOf(kProbeRuns, [&] { (void)objects.encode(probe, values); }) /
          rawBytes;
      e.decodeSecondsPerByte =
          bestOf(
              kProbeRuns,
              [&] { (void)objects.decode(probe, *encoded, decoded.data()); }) /
          rawBytes;
    }
  }
  // The first send goes out most compact (the cheap mistake on a fast
  // link), the next least compact: the link fitted at two sizes from the
  // start (under an SLO, whose choice is the most accurate candidate that
  // meets it, sends of one size until then are charged per byte).
  auto byRatio = [](const Estimate &a, const Estimate &b) {
    return a.ratio < b.ratio;
  };
  if (sends_.empty())
    return std::max_element(estimates_.begin(), estimates_.end(), byRatio)
        ->codec;
  if (!fitted_ && !options_.sloSeconds)
    return std::min_element(estimates_.begin(), estimates_.end(), byRatio)
        ->codec;
  const double rawBytes =
      double(objects.shape(ref).numel() * dtypeBytes(objects.model().dtype));
  // Each candidate priced once (in the caller's order, most accurate
  // first), and ranked cheapest first.
  std::vector<double> price;
  std::vector<size_t> ranked;
  for (const Estimate &e : estimates_) {
    ranked.push_back(price.size());
    price.push_back(chunkSecondsLocked(e, rawBytes));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](size_t a, size_t b) { return price[a] < price[b]; });
  if (options_.sloSeconds) {
    // The most accurate candidate whose remaining chunks still make it.
    const double left =
        double(std::max<int64_t>(options_.chunks - chunksSent_, 1));
    for (size_t i = 0; i < estimates_.size(); ++i)
      if (secondsSent_ + left * price[i] <= *options_.sloSeconds)
        return estimates_[i].codec;
    return estimates_[ranked.front()].codec;
  }
  if (ranked.size() > 1 &&
      price[ranked[1]] <= price[ranked[0]] * (1 + options_.exploreMargin) &&
      !sentSizeLocked(rawBytes / estimates_[ranked[1]].ratio))
    return estimates_[ranked[1]].codec;
  return estimates_[ranked.front()].codec;
}

bool CodecController::sentSizeLocked(double bytes) const {
  return std::any_of(sends_.begin(), sends_.end(), [&](const Send &send) {
    return std::max(send.bytes, bytes) <
           kDistinctSizes * std::min(send.bytes, bytes);
  });
}

void CodecController::fitLinkLocked() {
  std::vector<double> slopes;
  for (size_t i = 0; i < sends_.size(); ++i)
    for (size_t j = i + 1; j < sends_.size(); ++j) {
      const Send &a = sends_[i], &b = sends_[j];
      if (std::max(a.bytes, b.bytes) >=
          kDistinctSizes * std::min(a.bytes, b.bytes))
        slopes.push_back((b.seconds - a.seconds) / (b.bytes - a.bytes));
    }
  std::vector<double> perSend;
  if (!slopes.empty()) {
    linkSecondsPerByte_ = std::max(median(std::move(slopes)), kFastestLink);
    for (const Send &send : sends_)
      perSend.push_back(send.seconds - send.bytes * linkSecondsPerByte_);
    messageSeconds_ = std::max(median(std::move(perSend)), 0.0);
    fitted_ = true;
    return;
  }
  for (const Send &send : sends_)
    perSend.push_back((send.seconds - messageSeconds_) / send.bytes);
  linkSecondsPerByte_ = std::max(median(std::move(perSend)), kFastestLink);
}

void CodecController::sent(const CodecSpec &codec, size_t rawBytes,
                           size_t bytes, double encodeSeconds,
                           double sendSeconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double a = options_.smoothing;
  auto blend = [a](double old, double measured) {
    return old > 0 ? (1 - a) * old + a * measured : measured;
  };
  if (bytes > 0) {
    sends_.push_back({double(bytes), sendSeconds});
    while (int(sends_.size()) > std::max(options_.linkWindow, 1))
      sends_.pop_front();
    fitLinkLocked();
  }
  chunksSent_ += 1;
  secondsSent_ += sendSeconds + encodeSeconds;
  // The ratio follows the data. The codec's time does not: a send's
  // encoding shares the machine with the rest of the pipeline, which the
  // probe's candidates did not, and weighing one against the others needs
  // them timed alike.
  for (Estimate &e : estimates_)
    if (e.codec == codec && rawBytes > 0 && bytes > 0)
      e.ratio = blend(e.ratio, double(rawBytes) / double(bytes));
}

std::vector<CodecController::Estimate>
CodecController::estimates(size_t rawBytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Estimate> out = estimates_;
  for (Estimate &e : out)
    e.chunkSeconds =
        linkSecondsPerByte_ > 0 ? chunkSecondsLocked(e, double(rawBytes)) : 0;
  return out;
}

double CodecController::messageSeconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return messageSeconds_;
}

double CodecController::linkGBs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return linkSecondsPerByte_ > 0 ? 1e-9 / linkSecondsPerByte_ : 0;
}

} // namespace kvc
