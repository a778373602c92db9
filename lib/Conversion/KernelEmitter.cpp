//===- KernelEmitter.cpp - Generated kernels: the loop nest, restore items ===//
//
// Each kvc.kernel of a generated kind becomes a function (KernelGen.h)
// whose body is
//
//   scf.parallel (%block, %chunk) = (0, 0) to (G, N) {   // -> blockIdx.x, y
//     scf.parallel %thread = 0 to T {                   // -> threadIdx.x
//       the chunk's record: payload offset, first token, first layer
//       if (the block's matrix is V) { P items of V } else { P items of K }
//
// N is the launch's chunks, the records of its chunk table (an rms_norm
// prologue has no chunk dimension), so chunks of one specialization that
// are ready together take one launch.
//
// One work item writes (a save kernel's reads) 8 bf16 values of one cache
// row, one 16-byte access (a host-form save item of a Hadamard or per-token
// layout: whole head rows or groups). Each K or V matrix of a layer gets its
// own blocks, so a block runs one layout's code (each specialized for its
// own quantization axis). Within a matrix, items are numbered token, then
// piece of the row: thread t of the matrix's block g computes items
// g * T * P + s * T + t for s < P, so each load and store instruction of a
// warp touches consecutive pieces, and a thread issues the loads of all P
// items before its first store (P = 16 / bits for quantized restore
// payloads: 16 bytes of packed values in flight per thread). Every payload
// access loads the widest unit its statically known alignment allows, up to
// 16 bytes, through a memref of vector elements, so the NVPTX backend emits
// ld.global.v4.u32 and st.global.v4.b32.
//
// Under Hadamard a restore thread's P items are pieces of one head row
// instead, R = head_dim / 8 / P pieces apart (KernelSpec::rowLanes; P =
// min(16 / bits, head_dim / 8), 1 unquantized): thread u of the matrix holds
// pieces u % R + R * s of head row u / R, and the R lanes beside it hold the
// rest of the row. The butterflies of stages 1, 2 and 4 run within each
// piece, those of stages 8 .. 4 * R across the R lanes through gpu.shuffle
// xor, and the rest within the thread, across its pieces: with P = 4 (int4)
// and head_dim 128, two of the seven stages shuffle. The host form, which
// kvc-kernels-to-llvm can lower, is the case R = 1: a thread holds a whole
// row. A save item transforms its pieces the same way: a per-token item
// under Hadamard holds KernelSpec::rowPieces() pieces of one row, any
// other item one piece, across head_dim / 8 lanes.
//
// A rope_scatter item loads its 8 f32 projections, and for K the 8 it is
// paired with (channel +- head_dim / 2; a head of 8 pairs within its piece)
// and 8 cosines and sines of the token's RoPE table row, then rotates and
// rounds as the runtime does (Rope.h).
//
// Restore items decode. The arithmetic is the runtime's, operation for
// operation:
// minimum + scale * q (the product is exact: an f16 scale times an 8-bit
// integer or an E4M3 value fits a float's mantissa), the Hadamard butterflies in the same
// order on the same operands, then the same round-to-nearest-even to bf16
// (the hardware's cvt.rn.bf16 in the GPU form, integer ops in the host
// form). So the generated code equals decodeChunkToBf16 (a save kernel
// encodeChunk) bit for bit on every value that is not NaN (a NaN stays NaN;
// its payload is the hardware's): KernelJitTest runs the host form through
// buildKernelsToLLVMPipeline, kvc-kernel-bench the GPU form on a GPU.
//
//
// Save items and the rms_norm prologue are in KernelSaveEmitter.cpp.
//
//===----------------------------------------------------------------------===//

#include "KernelEmitter.h"

#include "kvc/Runtime/Model/RmsNorm.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <numeric>

using namespace mlir;
using namespace kvc::compiler;
using namespace kvc::compiler::detail;

std::tuple<int64_t, Value, Type> ItemEmitter::units(Value memory, int64_t bytes,
                                                    int64_t align) {
  const int64_t unit = std::min(align, alignmentOf({bytes}));
  Type i32 = b.getI32Type();
  Type element = unit == 16  ? Type(vec(4, i32))
                 : unit == 8 ? Type(vec(2, i32))
                             : Type(b.getIntegerType(8 * unit));
  Value size = div(b.create<memref::DimOp>(loc, memory, index(0)), unit);
  Value view = b.create<memref::ViewOp>(
      loc, MemRefType::get({ShapedType::kDynamic}, element), memory, index(0),
      ValueRange{size});
  return {unit, view, element};
}

Value ItemEmitter::loadBytes(Value memory, Value offset, int64_t bytes,
                             int64_t align) {
  auto [unit, view, element] = units(memory, bytes, align);
  Value first = div(offset, unit);
  SmallVector<Value> pieces;
  for (int64_t k = 0; k < bytes / unit; ++k) {
    Value loaded = b.create<memref::LoadOp>(
        loc, view, ValueRange{k ? add(first, index(k)) : first});
    if (!isa<VectorType>(element))
      loaded = b.create<vector::BroadcastOp>(loc, vec(1, element), loaded);
    pieces.push_back(
        b.create<vector::BitCastOp>(loc, vec(unit, b.getI8Type()), loaded));
  }
  return concat(pieces);
}

void ItemEmitter::storeBytes(Value memory, Value offset, Value bytes,
                             int64_t align) {
  const int64_t size = count(bytes);
  auto [unit, view, element] = units(memory, size, align);
  Value first = div(offset, unit);
  for (int64_t k = 0; k < size / unit; ++k) {
    Value piece = unit == size ? bytes : slice(bytes, k * unit, unit);
    Value stored;
    if (auto type = dyn_cast<VectorType>(element))
      stored = b.create<vector::BitCastOp>(loc, type, piece);
    else
      stored = b.create<vector::ExtractOp>(
          loc, b.create<vector::BitCastOp>(loc, vec(1, element), piece),
          ArrayRef<int64_t>{0});
    b.create<memref::StoreOp>(loc, stored, view,
                              ValueRange{k ? add(first, index(k)) : first});
  }
}

void ItemEmitter::ifThen(Value condition, function_ref<void()> body) {
  auto op = b.create<scf::IfOp>(loc, condition, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(op.thenBlock());
  body();
}

Value ItemEmitter::concat(ArrayRef<Value> pieces) {
  SmallVector<Value> level(pieces);
  while (level.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      if (i + 1 == level.size()) {
        next.push_back(level[i]);
        break;
      }
      SmallVector<int64_t> mask(count(level[i]) + count(level[i + 1]));
      std::iota(mask.begin(), mask.end(), 0);
      next.push_back(
          b.create<vector::ShuffleOp>(loc, level[i], level[i + 1], mask));
    }
    level = std::move(next);
  }
  return level.front();
}

Value ItemEmitter::slice(Value vector, int64_t offset, int64_t size) {
  if (offset == 0 && size == count(vector))
    return vector;
  SmallVector<int64_t> mask(size);
  std::iota(mask.begin(), mask.end(), offset);
  return b.create<vector::ShuffleOp>(loc, vector, vector, mask);
}

void ItemEmitter::beginChunk(Value chunk) {
  Value record = mul(chunk, 3);
  auto field = [&](int64_t i) -> Value {
    Value stored = b.create<memref::LoadOp>(loc, args[4],
                                            ValueRange{add(record, index(i))});
    return b.create<arith::IndexCastOp>(loc, b.getIndexType(), stored);
  };
  payloadOffset = field(0);
  firstToken = field(1);
  firstLayer = field(2);
}

Value ItemEmitter::matrixOffset(bool value, Value layer) {
  MatrixLayout k = matrixLayout(spec, false), v = matrixLayout(spec, true);
  Value offset = add(payloadOffset, mul(layer, k.bytes + v.bytes));
  return value ? add(offset, index(k.bytes)) : offset;
}

Value ItemEmitter::loadRawBf16(bool value, Value layer, Value token,
                               Value channel) {
  const int64_t width = spec.width();
  MatrixLayout k = matrixLayout(spec, false);
  Value element = add(mul(token, width), channel);
  Value offset = add(matrixOffset(value, layer), mul(element, 2));
  int64_t align = alignmentOf({2 * k.bytes, value ? k.bytes : 0, 2 * width,
                               2 * spec.valuesPerItem(value), 16});
  Value bytes = loadBytes(payload(), offset, 16, align);
  return b.create<vector::BitCastOp>(loc, vec(8, b.getI16Type()), bytes);
}

namespace {

/// vector<8xf32> of 8 codes (vector<8xi32>) of a quantization's code kind
/// (the codec registry's CodeKind).
Value codeValues(OpBuilder &b, Location loc, kvc::CodeKind kind, Value codes) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  VectorType ints = VectorType::get({8}, i32), floats = VectorType::get({8}, f32);
  auto constant = [&](int32_t value) -> Value {
    return b.create<arith::ConstantOp>(
        loc, DenseElementsAttr::get(ints, b.getI32IntegerAttr(value)));
  };
  auto real = [&](float value) -> Value {
    return b.create<arith::ConstantOp>(
        loc, DenseElementsAttr::get(floats, b.getF32FloatAttr(value)));
  };
  auto asFloats = [&](Value v) -> Value {
    return b.create<arith::BitcastOp>(loc, floats, v);
  };
  switch (kind) {
  case kvc::CodeKind::Levels:
    // The integers as floats, exactly: 2^23 + q has q in its mantissa
    // bits, and subtracting 2^23 is exact. An OR and an add on the GPU's
    // full-rate pipes, where uitofp takes its quarter-rate conversion unit.
    return b.create<arith::SubFOp>(
        loc, asFloats(b.create<arith::OrIOp>(loc, codes, constant(0x4B000000))),
        real(8388608.0f));
  case kvc::CodeKind::E4M3: {
    // As e4m3ToFloat (Float8.h), in integer and select instructions, which
    // every PTX target and the host run alike: a normal code's exponent
    // rebiased from 7 to 127 and its mantissa moved to the top of f32's; a
    // subnormal's m * 2^-9 built as the normal (1 + m/8) * 2^-6 less 2^-6
    // (exact); S.1111.111 a NaN; the sign, bit 7, moved to bit 31.
    Value magnitude = b.create<arith::AndIOp>(loc, codes, constant(0x7F));
    Value exponent = b.create<arith::ShRUIOp>(loc, magnitude, constant(3));
    Value mantissa = b.create<arith::AndIOp>(loc, codes, constant(7));
    Value subnormal = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                              exponent, constant(0));
    Value field =
        b.create<arith::SelectOp>(loc, subnormal, constant(1), exponent);
    Value normal = asFloats(b.create<arith::OrIOp>(
        loc,
        b.create<arith::ShLIOp>(
            loc, b.create<arith::AddIOp>(loc, field, constant(120)),
            constant(23)),
        b.create<arith::ShLIOp>(loc, mantissa, constant(20))));
    Value lifted = b.create<arith::SubFOp>(loc, normal, real(0x1p-6f));
    Value value = b.create<arith::SelectOp>(loc, subnormal, lifted, normal);
    Value nan = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                        magnitude, constant(0x7F));
    value = b.create<arith::SelectOp>(loc, nan, real(NAN), value);
    Value sign = b.create<arith::ShLIOp>(
        loc, b.create<arith::AndIOp>(loc, codes, constant(0x80)),
        constant(24));
    return asFloats(b.create<arith::OrIOp>(
        loc, b.create<arith::BitcastOp>(loc, ints, value), sign));
  }
  }
  llvm_unreachable("unknown code kind");
}

} // namespace

Value ItemEmitter::loadValues(bool value, Value layer, Value token,
                              Value channel) {
  const int64_t width = spec.width();
  const MatrixLayout k = matrixLayout(spec, false);
  const MatrixLayout m = matrixLayout(spec, value);
  const int64_t layerBytes = k.bytes + matrixLayout(spec, true).bytes;
  const int64_t kOffset = value ? k.bytes : 0;
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  Value base = matrixOffset(value, layer);
  Value element = add(mul(token, width), channel);

  if (!m.bits) { // Unquantized: 8 values of the storage type.
    const int64_t bytes = spec.storage.getIntOrFloatBitWidth() / 8;
    Value offset = add(base, mul(element, bytes));
    int64_t align = alignmentOf({layerBytes, kOffset, bytes * width,
                                 bytes * spec.valuesPerItem(value), 8 * bytes});
    Value raw = loadBytes(payload(), offset, 8 * bytes, align);
    Value typed = b.create<vector::BitCastOp>(loc, vec(8, spec.storage), raw);
    return spec.storage.isF32()
               ? typed
               : b.create<arith::ExtFOp>(loc, vec(8, f32), typed).getResult();
  }

  // The 8 integers: `m.bits` bytes of packed values, low bits first.
  Value packedOffset =
      add(add(base, index(m.paramBytes)), div(mul(element, m.bits), 8));
  int64_t packedAlign =
      alignmentOf({layerBytes, kOffset, m.paramBytes, width * m.bits / 8,
                   spec.valuesPerItem(value) * m.bits / 8, m.bits});
  Value packed = loadBytes(payload(), packedOffset, m.bits, packedAlign);
  Value ints;
  if (m.bits == 8) {
    ints = b.create<arith::ExtUIOp>(loc, vec(8, i32), packed);
  } else {
    // One word holds the 8 values; value j sits at bits [j*bits, +bits).
    Type word = b.getIntegerType(8 * m.bits);
    Value w = b.create<vector::ExtractOp>(
        loc, b.create<vector::BitCastOp>(loc, vec(1, word), packed),
        ArrayRef<int64_t>{0});
    if (m.bits < 4)
      w = b.create<arith::ExtUIOp>(loc, i32, w);
    SmallVector<int32_t> shifts;
    for (int j = 0; j < 8; ++j)
      shifts.push_back(int32_t(j * m.bits));
    Value spread = b.create<vector::BroadcastOp>(loc, vec(8, i32), w);
    Value shifted = b.create<arith::ShRUIOp>(
        loc, spread,
        b.create<arith::ConstantOp>(
            loc, DenseIntElementsAttr::get(vec(8, i32), shifts)));
    ints = b.create<arith::AndIOp>(
        loc, shifted,
        splat(vec(8, i32), b.getI32IntegerAttr((1 << m.bits) - 1)));
  }
  Value q = codeValues(b, loc, spec.codec.getQuantStage()->codes, ints);
  // Scale and minimum: f16 pairs, one per group.
  Type f16 = b.getF16Type();
  Value scale, minimum;
  if (m.tokenAxis) {
    // The 8 channels share the group token * perRow + channel / size.
    Value group = add(mul(token, m.perRow), div(channel, m.size));
    Value offset = add(base, mul(group, 4));
    int64_t align = alignmentOf({layerBytes, kOffset, 4 * m.perRow, 4});
    Value halfs = b.create<vector::BitCastOp>(
        loc, vec(2, f16), loadBytes(payload(), offset, 4, align));
    Value pair = b.create<arith::ExtFOp>(loc, vec(2, f32), halfs);
    auto lane = [&](int64_t i) -> Value {
      return b.create<vector::BroadcastOp>(
          loc, vec(8, f32),
          b.create<vector::ExtractOp>(loc, pair, ArrayRef<int64_t>{i}));
    };
    scale = lane(0);
    minimum = lane(1);
  } else {
    // Each channel has its own group: (token / size) * width + channel.
    Value group = add(mul(div(token, m.size), width), channel);
    Value offset = add(base, mul(group, 4));
    int64_t align = alignmentOf(
        {layerBytes, kOffset, 4 * width, 4 * spec.valuesPerItem(value), 32});
    Value halfs = b.create<vector::BitCastOp>(
        loc, vec(16, f16), loadBytes(payload(), offset, 32, align));
    Value pairs = b.create<arith::ExtFOp>(loc, vec(16, f32), halfs);
    SmallVector<int64_t> even, odd;
    for (int64_t j = 0; j < 8; ++j) {
      even.push_back(2 * j);
      odd.push_back(2 * j + 1);
    }
    scale = b.create<vector::ShuffleOp>(loc, pairs, pairs, even);
    minimum = b.create<vector::ShuffleOp>(loc, pairs, pairs, odd);
  }
  // minimum + scale * q: the product is exact (an f16 scale times at most
  // 8 significant bits), so an FMA (one instruction) rounds as the
  // runtime's multiply and add do.
  return b.create<vector::FMAOp>(loc, scale, q, minimum);
}

Value ItemEmitter::butterflies(Value row, int64_t first, int64_t end) {
  // The runtime's butterflies (ChunkCodec.cpp, hadamard()): for each stage
  // `len`, x[j], x[j + len] = x[j] + x[j + len], x[j] - x[j + len] for the
  // j whose bit `len` is clear.
  const int64_t size = count(row);
  for (int64_t len = first; len < end; len *= 2) {
    SmallVector<int64_t> lowMask, highMask, merge(size);
    for (int64_t j = 0; j < size; ++j)
      if (!(j & len)) {
        merge[j] = int64_t(lowMask.size());
        merge[j + len] = size / 2 + int64_t(lowMask.size());
        lowMask.push_back(j);
        highMask.push_back(j + len);
      }
    Value low = b.create<vector::ShuffleOp>(loc, row, row, lowMask);
    Value high = b.create<vector::ShuffleOp>(loc, row, row, highMask);
    Value sum = b.create<arith::AddFOp>(loc, low, high);
    Value diff = b.create<arith::SubFOp>(loc, low, high);
    row = b.create<vector::ShuffleOp>(loc, sum, diff, merge);
  }
  return row;
}

Value ItemEmitter::laneButterflies(Value values, Value lane, int64_t rowLanes,
                                   int64_t laneStride) {
  // A stage whose pairs lie `distance` pieces apart in the head row, for
  // distance < rowLanes, pairs each value with the one at the same place
  // of the lane that far away. The lane whose bit is clear holds the low
  // values and keeps low + high; the other keeps low - high. Both are
  // partner + sign * own, with sign +1 or -1: an FMA whose product is exact,
  // so it rounds once, as the runtime's add or subtract does. A shuffle
  // and an FMA per value and stage.
  const int64_t n = count(values);
  FloatType f32 = b.getF32Type();
  VectorType type = vec(n, f32);
  Value width = b.create<arith::ConstantIntOp>(loc, 32, 32);
  for (int64_t distance = 1; distance < rowLanes; distance *= 2) {
    Value high = b.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::ne,
        b.create<arith::AndIOp>(loc, lane, index(distance)), index(0));
    Value sign = b.create<vector::BroadcastOp>(
        loc, type,
        b.create<arith::SelectOp>(
            loc, high,
            b.create<arith::ConstantFloatOp>(loc, APFloat(-1.0f), f32),
            b.create<arith::ConstantFloatOp>(loc, APFloat(1.0f), f32)));
    Value partner = splat(type, b.getF32FloatAttr(0));
    Value offset =
        b.create<arith::ConstantIntOp>(loc, distance * laneStride, 32);
    for (int64_t j = 0; j < n; ++j) {
      Value own =
          b.create<vector::ExtractOp>(loc, values, ArrayRef<int64_t>{j});
      Value theirs = b.create<gpu::ShuffleOp>(loc, own, offset, width,
                                              gpu::ShuffleMode::XOR)
                         .getShuffleResult();
      partner = b.create<vector::InsertOp>(loc, theirs, partner,
                                           ArrayRef<int64_t>{j});
    }
    values = b.create<vector::FMAOp>(loc, sign, values, partner);
  }
  return values;
}

Value ItemEmitter::normalize(Value values) {
  // Every value of the transform times 1/sqrt(head_dim), as the runtime.
  const float norm = 1.0f / std::sqrt(float(spec.headDim));
  return b.create<arith::MulFOp>(
      loc, values,
      splat(cast<VectorType>(values.getType()), b.getF32FloatAttr(norm)));
}

Value ItemEmitter::hadamard(Value values, Value channel, int64_t laneStride) {
  // The runtime's stages 1, 2, 4, ... head_dim / 2 in order: those within a
  // piece, then those across the row's lanes, then those across a thread's
  // pieces, which for pieces `rowLanes` apart are `8 * rowLanes` values
  // apart in the row and 8 apart in `values`.
  const int64_t rowValues = std::min(count(values), spec.headDim);
  const int64_t rowLanes = spec.headDim / rowValues;
  values = butterflies(values, 1, 8);
  if (rowLanes > 1)
    values = laneButterflies(values, rem(div(channel, 8), spec.headDim / 8),
                             rowLanes, laneStride);
  return normalize(butterflies(values, 8, rowValues));
}

Value ItemEmitter::loadProjected(bool value, Value layer, Value token,
                                 Value channel) {
  const int64_t width = spec.width(), matrix = 4 * spec.tokens * width;
  Value offset = add(add(payloadOffset, add(mul(layer, 2 * matrix),
                                            index(value ? matrix : 0))),
                     mul(add(mul(token, width), channel), 4));
  int64_t align = alignmentOf({2 * matrix, matrix, 4 * width, 32});
  return b.create<vector::BitCastOp>(loc, vec(8, b.getF32Type()),
                                     loadBytes(payload(), offset, 32, align));
}

Value ItemEmitter::rope(Value own, Value layer, Value token, Value channel) {
  // applyRope (Rope.h): with h = head_dim / 2 and j < h, channel j of a head
  // becomes x[j] * cos - x[j + h] * sin and channel j + h becomes
  // x[j + h] * cos + x[j] * sin. The 8 channels lie in one half, or are the
  // whole head (head_dim 8).
  const int64_t half = spec.headDim / 2;
  Type f32 = b.getF32Type();
  auto shuffle = [&](Value x, Value y, ArrayRef<int64_t> mask) -> Value {
    return b.create<vector::ShuffleOp>(loc, x, y, mask);
  };
  // Table row first_token + token: half cosines, then half sines.
  Value row = add(firstToken, token);
  Value partner, cos, sin, first;
  if (spec.headDim == 8) {
    // The piece is the head: its partner is its halves swapped, and the
    // row's 4 cosines and 4 sines serve both halves.
    Value table = b.create<vector::BitCastOp>(
        loc, vec(8, f32), loadBytes(ropeTable(), mul(row, 32), 32, 16));
    partner = shuffle(own, own, {4, 5, 6, 7, 0, 1, 2, 3});
    cos = shuffle(table, table, {0, 1, 2, 3, 0, 1, 2, 3});
    sin = shuffle(table, table, {4, 5, 6, 7, 4, 5, 6, 7});
  } else {
    Value inHead = rem(channel, spec.headDim);
    first = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, inHead,
                                    index(half));
    Value partnerChannel = b.create<arith::SelectOp>(
        loc, first, add(channel, index(half)),
        b.create<arith::SubIOp>(loc, channel, index(half)));
    partner = loadProjected(false, layer, token, partnerChannel);
    Value cosOffset = mul(add(mul(row, spec.headDim), rem(inHead, half)), 4);
    int64_t align = alignmentOf({4 * spec.headDim, 32});
    cos = b.create<vector::BitCastOp>(
        loc, vec(8, f32), loadBytes(ropeTable(), cosOffset, 32, align));
    sin = b.create<vector::BitCastOp>(
        loc, vec(8, f32),
        loadBytes(ropeTable(), add(cosOffset, index(4 * half)), 32, align));
  }
  Value ownCos = b.create<arith::MulFOp>(loc, own, cos);
  Value partnerSin = b.create<arith::MulFOp>(loc, partner, sin);
  Value low = b.create<arith::SubFOp>(loc, ownCos, partnerSin);
  Value high = b.create<arith::AddFOp>(loc, ownCos, partnerSin);
  // Channels of the first half take `low`, of the second `high`.
  if (!first)
    return shuffle(low, high, {0, 1, 2, 3, 12, 13, 14, 15});
  return b.create<arith::SelectOp>(loc, first, low, high);
}

Value ItemEmitter::roundToBf16(Value values) {
  const int64_t n = count(values);
  // The GPU form converts with the hardware's round-to-nearest-even
  // (cvt.rn.bf16x2.f32, one instruction per two values).
  if (!spec.host)
    return b.create<vector::BitCastOp>(
        loc, vec(n, b.getI16Type()),
        b.create<arith::TruncFOp>(loc, vec(n, b.getBF16Type()), values));
  // The host form spells floatToBf16 (Base/Half.h) out in integers: round
  // to nearest even; NaN stays quiet NaN.
  VectorType words = vec(n, b.getI32Type());
  auto word = [&](int32_t v) { return splat(words, b.getI32IntegerAttr(v)); };
  Value w = b.create<vector::BitCastOp>(loc, words, values);
  Value high = b.create<arith::ShRUIOp>(loc, w, word(16));
  Value lsb = b.create<arith::AndIOp>(loc, high, word(1));
  Value rounded = b.create<arith::ShRUIOp>(
      loc,
      b.create<arith::AddIOp>(loc, w,
                              b.create<arith::AddIOp>(loc, lsb, word(0x7FFF))),
      word(16));
  Value nan =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, values, values);
  Value quiet = b.create<arith::OrIOp>(loc, high, word(0x40));
  Value out = b.create<arith::SelectOp>(loc, nan, quiet, rounded);
  return b.create<arith::TruncIOp>(loc, vec(n, b.getI16Type()), out);
}

Value ItemEmitter::destination(Value layer, Value token, Value channel) {
  // The token's row: table[t / B] * B + t % B, in layer first_layer + layer.
  Value position = add(firstToken, token);
  Value block = b.create<arith::IndexCastOp>(
      loc, b.getIndexType(),
      b.create<memref::LoadOp>(loc, blockTable(),
                               ValueRange{div(position, spec.blockSize)}));
  Value slot = add(mul(block, spec.blockSize), rem(position, spec.blockSize));
  Value row = add(
      b.create<arith::MulIOp>(loc, add(firstLayer, layer), layerRows()), slot);
  return add(mul(row, spec.width()), channel);
}

SmallVector<ItemEmitter::Result> ItemEmitter::compute(bool value, Value layer,
                                                      ArrayRef<Value> items) {
  const int64_t perItem = spec.valuesPerItem(value);
  const int64_t perRow = spec.width() / perItem;
  // A Hadamard restore's items are one head row's pieces, `lanes` pieces
  // apart: one token, one block-table lookup.
  const int64_t lanes = spec.rowLanes();
  SmallVector<Result> results;
  SmallVector<Value> values; // Decoded 8-value pieces, in item order.
  Value token, rowFirst, firstChannel;
  for (auto [s, item] : llvm::enumerate(items)) {
    Result &result = results.emplace_back();
    Value first;
    if (lanes && s) {
      Value step = index(8 * lanes * int64_t(s));
      first = add(rowFirst, step);
      result.element = add(results.front().element, step);
    } else {
      token = div(item, perRow);
      first = rowFirst = mul(rem(item, perRow), perItem);
      result.element = destination(layer, token, first);
    }
    if (spec.kind == KernelKind::RopeScatter) {
      Value projected = loadProjected(value, layer, token, first);
      if (!value)
        projected = rope(projected, layer, token, first);
      result.pieces.push_back(roundToBf16(projected));
    } else if (!spec.bits() && !spec.hadamard() && spec.storage.isBF16()) {
      // Raw bf16: a 16-byte copy per item.
      result.pieces.push_back(loadRawBf16(value, layer, token, first));
    } else {
      if (!firstChannel)
        firstChannel = first;
      for (int64_t p = 0; p < perItem / 8; ++p)
        values.push_back(loadValues(value, layer, token,
                                    p ? add(first, index(8 * p)) : first));
    }
  }
  if (values.empty())
    return results;
  if (spec.hadamard()) {
    Value row = hadamard(concat(values), firstChannel);
    for (auto [s, piece] : llvm::enumerate(values))
      piece = slice(row, 8 * int64_t(s), 8);
  }
  for (auto [s, piece] : llvm::enumerate(values))
    results[s / (perItem / 8)].pieces.push_back(roundToBf16(piece));
  return results;
}

void ItemEmitter::write(bool value, const Result &result) {
  SmallVector<Value> bytes;
  for (Value piece : result.pieces)
    bytes.push_back(
        b.create<vector::BitCastOp>(loc, vec(16, b.getI8Type()), piece));
  storeBytes(cache(value), mul(result.element, 2), concat(bytes), 16);
}

func::FuncOp kvc::compiler::buildKernel(OpBuilder &builder, Location loc,
                                        const KernelSpec &spec) {
  MLIRContext *ctx = builder.getContext();
  Type bytes = MemRefType::get({ShapedType::kDynamic}, builder.getI8Type());
  Type table = MemRefType::get({ShapedType::kDynamic}, builder.getI32Type());
  Type chunks = MemRefType::get({ShapedType::kDynamic}, builder.getI64Type());
  Type index = builder.getIndexType();
  SmallVector<Type> args = {bytes, bytes, bytes, table, chunks, index};
  if (spec.kind == KernelKind::RopeScatter)
    args.push_back(bytes); // rope_table
  if (spec.kind == KernelKind::RmsNorm)
    args = {bytes, bytes, bytes, index};
  auto func = builder.create<func::FuncOp>(loc, spec.symbolName(),
                                           FunctionType::get(ctx, args, {}));
  OpBuilder b = OpBuilder::atBlockBegin(func.addEntryBlock());
  ItemEmitter emitter(b, loc, spec, func);
  auto constant = [&](int64_t v) { return emitter.index(v); };
  // Blocks (x the launch's chunks, for a kernel that addresses the cache) x
  // threads; leaves the builder in the threads' body, after the chunk's
  // record is read.
  auto nest = [&](int64_t blocks) -> std::pair<Value, Value> {
    SmallVector<Value> lower = {constant(0)}, upper = {constant(blocks)},
                       step = {constant(1)};
    if (spec.kind != KernelKind::RmsNorm) {
      lower.push_back(constant(0));
      upper.push_back(emitter.div(
          b.create<memref::DimOp>(loc, func.getArgument(4), constant(0)), 3));
      step.push_back(constant(1));
    }
    auto grid = b.create<scf::ParallelOp>(loc, lower, upper, step);
    b.setInsertionPoint(grid.getBody()->getTerminator());
    auto block = b.create<scf::ParallelOp>(loc, ValueRange{constant(0)},
                                           ValueRange{constant(spec.threads)},
                                           ValueRange{constant(1)});
    b.setInsertionPoint(block.getBody()->getTerminator());
    if (spec.kind != KernelKind::RmsNorm)
      emitter.beginChunk(grid.getInductionVars()[1]);
    return {grid.getInductionVars()[0], block.getInductionVars()[0]};
  };
  auto finish = [&] {
    b.setInsertionPointToEnd(&func.getBody().front());
    b.create<func::ReturnOp>(loc);
    return func;
  };

  if (spec.kind == KernelKind::RmsNorm) {
    // A row of the chunk (layer, then token) per L consecutive lanes in the
    // GPU form (RmsNorm.h), per thread in the host form. Lanes past the
    // last row recompute it and store nothing.
    const int64_t lanes = spec.host ? 1 : kvc::rmsNormLanes(spec.hidden);
    const int64_t rows = spec.layers * spec.tokens;
    const int64_t perBlock = spec.threads / lanes;
    auto [blockId, threadId] = nest(ceilDiv(rows, perBlock));
    Value row = emitter.add(emitter.mul(blockId, perBlock),
                            emitter.div(threadId, lanes));
    Value inRange = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, row,
                                            constant(rows));
    emitter.rmsNormRow(b.create<arith::MinUIOp>(loc, row, constant(rows - 1)),
                       emitter.rem(threadId, lanes), inRange);
    return finish();
  }
  // Each K or V matrix of a layer gets its own blocks, so a block runs the
  // code of one layout. Thread t of the matrix's block g computes items
  // g * T * P + s * T + t, s < P: each of its P loads and stores is a
  // warp's consecutive pieces, and the P items are loaded and decoded
  // before the first store, so a thread keeps P items' bytes in flight (a
  // Hadamard restore's items lie in one head row instead: rowLanes()).
  // Past the matrix's last item a thread recomputes that item (that row)
  // and does not write it.
  // The matrices of a save kernel may be tiled differently (a per-channel
  // K, a per-token V): each has the blocks the larger one needs.
  const int64_t perThread = spec.itemsPerThread();
  const int64_t span = spec.threads * perThread;
  const int64_t blocksPerMatrix =
      ceilDiv(std::max(spec.itemsOf(false), spec.itemsOf(true)), span);
  Value zero = constant(0);
  auto [blockId, threadId] = nest(2 * spec.layers * blocksPerMatrix);
  Value matrix = emitter.div(blockId, blocksPerMatrix);
  Value layer = emitter.div(matrix, 2);
  Value blockInMatrix = emitter.rem(blockId, blocksPerMatrix);
  Value isValue = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne,
                                          emitter.rem(matrix, 2), zero);
  auto ifOp = b.create<scf::IfOp>(loc, isValue, /*withElseRegion=*/true);
  for (bool value : {true, false}) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(value ? ifOp.thenBlock() : ifOp.elseBlock());
    const int64_t items = spec.itemsOf(value);
    SmallVector<std::pair<Value, Value>> pending; // (item, clamped)
    if (const int64_t lanes = spec.rowLanes()) {
      // Thread u of the matrix holds pieces u % lanes + lanes * s of head
      // row u / lanes (a row's lanes are all in range or all past it).
      const int64_t rows = spec.tokens * spec.kvHeads;
      const int64_t pieces = spec.headDim / 8;
      Value thread =
          emitter.add(emitter.mul(blockInMatrix, spec.threads), threadId);
      Value row = emitter.div(thread, lanes);
      Value clamped = b.create<arith::MinUIOp>(loc, row, constant(rows - 1));
      Value piece = emitter.rem(thread, lanes);
      Value first = emitter.mul(row, pieces);
      Value clampedFirst = emitter.mul(clamped, pieces);
      for (int64_t s = 0; s < perThread; ++s) {
        Value inRow = emitter.add(piece, constant(s * lanes));
        pending.emplace_back(emitter.add(first, inRow),
                             emitter.add(clampedFirst, inRow));
      }
    } else {
      Value firstItem = emitter.add(emitter.mul(blockInMatrix, span), threadId);
      for (int64_t s = 0; s < perThread; ++s) {
        Value item =
            s ? emitter.add(firstItem, constant(s * spec.threads)) : firstItem;
        pending.emplace_back(
            item, b.create<arith::MinUIOp>(loc, item, constant(items - 1)));
      }
    }
    auto inRange = [&](Value item) -> Value {
      return b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, item,
                                     constant(items));
    };
    if (spec.kind == KernelKind::Save) {
      // Blocks past the smaller matrix's items skip it whole (no lane of
      // theirs takes part in a shuffle).
      auto work = [&] {
        for (auto [item, clamped] : pending)
          emitter.save(value, layer, clamped, inRange(item));
      };
      if (ceilDiv(items, span) == blocksPerMatrix)
        work();
      else
        emitter.ifThen(inRange(emitter.mul(blockInMatrix, span)), work);
      continue;
    }
    SmallVector<Value> clamped;
    for (auto [item, clampedItem] : pending)
      clamped.push_back(clampedItem);
    SmallVector<ItemEmitter::Result> computed =
        emitter.compute(value, layer, clamped);
    for (auto [item, result] : llvm::zip(pending, computed))
      emitter.ifThen(inRange(item.first),
                     [&] { emitter.write(value, result); });
  }
  return finish();
}
