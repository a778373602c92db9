//===- CodecController.h - KVServe's codec choice per link ------*- C++ -*-===//
//
// Chooses the encoding of each chunk a transfer sends, from what the link
// and the codecs measure, with KVServe's latency model: a job's completion
// time is
//
//     JCT = model + V / (r * B) + V / T_codec
//
// for V raw bytes sent with a codec of compression ratio r and throughput
// T_codec (its encoding and decoding, per raw byte, on as many threads as
// the pipeline runs them on) over a link of bandwidth B; `model`, the prefill,
// is the same whatever the codec. Per chunk the controller takes the candidate
// with the least V/(r*B) + V/T_codec, or, under an SLO, the first candidate
// (the caller lists them most accurate first) whose predicted completion still
// meets it.
//
// What it predicts with is measured, then corrected online. r and T_codec
// of every candidate are probed on the first chunk's own values (the
// fastest of three encodings and decodings each: every candidate timed
// alike); r then follows every chunk sent. The link is fitted to the last
// sends as a cost per message plus 1/B per byte: 1/B is the median slope
// between sends whose sizes differ (Theil-Sen, so one send a busy machine
// delayed does not swing it), the message cost the median of what is left.
// Every candidate pays the message cost alike, so only 1/B decides; time
// per byte alone would make a fast link look slow to compact chunks (a
// 20 KB send is mostly its message cost) and keep choosing them. While the
// sends fitted are all of one size, 1/B is their median time per byte less
// the message cost fitted last, so a link that slows down moves the choice
// within half the window. Sizes are kept apart where it matters: when the
// runner-up is predicted within `exploreMargin` of the best and no send
// fitted had its size, the chunk goes out with the runner-up (never where
// one candidate is far ahead, as on a slow link, nor under an SLO). The
// first chunk goes out with the most compact candidate (the cheap mistake
// on a fast link), the second with the least compact, so the link is
// fitted at two sizes from the start. One controller serves one link: kept
// across transfers, it probes once and starts each transfer from what the last
// one measured. Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_NET_CODECCONTROLLER_H
#define KVC_RUNTIME_NET_CODECCONTROLLER_H

#include "kvc/Runtime/Net/Transfer.h"

#include <deque>
#include <mutex>
#include <optional>

namespace kvc {

struct CodecControllerOptions {
  /// The codecs it may choose from, most accurate first (all within the
  /// transfer's quality budget).
  std::vector<CodecSpec> candidates;
  /// The transfer's deadline from its first chunk, when it has one.
  std::optional<double> sloSeconds;
  /// The chunks the transfer sends (for the SLO's prediction).
  int64_t chunks = 0;
  /// Weight of the newest measure in the running average of r.
  double smoothing = 0.5;
  /// The last sends the link is fitted to.
  int linkWindow = 8;
  /// How close (relative) the runner-up's prediction must be to the best's
  /// for a chunk to go out with it, to measure the link at its size.
  double exploreMargin = 0.25;
  /// Chunks encoded (and decoded) at once: the sender's writers, the
  /// receiver's decoders. T_codec is the pipeline's, this many times one
  /// thread's.
  int parallelism = 2;
};

class CodecController : public CodecChooser {
public:
  explicit CodecController(CodecControllerOptions options);

  CodecSpec choose(const ChunkObjects &objects, const ChunkRef &ref,
                   const float *values) override;
  void sent(const CodecSpec &codec, size_t rawBytes, size_t bytes,
            double encodeSeconds, double sendSeconds) override;

  /// What it believes now, per candidate (for reports and tests).
  struct Estimate {
    CodecSpec codec;
    double ratio = 1; ///< Raw bytes / sent bytes.
    double encodeSecondsPerByte = 0, decodeSecondsPerByte = 0;
    /// Predicted seconds of a chunk of `rawBytes` (0 before B is known).
    double chunkSeconds = 0;
  };
  std::vector<Estimate> estimates(size_t rawBytes) const;
  /// The link's measured bandwidth, GB/s (0 before the first send).
  double linkGBs() const;
  /// What it measures any message to cost besides its bytes, seconds.
  double messageSeconds() const;

private:
  struct Send {
    double bytes, seconds;
  };
  double chunkSecondsLocked(const Estimate &e, double rawBytes) const;
  void fitLinkLocked();
  bool sentSizeLocked(double bytes) const;

  CodecControllerOptions options_;
  mutable std::mutex mutex_;
  bool probed_ = false;
  std::vector<Estimate> estimates_;
  std::deque<Send> sends_;        ///< The last sends, oldest first.
  double linkSecondsPerByte_ = 0; ///< 1/B fitted to them; 0: unmeasured.
  double messageSeconds_ = 0;     ///< The cost per message fitted to them.
  bool fitted_ = false;           ///< Sends of two sizes measured it.
  int64_t chunksSent_ = 0;
  double secondsSent_ = 0;
};

} // namespace kvc

#endif // KVC_RUNTIME_NET_CODECCONTROLLER_H
