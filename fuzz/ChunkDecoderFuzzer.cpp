//===- ChunkDecoderFuzzer.cpp - Fuzzing the chunk decoder -----------------===//
//
// Feeds arbitrary bytes to the two parsers a stored chunk goes through: the
// object format (unpackChunk) and, bypassing its checksums, every codec's
// decoder. Any input must give an error or values, never a crash, hang or
// out-of-bounds access.
//
// With clang (-DKVC_LIBFUZZER=ON) this is a libFuzzer target:
//   build-fuzz/fuzz/kvc-chunk-fuzzer -max_total_time=60
// Otherwise a driver runs seeds and random mutations of them (a ctest):
//   build/fuzz/kvc-chunk-fuzz [ITERATIONS]
//
//===----------------------------------------------------------------------===//

#include "Mutations.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Store/ChunkFormat.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace kvc;

namespace {

ModelConfig tinyModel() {
  ModelConfig m;
  m.numLayers = 4;
  m.hiddenSize = 64;
  m.numHeads = 4;
  m.numKvHeads = 2;
  m.headDim = 16;
  m.intermediateSize = 128;
  m.vocabSize = 64;
  m.maxPositions = 4096;
  return m;
}

const char *const kCodecs[] = {"raw", "int8", "int4/k=token", "int2/g64",
                               "hadamard+int4+deflate", "int8+zstd",
                               "lz4", "int4/bins8-2+deflate"};

void fuzzOne(const uint8_t *data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char *>(data), size);
  static const ModelConfig model = tinyModel();
  // The object format, then its payload as the header describes it.
  auto unpacked = unpackChunk(bytes);
  if (unpacked.isOk()) {
    const ChunkHeader &h = unpacked->first;
    int64_t tokens = h.tokenEnd - h.tokenBegin;
    int64_t layers = h.layerEnd - h.layerBegin;
    if (tokens > 0 && tokens <= 512 && layers > 0 && layers <= 4) {
      ChunkShape shape = chunkShape(model, h.form, tokens, 0, layers);
      std::vector<float> out(shape.numel());
      (void)decodeChunk(unpacked->second, shape, h.codec, h.dtype, out.data());
    }
  }
  // Every codec's decoder on the raw bytes, for a fixed small shape.
  if (size == 0)
    return;
  CodecSpec codec = *parseCodecSpec(kCodecs[data[0] % std::size(kCodecs)]);
  ChunkShape shape =
      chunkShape(model, data[0] & 0x80 ? Form::Hidden : Form::KV, 16, 0, 2);
  std::vector<float> out(shape.numel());
  (void)decodeChunk(bytes.substr(1), shape, codec, DType::BF16, out.data());
}

/// Valid chunks to mutate: one per codec.
std::vector<std::string> seeds() {
  static const ModelConfig model = tinyModel();
  std::vector<std::string> out;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal;
  for (size_t c = 0; c < std::size(kCodecs); ++c) {
    CodecSpec codec = *parseCodecSpec(kCodecs[c]);
    ChunkShape shape = chunkShape(model, Form::KV, 16, 0, 2);
    std::vector<float> values(shape.numel());
    for (float &v : values)
      v = normal(rng);
    std::string payload =
        *encodeChunk(values.data(), shape, codec, DType::BF16);
    ChunkHeader h;
    h.codec = codec;
    h.tokenEnd = 16;
    h.layerEnd = 2;
    out.push_back(packChunk(h, payload));
    out.push_back(char(c) + payload);
  }
  return out;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzzOne(data, size);
  return 0;
}

#ifndef KVC_LIBFUZZER
int main(int argc, char **argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(fuzz::mutationSeed(20261121));
  std::vector<std::string> corpus = seeds();
  for (long i = 0; i < iterations; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    if (rng() % 4 == 0) { // Random bytes.
      input.assign(rng() % 512, '\0');
      for (char &c : input)
        c = char(rng());
    } else {
      fuzz::damage(input, rng);
    }
    fuzzOne(reinterpret_cast<const uint8_t *>(input.data()), input.size());
  }
  std::printf("%ld inputs decoded without a crash\n", iterations);
  return 0;
}
#endif
