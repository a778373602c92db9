//===- ProfileCodecs.h - kvc-run profile-codecs -----------------*- C++ -*-===//

#ifndef KVC_TOOLS_KVC_RUN_PROFILECODECS_H
#define KVC_TOOLS_KVC_RUN_PROFILECODECS_H

#include "kvc/Runtime/Model/LlamaModel.h"

namespace kvc {

/// Measures every composition of the planner's codec space on the KV that
/// `model` produces for `tokens`: stored/raw ratio, per-core rates of the
/// lossless stage, relative L2 error of K and V and of attention outputs
/// for sample queries (drawn with `seed`), and, when `decodeSteps` > 0,
/// the next-token KL divergence and greedy agreement over that many decode
/// steps after 4 cuts of the request (host/DecodeQuality.h). Prints a
/// table and writes the profile (kvc-codec-profile/1) to `out`.
Status runCodecProfile(const LlamaModel &model,
                       const std::vector<int32_t> &tokens, uint64_t seed,
                       int64_t decodeSteps, const std::string &out);

} // namespace kvc

#endif // KVC_TOOLS_KVC_RUN_PROFILECODECS_H
