//===- Calibrate.h - A target description measured --------------*- C++ -*-===//

#ifndef KVC_HOST_TOOLS_CALIBRATE_H
#define KVC_HOST_TOOLS_CALIBRATE_H

#include "kvc/Runtime/Desc/TargetDesc.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <cstdio>
#include <map>
#include <string>

namespace kvc {

/// Measures this machine and `device` and returns `base` with the measured
/// values in place:
///   - compute: prefills of `model` at chunk sizes of 16-512 tokens and of a
///     256-token chunk after prefixes of up to 1536, fitted jointly to the
///     cost model's price of them (planning::fitComputeRates: dense_tflops,
///     gemm_half_tokens, attention_tflops; gemm_peak_fraction and
///     restore_share kept);
///   - memory and link: the device's memory bandwidth (memoryGBs) and its
///     upload bandwidth (on the CPU device both a single-thread copy: its
///     "device" is host memory);
///   - host.handoff_us: what a task waits after a task on another resource
///     releases it, on the device's pools (measureHandoff, 200 us idle);
///   - tiers: reads of 1 MiB objects from mem:// for DRAM tiers and from
///     file:// under `scratchDir` (warm page cache) for disk tiers; a
///     remote tier named in `remotes` (tier name -> store URL) from that
///     store, by as many readers as the tier has lanes, each fetching
///     batches of 8 as a restore's IO lanes do; other remote tiers keep
///     `base`'s values.
///   - codecs: per-core rates of quantization to each width, of the
///     Hadamard transform and of the deflate, zstd and lz4 stages on this
///     model's KV at each width (raw, int8, int4, int2), in objects of one
///     layer of 256 tokens decoded to bf16 (CodecTiming.h).
/// Prints each measurement to `log`.
StatusOr<TargetDesc>
calibrate(Device &device, const ModelCompute &model, TargetDesc base,
          const std::string &scratchDir, std::FILE *log = stdout,
          const std::map<std::string, std::string> &remotes = {});

/// Calibration's reference measurement: one chunk prefilled from position
/// 0, measured (median of 3) and as the cost model for `target` prices it.
/// `compare` repeats it to show whether the machine still runs at the speed
/// it was calibrated at.
struct ReferenceChunk {
  int64_t tokens = 0;
  double measuredSeconds = 0;
  double predictedSeconds = 0;
};
StatusOr<ReferenceChunk> measureReferenceChunk(Device &device,
                                               const ModelCompute &model,
                                               const TargetDesc &target);

} // namespace kvc

#endif // KVC_HOST_TOOLS_CALIBRATE_H
