//===- CodecTiming.cpp - Per-core rates of a codec's stages ---------------===//

#include "kvc/Host/CodecTiming.h"
#include "kvc/Runtime/Base/Clock.h"

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
  // Every call is checked once, before timing; timed calls repeat it.
  std::vector<uint16_t> decoded;
  auto decode = [&](std::size_t i) {
    const ChunkShape &shape = kv.objects[i].shape;
    decoded.resize(shape.numel());
    return decodeChunkToBf16(encoded[i], shape, codec, kv.dtype,
                             decoded.data());
  };
  for (std::size_t i = 0; i < n; ++i)
    KVC_RETURN_IF_ERROR(decode(i));
  const double raw = kv.rawBytes();
  CodecRates rates;
  rates.encodeGBs = raw / timeIt([&] { (void)encodeAll(kv, codec); }) / 1e9;
  rates.decodeGBs = raw / timeIt([&] {
                      for (std::size_t i = 0; i < n; ++i)
                        (void)decode(i);
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
  std::string out;
  for (std::size_t i = 0; i < n; ++i)
    KVC_RETURN_IF_ERROR(
        decompressBytes(encoded[i], codec.lossless, out, plain[i].size()));
  rates.losslessEncodeGBs = plainBytes / timeIt([&] {
                              for (const std::string &bytes : plain)
                                (void)compressBytes(bytes, codec.lossless);
                            }) /
                            1e9;
  rates.losslessDecodeGBs =
      plainBytes / timeIt([&] {
        for (std::size_t i = 0; i < n; ++i)
          (void)decompressBytes(encoded[i], codec.lossless, out,
                                plain[i].size());
      }) /
      1e9;
  return rates;
}

} // namespace kvc
