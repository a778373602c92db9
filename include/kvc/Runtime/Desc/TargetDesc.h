//===- TargetDesc.h - Hardware descriptions ---------------------*- C++ -*-===//
//
// A `TargetDesc` is what the planner knows about a machine: the compute
// device, the host, the host<->device link, the storage tiers and per-core
// codec throughputs. It is read from the JSON files in targets/ (schema in
// docs/targets.md) and, later, written by `kvc-run calibrate`. Units are SI:
// GB/s means 1e9 bytes per second, latencies are microseconds.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DESC_TARGETDESC_H
#define KVC_RUNTIME_DESC_TARGETDESC_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Support/Vocabulary.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

/// The schema identifier every target file carries.
inline constexpr const char *kTargetSchema = "kvc-target/1";

/// The device that computes (recompute, projection, decode kernels).
struct ComputeDesc {
  enum class Kind { GPU, CPU };
  Kind kind = Kind::GPU;
  std::string name;
  double denseTflops = 0;   ///< Dense bf16 (GPU) or fp32 (CPU) TFLOP/s.
  double memGBs = 0;        ///< Device memory bandwidth, GB/s.
  double memGiB = 0;        ///< Device memory capacity, GiB.
  double restoreShare = 1;  ///< Share of compute restoration may use, (0, 1].
  /// GEMM efficiency: a GEMM of m rows reaches
  /// gemmPeakFraction * m / (m + gemmHalfTokens) of the dense rate.
  double gemmPeakFraction = 0.75;
  double gemmHalfTokens = 128;
  /// Rate of attention FLOPs; 0 prices them like GEMMs.
  double attentionTflops = 0;
  /// The GPU architecture the plans' kernels are generated for ("sm_90");
  /// empty where none is (a CPU, or a GPU kvc generates no kernels for).
  std::string chip;
};


/// The host that runs IO and codec threads.
struct HostDesc {
  int64_t cores = 0;
  double dramGiB = 0;
  double nicGBs = 0; ///< Network bandwidth to other nodes (transfer plans).
  /// What a task waits to start after a task on another resource (or the
  /// restore's start) releases it: the wake-up of that resource's idle
  /// worker thread. kvc-run calibrate measures it; 0 when not given.
  double handoffUs = 0;
  /// Bytes a second of stored objects a restore's upload checks and copies
  /// out on the host before the copy to the device, where no decode step
  /// did (a chunk stored with no lossless stage: its checksums and
  /// non-finite values checked, its payload copied into staging, on the
  /// host workers). kvc-run calibrate measures it; 0 when not given, and
  /// then not priced.
  double checkGBs = 0;
  /// Bytes a second one fetch lane checks of a raw object it has just read
  /// into a CPU's cache rows (its checksum and non-finite values, while the
  /// object is in the core's cache: ChunkSteps::fetchIntoCache), on top of
  /// the read. kvc-run calibrate measures it; 0 when not given, and then
  /// not priced.
  double readCheckGBs = 0;
};

/// The host<->device link (PCIe; a memcpy for a CPU target).
struct LinkDesc {
  double h2dGBs = 0;
  double d2hGBs = 0;
  double latencyUs = 0;
};

/// A storage tier chunks can be read from and written to.
struct TierDesc {
  enum class Kind { DRAM, Disk, Remote };
  std::string name;
  Kind kind = Kind::DRAM;
  double readGBs = 0;
  double writeGBs = 0;
  double latencyUs = 0; ///< Per request.
  int64_t lanes = 1;    ///< Independent devices or connections.
  /// A store's own throttle (`?gbps=`): reads over all lanes at most this
  /// fast, though a lane alone still reads no faster than its share of
  /// readGBs; 0: none. Where a request is planned for a throttled store,
  /// its tier's (Host's storeTier).
  double throttleGBs = 0;
};

/// Per-core throughput of one codec stage, in GB/s of uncompressed data
/// (for a lossless coder, the bytes it codes; for quant and hadamard, the
/// raw elements). A lossless coder's speed depends on what it codes, and
/// dequantization's on the width, so a rate may say which data it holds
/// for: `on` is the quantization of the coder's input (None: raw elements)
/// or the quant stage's width; a rate without it holds for any data.
struct CodecRateDesc {
  CodecStage stage = CodecStage::Deflate;
  std::optional<CodecSpec::Quant> on;
  double encodeGBs = 0;
  double decodeGBs = 0;
};

struct TargetDesc {
  std::string name;
  std::string description;
  /// Whether `kvc-run calibrate` measured it on the machine it describes
  /// (else its figures are estimates).
  bool calibrated = false;
  ComputeDesc compute;
  HostDesc host;
  LinkDesc link;
  std::vector<TierDesc> tiers;
  std::vector<CodecRateDesc> codecs;

  /// Checks positivity, ranges and unique tier names.
  Status validate() const;
  /// Returns the tier named `name`, or null.
  const TierDesc *findTier(std::string_view name) const;
};

const char *computeKindName(ComputeDesc::Kind kind);
const char *tierKindName(TierDesc::Kind kind);
/// The name of the data a rate holds for: "raw", or the quantization's
/// ("int8", "fp8", ...).
const char *codecDataName(CodecSpec::Quant quant);

/// Parses a target description (schema "kvc-target/1").
StatusOr<TargetDesc> parseTargetDesc(std::string_view json);
/// Reads and parses `path`.
StatusOr<TargetDesc> loadTargetDesc(const std::string &path);
/// Serializes `target` in the same schema, pretty-printed.
std::string printTargetDesc(const TargetDesc &target);

} // namespace kvc

#endif // KVC_RUNTIME_DESC_TARGETDESC_H
