//===- CodecProfile.h - What each codec costs and loses ---------*- C++ -*-===//
//
// KVServe selects codecs from a profile: for each composition, the stored
// size relative to raw (`ratio`) and the error it adds (`quality`: relative
// L2 error of K and V). Optionally a measured per-core rate of the lossless
// stage on that composition's data (without one the cost model uses the
// target's per-stage rates), and what the error does to the model's next
// token (`kl`, `agreement`), measured by decoding after a round trip. The
// default table below is an estimate (see docs/planning.md); `kvc-run
// profile-codecs` measures one on real KV and writes it in the JSON schema
// "kvc-codec-profile/1", which `load` reads.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_CODECPROFILE_H
#define KVC_PLANNING_CODECPROFILE_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Runtime/Desc/TargetDesc.h"

#include <optional>
#include <string>
#include <vector>

namespace kvc::planning {

inline constexpr const char *kCodecProfileSchema = "kvc-codec-profile/1";

struct CodecProfileEntry {
  CodecSpec codec;
  double ratio = 1;     ///< Stored bytes / raw bytes.
  double quality = 0;   ///< Relative L2 error added to K and V.
  double encodeGBs = 0; ///< Lossless stage, per core, GB/s of its input; 0 = from target.
  double decodeGBs = 0; ///< Lossless stage, per core, GB/s of its output; 0 = from target.
  /// Mean KL divergence (nats) of the next-token distribution from the
  /// exact cache's, and the fraction of positions whose greedy token
  /// agrees (host/DecodeQuality.h); unset where not measured.
  std::optional<double> kl, agreement;
  /// The whole codec's rates per core, GB/s of raw KV (to bf16 on decode),
  /// as profile-codecs measures and prints them; unset where not measured.
  /// The planner prices stages from the rates above and the target's.
  std::optional<double> codecEncodeGBs, codecDecodeGBs;
};

class CodecProfile {
public:
  CodecProfile() = default;
  explicit CodecProfile(std::vector<CodecProfileEntry> entries)
      : entries_(std::move(entries)) {}

  /// The built-in estimate over transform x quant x group x lossless.
  static CodecProfile defaults();
  /// Reads a measured profile ("kvc-codec-profile/1").
  static StatusOr<CodecProfile> load(const std::string &path);
  static StatusOr<CodecProfile> parse(std::string_view json);
  std::string print() const;

  const std::vector<CodecProfileEntry> &entries() const { return entries_; }
  /// The entry of `codec`, or null when the profile does not list it.
  const CodecProfileEntry *find(const CodecSpec &codec) const;
  /// Stored/raw ratio; raw data is 1, unlisted codecs are estimated.
  double ratio(const CodecSpec &codec) const;
  /// Relative error; raw data is 0, unlisted codecs are estimated.
  double quality(const CodecSpec &codec) const;
  /// The relative L2 error of each layer's K and V that a restore loading
  /// chunks stored with `codecs` may show against an exact prefill: the
  /// largest error one of them states plus the bf16 rounding of the paged
  /// cache. Errors of disjoint parts of a matrix never add up to more than
  /// the largest of their relative errors.
  double restoreErrorBound(const std::vector<CodecSpec> &codecs) const;
  /// The next-token KL divergence `codec` adds: 0 unquantized, infinite
  /// where the profile has no measure (a KL budget then excludes it).
  double kl(const CodecSpec &codec) const;
  /// Whether a source stored with `codec` stays within both budgets
  /// (Request::maxError, Request::maxKl).
  bool allows(const CodecSpec &codec, double maxError, double maxKl) const;

private:
  std::vector<CodecProfileEntry> entries_;
};

/// The estimate the default table is made of (also used for codecs a
/// measured profile does not list).
CodecProfileEntry estimateCodec(const CodecSpec &codec);

} // namespace kvc::planning

#endif // KVC_PLANNING_CODECPROFILE_H
