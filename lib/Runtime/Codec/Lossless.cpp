//===- Lossless.cpp - The lossless stage of chunk encoding ----------------===//
//
// deflate (libdeflate), zstd and lz4 over a chunk's quantized bytes, with
// each thread's coder contexts made once and reused. Decoding knows the
// output size in advance; a stream that does not decode to exactly that
// size is DataLoss.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Codec/ChunkCodec.h"

#include <libdeflate.h>
#include <lz4.h>
#include <zstd.h>

#include <cstring>
#include <memory>

namespace kvc {

namespace {

/// Deflate's Huffman coding must save this share of the bytes to be kept.
constexpr double kMinDeflateGain = 0.15;

/// Each thread's coder contexts, made on first use and reused for every
/// object after: allocating them per call (ZSTD_decompress does) costs as
/// much as decoding a 36 KB object.
struct CoderContexts {
  template <typename T, typename R>
  using Owned = std::unique_ptr<T, R (*)(T *)>;

  Owned<libdeflate_decompressor, void> deflateD{libdeflate_alloc_decompressor(),
                                                libdeflate_free_decompressor};
  /// Levels 0 (stored blocks) and 1.
  Owned<libdeflate_compressor, void> deflateC[2] = {
      {libdeflate_alloc_compressor(0), libdeflate_free_compressor},
      {libdeflate_alloc_compressor(1), libdeflate_free_compressor}};
  Owned<ZSTD_DCtx, size_t> zstdD{ZSTD_createDCtx(), ZSTD_freeDCtx};
  Owned<ZSTD_CCtx, size_t> zstdC{ZSTD_createCCtx(), ZSTD_freeCCtx};
};

CoderContexts &coderContexts() {
  thread_local CoderContexts contexts;
  return contexts;
}

libdeflate_compressor *deflateCompressor(int level) {
  return coderContexts().deflateC[level].get();
}

} // namespace

StatusOr<std::string> compressBytes(std::string_view raw,
                                    CodecSpec::Lossless coder) {
  std::string out;
  switch (coder) {
  case CodecSpec::Lossless::None:
    return std::string(raw);
  case CodecSpec::Lossless::Deflate: {
    // Level 1; when Huffman coding saves under kMinDeflateGain, stored
    // blocks instead (still deflate, decoded at memory speed): on
    // near-random quantized data the coding is not worth its decode time.
    for (int level : {1, 0}) {
      libdeflate_compressor *c = deflateCompressor(level);
      out.resize(libdeflate_deflate_compress_bound(c, raw.size()));
      size_t n = libdeflate_deflate_compress(c, raw.data(), raw.size(),
                                             out.data(), out.size());
      if (n == 0)
        return internalError("deflate failed");
      out.resize(n);
      if (double(n) <= (1.0 - kMinDeflateGain) * double(raw.size()))
        break;
    }
    return out;
  }
  case CodecSpec::Lossless::Zstd: {
    out.resize(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compressCCtx(coderContexts().zstdC.get(), out.data(),
                                 out.size(), raw.data(), raw.size(), 1);
    if (ZSTD_isError(n))
      return internalError(std::string("zstd: ") + ZSTD_getErrorName(n));
    out.resize(n);
    return out;
  }
  case CodecSpec::Lossless::Lz4: {
    out.resize(LZ4_compressBound(int(raw.size())));
    int n = LZ4_compress_default(raw.data(), out.data(), int(raw.size()),
                                 int(out.size()));
    if (n <= 0)
      return internalError("lz4 failed");
    out.resize(n);
    return out;
  }
  }
  return internalError("unknown coder");
}

Status decompressBytes(std::string_view packed, CodecSpec::Lossless coder,
                       std::string &out, size_t expectedSize) {
  out.resize(expectedSize);
  switch (coder) {
  case CodecSpec::Lossless::None:
    if (packed.size() != expectedSize)
      return dataLoss("payload of " + std::to_string(packed.size()) +
                      " bytes, expected " + std::to_string(expectedSize));
    std::memcpy(out.data(), packed.data(), expectedSize);
    return Status::ok();
  case CodecSpec::Lossless::Deflate: {
    size_t actual = 0;
    libdeflate_result r = libdeflate_deflate_decompress(
        coderContexts().deflateD.get(), packed.data(), packed.size(),
        out.data(), expectedSize, &actual);
    if (r != LIBDEFLATE_SUCCESS || actual != expectedSize)
      return dataLoss("deflate stream is corrupt or truncated");
    return Status::ok();
  }
  case CodecSpec::Lossless::Zstd: {
    unsigned long long size =
        ZSTD_getFrameContentSize(packed.data(), packed.size());
    if (size != expectedSize)
      return dataLoss("zstd frame is corrupt, truncated or of the wrong size");
    size_t n = ZSTD_decompressDCtx(coderContexts().zstdD.get(), out.data(),
                                   expectedSize, packed.data(), packed.size());
    if (ZSTD_isError(n) || n != expectedSize)
      return dataLoss("zstd frame is corrupt or truncated");
    return Status::ok();
  }
  case CodecSpec::Lossless::Lz4: {
    int n = LZ4_decompress_safe(packed.data(), out.data(), int(packed.size()),
                                int(expectedSize));
    if (n < 0 || size_t(n) != expectedSize)
      return dataLoss("lz4 block is corrupt or truncated");
    return Status::ok();
  }
  }
  return dataLoss("unknown lossless coder");
}

} // namespace kvc
