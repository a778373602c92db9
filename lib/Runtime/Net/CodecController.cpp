//===- CodecController.cpp - KVServe's codec choice per link --------------===//

#include "kvc/Runtime/Net/CodecController.h"

#include "kvc/Runtime/Base/Clock.h"

#include <algorithm>
#include <limits>

namespace kvc {

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
  return rawBytes / e.ratio * linkSecondsPerByte_ + codec;
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
      Clock::time_point start = Clock::now();
      StatusOr<std::string> encoded = objects.encode(probe, values);
      const double encodeSeconds = secondsSince(start);
      start = Clock::now();
      Status decodedOk = encoded.isOk()
                             ? objects.decode(probe, *encoded, decoded.data())
                             : encoded.status();
      const double decodeSeconds = secondsSince(start);
      if (!decodedOk.isOk()) {
        // A codec that cannot round-trip this chunk is never chosen.
        e.ratio = std::numeric_limits<double>::min();
        e.encodeSecondsPerByte = std::numeric_limits<double>::infinity();
        continue;
      }
      e.ratio = rawBytes / double(encoded->size());
      e.encodeSecondsPerByte = encodeSeconds / rawBytes;
      e.decodeSecondsPerByte = decodeSeconds / rawBytes;
    }
  }
  if (linkSecondsPerByte_ <= 0)
    // No send measured the link yet: the most compact.
    return std::max_element(estimates_.begin(), estimates_.end(),
                            [](const Estimate &a, const Estimate &b) {
                              return a.ratio < b.ratio;
                            })
        ->codec;
  const double rawBytes =
      double(objects.shape(ref).numel() * dtypeBytes(objects.model().dtype));
  auto seconds = [&](const Estimate &e) {
    return chunkSecondsLocked(e, rawBytes);
  };
  const Estimate &fastest =
      *std::min_element(estimates_.begin(), estimates_.end(),
                        [&](const Estimate &a, const Estimate &b) {
                          return seconds(a) < seconds(b);
                        });
  if (options_.sloSeconds) {
    // The most accurate candidate whose remaining chunks still make it.
    const double left =
        double(std::max<int64_t>(options_.chunks - chunksSent_, 1));
    for (const Estimate &e : estimates_)
      if (secondsSent_ + left * seconds(e) <= *options_.sloSeconds)
        return e.codec;
  }
  return fastest.codec;
}

void CodecController::sent(const CodecSpec &codec, size_t rawBytes,
                           size_t bytes, double encodeSeconds,
                           double wireSeconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double a = options_.smoothing;
  auto blend = [a](double old, double measured) {
    return old > 0 ? (1 - a) * old + a * measured : measured;
  };
  // Time per byte, not bytes per second, is averaged: a link that drops
  // from 10 GB/s to 2 MB/s shows at once, not after halving 12 times.
  if (bytes > 0)
    linkSecondsPerByte_ = blend(linkSecondsPerByte_,
                                std::max(wireSeconds, 1e-12) / double(bytes));
  chunksSent_ += 1;
  secondsSent_ += wireSeconds + encodeSeconds;
  for (Estimate &e : estimates_)
    if (e.codec == codec && rawBytes > 0 && bytes > 0) {
      e.ratio = blend(e.ratio, double(rawBytes) / double(bytes));
      e.encodeSecondsPerByte =
          blend(e.encodeSecondsPerByte, encodeSeconds / double(rawBytes));
    }
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

double CodecController::linkGBs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return linkSecondsPerByte_ > 0 ? 1e-9 / linkSecondsPerByte_ : 0;
}

} // namespace kvc
