//===- DecodeQuality.h - A lossy codec and the next token -------*- C++ -*-===//
//
// A codec's relative error says little about what a user sees; what the
// model says next does. DecodeQualityProbe holds a request's exact caches
// at a few cut points and, for each, `steps` greedy decode steps from the
// exact cache (their logits and tokens). measure(codec) rounds each cut's
// cache through the codec as a store holds it (one object per layer),
// decodes the same steps from it, each step fed the exact run's token
// (teacher-forced, so one early difference does not decide the rest), and
// reports the mean KL divergence of the next-token distribution from the
// exact one and the fraction of steps whose greedy token agrees.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_TOOLS_DECODEQUALITY_H
#define KVC_HOST_TOOLS_DECODEQUALITY_H

#include "kvc/Host/Tools/CodecTiming.h"
#include "kvc/Runtime/Desc/CodecSpec.h"
#include "kvc/Runtime/Model/ModelCompute.h"

#include <vector>

namespace kvc::host {

struct DecodeQuality {
  double kl = 0;        ///< Mean KL(exact || lossy), nats.
  double agreement = 1; ///< Fraction of steps whose greedy token agrees.
  int64_t steps = 0;    ///< Decode steps measured (cuts x steps).
};

class DecodeQualityProbe {
public:
  /// Cuts at `cuts` evenly spaced prefixes of `tokens` from half of them to
  /// all of them, `steps` decode steps after each. Fails where the model
  /// computes no logits or the cut and its steps exceed its positions.
  static StatusOr<DecodeQualityProbe> create(const ModelCompute &model,
                                             const std::vector<int32_t> &tokens,
                                             int64_t cuts, int64_t steps);

  /// The measure of `codec`; an error where it cannot encode a cut's
  /// objects (checkCodec).
  StatusOr<DecodeQuality> measure(const CodecSpec &codec) const;

private:
  struct Cut {
    int64_t context = 0;       ///< Tokens in the cache before the steps.
    ModelCompute::Cache cache; ///< Their exact K and V.
    KVObjects objects;         ///< The same, as a store holds them.
    /// The first step's token; step s + 1 is fed the exact step s's greedy
    /// token.
    int32_t first = 0;
    std::vector<int32_t> greedy; ///< The exact step's greedy token.
    std::vector<std::vector<double>> logProbs; ///< The exact step's.
  };
  explicit DecodeQualityProbe(const ModelCompute &model) : model_(&model) {}

  const ModelCompute *model_;
  std::vector<Cut> cuts_;
};

/// log softmax of `logits`, in double.
std::vector<double> logSoftmax(const std::vector<float> &logits);

} // namespace kvc::host

#endif // KVC_HOST_TOOLS_DECODEQUALITY_H
