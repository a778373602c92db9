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
// What it predicts with is measured, then corrected online: r and T_codec
// of every candidate are probed on the first chunk's own values (each
// encoded and decoded once); 1/B is measured from every send and averaged
// exponentially, so a link that slows down mid-transfer moves the choice
// within a chunk or two; r and the encoding's time likewise from every chunk
// sent. Until the first send has measured B, the most compact candidate is
// chosen (the cheap mistake on a fast link). One controller serves one
// link: kept across transfers, it probes once and starts each transfer
// from what the last one measured. Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_NET_CODECCONTROLLER_H
#define KVC_RUNTIME_NET_CODECCONTROLLER_H

#include "kvc/Runtime/Net/Transfer.h"

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
  /// Weight of the newest measure in the running averages.
  double smoothing = 0.5;
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
            double encodeSeconds, double wireSeconds) override;

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

private:
  double chunkSecondsLocked(const Estimate &e, double rawBytes) const;

  CodecControllerOptions options_;
  mutable std::mutex mutex_;
  bool probed_ = false;
  std::vector<Estimate> estimates_;
  double linkSecondsPerByte_ = 0; ///< The link's, averaged; 0: unmeasured.
  int64_t chunksSent_ = 0;
  double secondsSent_ = 0;
};

} // namespace kvc

#endif // KVC_RUNTIME_NET_CODECCONTROLLER_H
