//===- DecodeQuality.cpp - A lossy codec and the next token ---------------===//

#include "kvc/Host/Tools/DecodeQuality.h"
#include "kvc/Host/Tools/Generate.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include <cmath>

using namespace kvc;
using namespace kvc::host;

std::vector<double> kvc::host::logSoftmax(const std::vector<float> &logits) {
  double top = -INFINITY;
  for (float x : logits)
    top = std::max(top, double(x));
  double sum = 0;
  for (float x : logits)
    sum += std::exp(double(x) - top);
  const double norm = top + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    out[i] = double(logits[i]) - norm;
  return out;
}

StatusOr<DecodeQualityProbe>
DecodeQualityProbe::create(const ModelCompute &model,
                           const std::vector<int32_t> &tokens, int64_t cuts,
                           int64_t steps) {
  const int64_t n = int64_t(tokens.size());
  if (cuts < 1 || steps < 1 || n < 2)
    return invalidArgument("decode quality: expected at least 2 tokens, one "
                           "cut and one step");
  if (n - 1 + steps > model.config().maxPositions)
    return invalidArgument("decode quality: " + std::to_string(n) +
                           " tokens and " + std::to_string(steps) +
                           " steps exceed the model's positions");
  DecodeQualityProbe probe(model);
  const int64_t vocab = model.config().vocabSize;
  for (int64_t i = 0; i < cuts; ++i) {
    Cut cut;
    // The cut's prompt is tokens [0, end); its cache holds all but the
    // last, which the first step feeds.
    const int64_t end =
        std::max<int64_t>(2, n / 2 + (i + 1) * (n - n / 2) / cuts);
    cut.context = end - 1;
    cut.cache = model.newCache();
    KVC_RETURN_IF_ERROR(model.prefill(cut.cache, tokens.data(), cut.context));
    cut.objects = kvObjects(model, cut.cache, cut.context);
    ModelCompute::Cache exact = cut.cache;
    std::vector<float> logits(vocab);
    cut.first = tokens[end - 1];
    int32_t token = cut.first;
    for (int64_t s = 0; s < steps; ++s) {
      KVC_RETURN_IF_ERROR(
          model.nextLogits(exact, cut.context + s, &token, 1, logits.data()));
      cut.logProbs.push_back(logSoftmax(logits));
      token = greedyToken(logits);
      cut.greedy.push_back(token);
    }
    probe.cuts_.push_back(std::move(cut));
  }
  return probe;
}

StatusOr<DecodeQuality>
DecodeQualityProbe::measure(const CodecSpec &codec) const {
  const ModelCompute &model = *model_;
  const int64_t width = model.kvDim();
  double klSum = 0;
  int64_t agreed = 0, measured = 0;
  std::vector<float> logits(model.config().vocabSize);
  for (const Cut &cut : cuts_) {
    // The cut's cache after a round trip through the codec, one object per
    // layer as a store holds it.
    ModelCompute::Cache lossy = cut.cache;
    const KVObjects &objects = cut.objects;
    std::vector<float> decoded;
    for (size_t l = 0; l < objects.objects.size(); ++l) {
      const KVObjects::Object &object = objects.objects[l];
      KVC_RETURN_IF_ERROR(checkCodec(codec, object.shape));
      KVC_ASSIGN_OR_RETURN(bytes,
                           encodeChunk(object.values.data(), object.shape,
                                       codec, objects.dtype));
      decoded.resize(object.values.size());
      KVC_RETURN_IF_ERROR(decodeChunk(bytes, object.shape, codec, objects.dtype,
                                      decoded.data()));
      const int64_t matrix = cut.context * width;
      std::copy(decoded.begin(), decoded.begin() + matrix, lossy.k[l].begin());
      std::copy(decoded.begin() + matrix, decoded.begin() + 2 * matrix,
                lossy.v[l].begin());
    }
    for (size_t s = 0; s < cut.greedy.size(); ++s) {
      int32_t token = s ? cut.greedy[s - 1] : cut.first;
      KVC_RETURN_IF_ERROR(model.nextLogits(lossy, cut.context + int64_t(s),
                                           &token, 1, logits.data()));
      const std::vector<double> q = logSoftmax(logits);
      const std::vector<double> &p = cut.logProbs[s];
      double kl = 0;
      for (size_t i = 0; i < p.size(); ++i)
        kl += std::exp(p[i]) * (p[i] - q[i]);
      klSum += std::max(kl, 0.0);
      agreed += greedyToken(logits) == cut.greedy[s];
      ++measured;
    }
  }
  DecodeQuality out;
  out.steps = measured;
  out.kl = measured ? klSum / double(measured) : 0;
  out.agreement = measured ? double(agreed) / double(measured) : 1;
  return out;
}
