//===- CostModel.h - Seconds for each step of a plan ------------*- C++ -*-===//
//
// The cost model turns (model, target, step, block) into seconds.
//
// Compute. A chunked prefill of tokens [a, b) through one layer costs the
// linear FLOPs 2 * tokens * (QKV + O + 3 MLP matrices) plus causal attention
// 4 * heads * head_dim * sum_{p=a}^{b-1} (p + 1), so later chunks cost more
// (Cake §4). Projecting hidden states to K and V costs
// 2 * tokens * hidden * 2 * kv_heads * head_dim (HCache). FLOPs run at
//   dense_tflops * restore_share * gemm_peak_fraction * m / (m + gemm_half_tokens)
// for a GEMM of m rows: small chunks run below peak (Cake Table 4).
//
// Data. Raw bytes are tokens * layers * (K+V or hidden) * element size.
// Quantization keeps bits/16 of them plus one 16-bit scale and zero per
// group; a lossless coder multiplies by its profiled ratio. Reads cost
// latency + bytes / per-lane bandwidth of the tier, copies latency + bytes /
// link bandwidth, host decoding raw bytes / (per-core rate * cores) for the
// lossless stage, device decoding (dequant, untransform) memory traffic at
// device bandwidth (or the per-core rates on a CPU target).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_COSTMODEL_H
#define KVC_PLANNING_COSTMODEL_H

#include "kvc/Planning/CodecProfile.h"
#include "kvc/Planning/Plan.h"
#include "kvc/Runtime/Desc/ModelConfig.h"
#include "kvc/Runtime/Desc/TargetDesc.h"

namespace kvc::planning {

class CostModel {
public:
  CostModel(ModelConfig model, TargetDesc target, CodecProfile profile);

  const ModelConfig &model() const { return model_; }
  const TargetDesc &target() const { return target_; }
  const CodecProfile &profile() const { return profile_; }

  //===--- FLOPs ----------------------------------------------------------===//

  /// Linear-layer FLOPs of one token through one layer.
  double linearFlopsPerTokenLayer() const { return linearFlops_; }
  /// Causal attention FLOPs of tokens [t0, t1) in one layer.
  double attentionFlops(int64_t t0, int64_t t1) const;
  /// FLOPs to recompute tokens [t0, t1) through `layers` layers.
  double prefillFlops(int64_t t0, int64_t t1, int64_t layers) const;
  /// FLOPs to project `tokens` x `layers` hidden states to K and V.
  double projectFlops(int64_t tokens, int64_t layers) const;

  //===--- Seconds on the compute device ----------------------------------===//

  /// Fraction of peak a GEMM of `rows` rows reaches.
  double gemmEfficiency(int64_t rows) const;
  /// Seconds for `flops` in GEMMs of `rows` rows.
  double computeSeconds(double flops, int64_t rows) const;
  /// Time to prefill tokens [t0, t1) through `layers` layers: projections at
  /// the GEMM rate, attention at the target's attention rate (the GEMM rate
  /// when it gives none).
  double prefillSeconds(int64_t t0, int64_t t1, int64_t layers) const;
  /// The same with GEMMs of `rows` rows: tokens [t0, t1) prefilled in steps
  /// of `rows` tokens, the steps' times summed (attention's FLOPs add up
  /// over the steps, and every step's GEMMs run at one efficiency).
  double prefillSeconds(int64_t t0, int64_t t1, int64_t layers,
                        int64_t rows) const;
  /// Time into one layer of a prefill of tokens [t0, t1) until the layer's
  /// K and V are written: its Q, K and V projections (the rest of the
  /// layer, attention included, comes after).
  double kvWrittenSeconds(int64_t t0, int64_t t1) const;
  /// Dequantizing `codec`'s quantization into `rawBytes` on the device (on
  /// a CPU target, one core; nothing when a lossless stage precedes it,
  /// whose host decoding dequantizes too).
  double dequantSeconds(const CodecSpec &codec, double rawBytes) const;
  /// Undoing `codec`'s transform on `rawBytes` on the device.
  double untransformSeconds(const CodecSpec &codec, double rawBytes) const;
  /// Writing `rawBytes` of KV into the paged cache.
  double scatterSeconds(double rawBytes) const;

  //===--- Bytes ----------------------------------------------------------===//

  double rawBytes(Form form, int64_t tokens, int64_t layers) const;
  /// Bytes after quantization (what crosses the link when the device
  /// dequantizes).
  double quantizedBytes(Form form, const CodecSpec &codec, int64_t tokens,
                        int64_t layers) const;
  /// Bytes as stored (after the lossless coder).
  double storedBytes(Form form, const CodecSpec &codec, int64_t tokens,
                     int64_t layers) const;
  /// Bytes of data in the state `codec` leaves it: stored bytes while the
  /// lossless coder applies, quantized bytes after, raw bytes when raw.
  double encodedBytes(Form form, const CodecSpec &codec, int64_t tokens,
                      int64_t layers) const;

  //===--- Seconds on the host and the link --------------------------------===//

  /// What `tier`'s lanes read a second in all: its bandwidth, or its
  /// store's throttle where slower.
  static double readGBs(const TierDesc &tier);
  /// One request of `bytes` on one lane of `tier`: its share of readGBs.
  double readSeconds(const TierDesc &tier, double bytes) const;
  /// One lane's read of `bytes` of raw objects into a CPU's cache, each
  /// checked as it lands (planning::checksAsRead): its share of readGBs,
  /// or, where a lane alone is slower (a lane's share of the tier's own
  /// bandwidth, then its check), that: while one lane checks, the others
  /// read faster, up to a throttle's rate.
  double readCheckedSeconds(const TierDesc &tier, double bytes) const;
  /// Host decoding of a chunk whose quantized size is `quantizedBytes` on
  /// the decode resource. For a GPU target, the lossless stage spread over
  /// every host core (the decode pool the CUDA backend is to have); for a
  /// CPU target, what the CPU backend does: the lossless stage,
  /// dequantization and the inverse transform, on one thread.
  double hostDecodeSeconds(const CodecSpec &codec, double quantizedBytes) const;
  /// Host encoding (save and transfer paths) of `rawBytes`.
  double hostEncodeSeconds(const CodecSpec &codec, double rawBytes) const;
  double h2dSeconds(double bytes) const;
  /// The host's check of `storedBytes` of objects an upload reads as stored
  /// (no decompress before it): `host.check_gbs`, nothing where the target
  /// gives none.
  double uploadCheckSeconds(double storedBytes) const;
  /// One fetch lane's check of `storedBytes` of raw objects it has just
  /// read into the cache (checksAsRead): `host.read_check_gbs`, nothing
  /// where the target gives none.
  double readCheckSeconds(double storedBytes) const;
  double d2hSeconds(double bytes) const;
  /// One write of `bytes` on one lane of `tier`.
  double writeSeconds(const TierDesc &tier, double bytes) const;
  /// Sending `bytes` over the host NIC (transfer plans).
  double networkSeconds(double bytes) const;

private:
  /// Per-core rate of `stage` on data quantized as `on` (a lossless
  /// coder's input, the quant stage's width): the target's rate for that
  /// data, else its rate for any data, else the codec registry's default.
  double stageRate(CodecStage stage, bool decode,
                   CodecSpec::Quant on = CodecSpec::Quant::None) const;
  /// The lossless stage's per-core rate for `codec` (which has one): a
  /// profile entry's measurement, else the target's.
  double losslessRate(const CodecSpec &codec, bool decode) const;

  ModelConfig model_;
  TargetDesc target_;
  CodecProfile profile_;
  double linearFlops_ = 0;
  double peakFlops_ = 0; ///< dense * share * peak fraction, FLOP/s.
};

} // namespace kvc::planning

#endif // KVC_PLANNING_COSTMODEL_H
