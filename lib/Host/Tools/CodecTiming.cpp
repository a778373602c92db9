//===- CodecTiming.cpp - Per-core rates of a codec's stages ---------------===//

#include "kvc/Host/Tools/CodecTiming.h"
#include "kvc/Runtime/Base/Clock.h"

#include <cmath>

namespace kvc {

double KVObjects::rawBytes() const {
  double bytes = 0;
  for (const Object &object : objects)
    bytes += double(object.shape.numel()) * double(dtypeBytes(dtype));
  return bytes;
}

KVObjects kvObjects(const ModelCompute &model, const ModelCompute::Cache &cache,
                    int64_t tokens) {
  const ModelConfig &config = model.config();
  KVObjects kv;
  kv.dtype = config.dtype;
  const int64_t width = model.kvDim();
  for (int64_t l = 0; l < config.numLayers; ++l) {
    KVObjects::Object &object = kv.objects.emplace_back();
    object.shape = chunkShape(config, Form::KV, tokens, l, 1);
    for (const std::vector<float> *matrix : {&cache.k[l], &cache.v[l]})
      object.values.insert(object.values.end(), matrix->begin(),
                           matrix->begin() + tokens * width);
  }
  return kv;
}

namespace {

/// Encodes every object with `codec`.
StatusOr<std::vector<std::string>> encodeAll(const KVObjects &kv,
                                             const CodecSpec &codec) {
  std::vector<std::string> encoded;
  for (const KVObjects::Object &object : kv.objects) {
    KVC_RETURN_IF_ERROR(checkCodec(codec, object.shape));
    KVC_ASSIGN_OR_RETURN(bytes, encodeChunk(object.values.data(), object.shape,
                                            codec, kv.dtype));
    encoded.push_back(std::move(bytes));
  }
  return encoded;
}

} // namespace

StatusOr<CodecRates> timeCodec(const KVObjects &kv, const CodecSpec &codec) {
  KVC_ASSIGN_OR_RETURN(encoded, encodeAll(kv, codec));
  const std::size_t n = kv.objects.size();
  const double raw = kv.rawBytes();
  // A restore decodes each chunk once, from a staging slot the fetch just
  // filled into memory it has not touched: decodes are timed over copies
  // of the objects that add up to kStreamBytes of raw KV, each into its own
  // output, so that neither side stays in the cache as when one object is
  // decoded again and again.
  constexpr double kStreamBytes = 32.0 * (1 << 20);
  const std::size_t copies =
      std::max<std::size_t>(1, std::size_t(std::ceil(kStreamBytes / raw)));
  std::vector<std::string> streamed;
  streamed.reserve(copies * n);
  for (std::size_t c = 0; c < copies; ++c)
    streamed.insert(streamed.end(), encoded.begin(), encoded.end());
  std::vector<std::vector<uint16_t>> decoded(streamed.size());
  auto decode = [&](std::size_t j) {
    const ChunkShape &shape = kv.objects[j % n].shape;
    decoded[j].resize(shape.numel());
    return decodeChunkToBf16(streamed[j], shape, codec, kv.dtype,
                             decoded[j].data());
  };
  // Every call is checked once, before timing; timed calls repeat it.
  for (std::size_t j = 0; j < streamed.size(); ++j)
    KVC_RETURN_IF_ERROR(decode(j));
  CodecRates rates;
  rates.encodeGBs = raw / timeIt([&] { (void)encodeAll(kv, codec); }) / 1e9;
  rates.decodeGBs = raw * double(copies) / timeIt([&] {
                      for (std::size_t j = 0; j < streamed.size(); ++j)
                        (void)decode(j);
                    }) /
                    1e9;
  if (codec.lossless == CodecSpec::Lossless::None)
    return rates;
  // The lossless stage alone, on the bytes it codes.
  CodecSpec inner = codec;
  inner.lossless = CodecSpec::Lossless::None;
  KVC_ASSIGN_OR_RETURN(plain, encodeAll(kv, inner));
  double plainBytes = 0;
  for (const std::string &bytes : plain)
    plainBytes += double(bytes.size());
  std::vector<std::string> out(streamed.size());
  for (std::size_t j = 0; j < streamed.size(); ++j)
    KVC_RETURN_IF_ERROR(decompressBytes(streamed[j], codec.lossless, out[j],
                                        plain[j % n].size()));
  rates.losslessEncodeGBs = plainBytes / timeIt([&] {
                              for (const std::string &bytes : plain)
                                (void)compressBytes(bytes, codec.lossless);
                            }) /
                            1e9;
  rates.losslessDecodeGBs =
      plainBytes * double(copies) / timeIt([&] {
        for (std::size_t j = 0; j < streamed.size(); ++j)
          (void)decompressBytes(streamed[j], codec.lossless, out[j],
                                plain[j % n].size());
      }) /
      1e9;
  return rates;
}

} // namespace kvc
