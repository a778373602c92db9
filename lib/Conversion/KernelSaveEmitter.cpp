//===- KernelSaveEmitter.cpp - Generated kernels: save items, RMSNorm -----===//
//
// A save item runs the other way: it loads 8 values of a cache row (one
// 16-byte load through the block table), transforms them as above, and
// encodes them into the payload, one item per thread. Per-token groups
// (a multiple of 8 channels) are reduced in the thread, then across the
// group's aligned lanes (gpu.shuffle xor, min and max); the group's first
// lane stores the scale and minimum, every lane its packed values; under
// Hadamard an item holds KernelSpec::rowPieces() pieces of a head row. A
// per-channel item covers a group's tokens for its 8 channels: it scans
// them once for the extremes (an scf.for carrying them), stores the 8
// channels' parameters, and scans again to quantize. Lanes past the
// chunk's end rescan its last token and store nothing, so every lane runs
// every shuffle; a block past the smaller matrix's items skips it whole.
// The encoder's arithmetic is the runtime's (quantizeMatrix): extremes
// ignoring NaN, the f16 minimum and scale, the scale's reciprocal, the
// scaled value clamped and rounded to nearest even (adding 2^23).
//
// A project -> scatter kernel also gets its prologue, an rms_norm kernel:
// one row of hidden states per L lanes (RmsNorm.h), an scf.for summing
// squares in 8 partial sums per lane, the lanes' totals through
// gpu.shuffle xor, PTX's sqrt.rn.f32 (math.sqrt in the host form), and a
// second scf.for writing the weighted rows as bf16.
//
//===----------------------------------------------------------------------===//

#include "KernelEmitter.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Model/RmsNorm.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <numeric>

using namespace mlir;
using namespace kvc::compiler;
using namespace kvc::compiler::detail;

Value ItemEmitter::loadCache(bool value, Value layer, Value token,
                             Value channel, int64_t n) {
  // The cache row is 16-byte aligned and the channel a multiple of 8.
  Value element = destination(layer, token, channel);
  Value bits = b.create<vector::BitCastOp>(
      loc, vec(n, b.getBF16Type()),
      loadBytes(cache(value), mul(element, 2), 2 * n, 16));
  return b.create<arith::ExtFOp>(loc, vec(n, b.getF32Type()), bits);
}

Value ItemEmitter::transformed(Value values, Value channel,
                               int64_t laneStride) {
  return spec.hadamard() ? hadamard(values, channel, laneStride) : values;
}

Value ItemEmitter::gather(bool value, Value layer, Value token, Value channel,
                          int64_t n) {
  return transformed(loadCache(value, layer, token, channel, n), channel);
}

Value ItemEmitter::squareRoot(Value x) {
  if (spec.host)
    return b.create<math::SqrtOp>(loc, x);
  // convert-gpu-to-nvvm turns math.sqrt into libdevice's __nv_sqrtf, which
  // rounds approximately unless told otherwise; PTX's sqrt.rn.f32 is
  // IEEE's, as the host's.
  return b
      .create<LLVM::InlineAsmOp>(
          loc, b.getF32Type(), ValueRange{x}, "sqrt.rn.f32 $0, $1;", "=f,f",
          /*has_side_effects=*/false,
          /*is_align_stack=*/false, LLVM::AsmDialectAttr(), ArrayAttr())
      .getResult(0);
}

Value ItemEmitter::combine(Combine how, Value x, Value y) {
  switch (how) {
  case Combine::Min:
    return b.create<arith::MinNumFOp>(loc, x, y);
  case Combine::Max:
    return b.create<arith::MaxNumFOp>(loc, x, y);
  case Combine::Add:
    return b.create<arith::AddFOp>(loc, x, y);
  }
  llvm_unreachable("unknown combination");
}

Value ItemEmitter::reduce(Value values, int64_t size, Combine how) {
  SmallVector<Value> groups;
  for (int64_t g = 0; g < count(values) / size; ++g) {
    Value partial = slice(values, g * size, 8);
    for (int64_t p = 8; p < size; p += 8)
      partial = combine(how, partial, slice(values, g * size + p, 8));
    groups.push_back(partial);
  }
  Value partials = concat(groups);
  for (int64_t half = 4; half >= 1; half /= 2) {
    SmallVector<int64_t> low, high;
    for (int64_t g = 0; g < int64_t(groups.size()); ++g)
      for (int64_t j = 0; j < half; ++j) {
        low.push_back(2 * half * g + j);
        high.push_back(2 * half * g + half + j);
      }
    partials =
        combine(how, b.create<vector::ShuffleOp>(loc, partials, partials, low),
                b.create<vector::ShuffleOp>(loc, partials, partials, high));
  }
  return partials;
}

Value ItemEmitter::laneReduce(Value x, int64_t lanes, Combine how) {
  Value width = b.create<arith::ConstantIntOp>(loc, 32, 32);
  Value result = x;
  for (int64_t j = 0; j < count(x); ++j) {
    Value own = b.create<vector::ExtractOp>(loc, x, ArrayRef<int64_t>{j});
    for (int64_t distance = 1; distance < lanes; distance *= 2) {
      Value offset = b.create<arith::ConstantIntOp>(loc, distance, 32);
      Value theirs = b.create<gpu::ShuffleOp>(loc, own, offset, width,
                                              gpu::ShuffleMode::XOR)
                         .getShuffleResult();
      own = combine(how, own, theirs);
    }
    result = b.create<vector::InsertOp>(loc, own, result, ArrayRef<int64_t>{j});
  }
  return result;
}

void ItemEmitter::rmsNormRow(Value row, Value lane, Value inRange) {
  // RmsNorm.h's order: lane l sums the squares of pieces l, l + L, ... in
  // 8 partial sums; a lane's total; the lanes' totals pairwise.
  const int64_t h = spec.hidden, pieces = h / 8;
  const int64_t lanes = kvc::rmsNormLanes(h);
  const int64_t held = spec.host ? lanes : 1; // Lanes this item holds.
  const int64_t bytes = spec.storage.getIntOrFloatBitWidth() / 8;
  Type f32 = b.getF32Type();
  Value layer = div(row, spec.tokens);
  // Piece p of the row as f32, 0 past the row's end, and whether it is in.
  auto piece = [&](Value k, int64_t j) -> std::pair<Value, Value> {
    Value p = add(mul(k, lanes), spec.host ? index(j) : lane);
    Value in = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, p,
                                       index(pieces));
    Value clamped = b.create<arith::MinUIOp>(loc, p, index(pieces - 1));
    Value offset = mul(add(mul(row, h), mul(clamped, 8)), bytes);
    Value raw = b.create<vector::BitCastOp>(
        loc, vec(8, spec.storage),
        loadBytes(args[0], offset, 8 * bytes,
                  alignmentOf({h * bytes, 8 * bytes})));
    Value x = spec.storage.isF32()
                  ? raw
                  : b.create<arith::ExtFOp>(loc, vec(8, f32), raw).getResult();
    return {b.create<arith::SelectOp>(loc, in, x,
                                      splat(vec(8, f32), b.getF32FloatAttr(0))),
            in};
  };
  // The GPU form issues the loads of `unroll` pieces before it uses any, so
  // a lane keeps that many 16-byte loads in flight; the sums keep their
  // order.
  const int64_t steps = ceilDiv(pieces, lanes);
  const int64_t unroll = spec.host ? 1 : inFlight(steps);
  VectorType accType = vec(8 * held, f32);
  auto sum =
      b.create<scf::ForOp>(loc, index(0), index(steps), index(unroll),
                           ValueRange{splat(accType, b.getF32FloatAttr(0))});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(sum.getBody());
    SmallVector<Value> xs;
    for (int64_t u = 0; u < unroll; ++u) {
      SmallVector<Value> parts;
      for (int64_t j = 0; j < held; ++j)
        parts.push_back(piece(add(sum.getInductionVar(), index(u)), j).first);
      xs.push_back(concat(parts));
    }
    Value acc = sum.getRegionIterArgs()[0];
    for (Value x : xs)
      acc =
          b.create<arith::AddFOp>(loc, acc, b.create<arith::MulFOp>(loc, x, x));
    b.create<scf::YieldOp>(loc, ValueRange{acc});
  }
  Value totals = reduce(sum.getResult(0), 8, Combine::Add); // One per lane.
  if (!spec.host) {
    totals = laneReduce(totals, lanes, Combine::Add);
  } else {
    for (int64_t n = lanes; n > 1; n /= 2) {
      SmallVector<int64_t> even, odd;
      for (int64_t i = 0; i < n / 2; ++i) {
        even.push_back(2 * i);
        odd.push_back(2 * i + 1);
      }
      totals = b.create<arith::AddFOp>(
          loc, b.create<vector::ShuffleOp>(loc, totals, totals, even),
          b.create<vector::ShuffleOp>(loc, totals, totals, odd));
    }
  }
  // scale = 1 / sqrt(total / h + eps).
  Value total = b.create<vector::ExtractOp>(loc, totals, ArrayRef<int64_t>{0});
  auto scalar = [&](double v) -> Value {
    return b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(float(v)));
  };
  Value scale = b.create<arith::DivFOp>(
      loc, scalar(1.0),
      squareRoot(b.create<arith::AddFOp>(
          loc, b.create<arith::DivFOp>(loc, total, scalar(double(h))),
          scalar(spec.eps))));
  Value scales = b.create<vector::BroadcastOp>(loc, vec(8, f32), scale);
  // out = (x * scale) * weight, rounded to bf16; the GPU form loads a
  // batch's pieces and weights before its first store.
  auto write = b.create<scf::ForOp>(loc, index(0), index(steps), index(unroll));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(write.getBody()->getTerminator());
  Value weightRow = mul(add(args[3], layer), h);
  struct Loaded {
    Value x, in, p, weight;
  };
  SmallVector<Loaded> batch;
  for (int64_t u = 0; u < unroll; ++u)
    for (int64_t j = 0; j < held; ++j) {
      Value k = add(write.getInductionVar(), index(u));
      auto [x, in] = piece(k, j);
      Value p = b.create<arith::MinUIOp>(
          loc, add(mul(k, lanes), spec.host ? index(j) : lane),
          index(pieces - 1));
      Value weight = b.create<vector::BitCastOp>(
          loc, vec(8, f32),
          loadBytes(args[1], mul(add(weightRow, mul(p, 8)), 4), 32,
                    alignmentOf({4 * h, 32})));
      batch.push_back({x, in, p, weight});
    }
  for (const Loaded &l : batch) {
    Value out = roundToBf16(b.create<arith::MulFOp>(
        loc, b.create<arith::MulFOp>(loc, l.x, scales), l.weight));
    Value bytesOut =
        b.create<vector::BitCastOp>(loc, vec(16, b.getI8Type()), out);
    ifThen(b.create<arith::AndIOp>(loc, inRange, l.in), [&] {
      storeBytes(args[2], mul(add(mul(row, h), mul(l.p, 8)), 2), bytesOut, 16);
    });
  }
}

ItemEmitter::QuantParams ItemEmitter::quantParams(Value lo, Value hi,
                                                  int64_t bits) {
  // quantizeMatrix (ChunkCodec.cpp), operation for operation.
  const int64_t groups = count(lo);
  VectorType f32 = vec(groups, b.getF32Type()),
             f16 = vec(groups, b.getF16Type()),
             i32 = vec(groups, b.getI32Type());
  auto constant = [&](float v) { return splat(f32, b.getF32FloatAttr(v)); };
  // The runtime's scan starts from +-infinity (an all-NaN group's extremes).
  lo = b.create<arith::MinNumFOp>(loc, lo, constant(INFINITY));
  hi = b.create<arith::MaxNumFOp>(loc, hi, constant(-INFINITY));
  // The minimum plus 0: a zero minimum is +0.
  Value minimum16 = b.create<arith::TruncFOp>(
      loc, f16, b.create<arith::AddFOp>(loc, lo, constant(0)));
  Value minimum = b.create<arith::ExtFOp>(loc, f32, minimum16);
  Value range = b.create<arith::SubFOp>(loc, hi, minimum);
  Value positive = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGT,
                                           range, constant(0));
  Value scale16 = b.create<arith::TruncFOp>(
      loc, f16,
      b.create<arith::SelectOp>(
          loc, positive,
          b.create<arith::DivFOp>(loc, range, constant((1 << bits) - 1)),
          constant(1)));
  Value underflow = b.create<arith::CmpFOp>(
      loc, arith::CmpFPredicate::OLE,
      b.create<arith::ExtFOp>(loc, f32, scale16), constant(0));
  APFloat tiny(APFloat::IEEEhalf(), APInt(16, kvc::kTinyQuantScale));
  scale16 = b.create<arith::SelectOp>(
      loc, underflow, splat(f16, b.getFloatAttr(b.getF16Type(), tiny)),
      scale16);
  Value inverse = b.create<arith::DivFOp>(
      loc, constant(1), b.create<arith::ExtFOp>(loc, f32, scale16));
  auto word = [&](Value halfs) -> Value {
    return b.create<arith::ExtUIOp>(
        loc, i32,
        b.create<arith::BitcastOp>(loc, vec(groups, b.getI16Type()), halfs));
  };
  Value words = b.create<arith::OrIOp>(
      loc, word(scale16),
      b.create<arith::ShLIOp>(loc, word(minimum16),
                              splat(i32, b.getI32IntegerAttr(16))));
  return {minimum, inverse, words};
}

Value ItemEmitter::quantize(Value values, Value minimum, Value inverse,
                            int64_t bits) {
  const int64_t n = count(values);
  VectorType f32 = vec(n, b.getF32Type()), i32 = vec(n, b.getI32Type());
  auto constant = [&](float v) { return splat(f32, b.getF32FloatAttr(v)); };
  // (x - minimum) * inverse, clamped to [0, levels] (a NaN to 0), rounded to
  // nearest even by adding 2^23: the integer lands in the mantissa bits.
  Value scaled = b.create<arith::MulFOp>(
      loc, b.create<arith::SubFOp>(loc, values, minimum), inverse);
  Value clamped = b.create<arith::MinNumFOp>(
      loc, b.create<arith::MaxNumFOp>(loc, scaled, constant(0)),
      constant((1 << bits) - 1));
  Value q = b.create<arith::AndIOp>(
      loc,
      b.create<arith::BitcastOp>(
          loc, i32,
          b.create<arith::AddFOp>(loc, clamped, constant(8388608.0f))),
      splat(i32, b.getI32IntegerAttr((1 << bits) - 1)));
  Type i8 = b.getI8Type();
  if (bits == 8)
    return b.create<arith::TruncIOp>(loc, vec(n, i8), q);
  // Value j of a piece of 8 at bits [j * bits, +bits) of one word.
  SmallVector<int32_t> shifts;
  for (int j = 0; j < 8; ++j)
    shifts.push_back(int32_t(j * bits));
  Value shift = b.create<arith::ConstantOp>(
      loc, DenseIntElementsAttr::get(vec(8, b.getI32Type()), shifts));
  Type word = b.getIntegerType(8 * bits);
  SmallVector<Value> pieces;
  for (int64_t p = 0; p < n; p += 8) {
    Value packed = b.create<vector::ReductionOp>(
        loc, vector::CombiningKind::OR,
        b.create<arith::ShLIOp>(loc, n == 8 ? q : slice(q, p, 8), shift));
    if (bits < 4)
      packed = b.create<arith::TruncIOp>(loc, word, packed);
    pieces.push_back(b.create<vector::BitCastOp>(
        loc, vec(bits, i8),
        b.create<vector::BroadcastOp>(loc, vec(1, word), packed)));
  }
  return concat(pieces);
}

Value ItemEmitter::toStorage(Value values) {
  const int64_t n = count(values);
  const int64_t bytes = spec.storage.getIntOrFloatBitWidth() / 8;
  Value stored = values;
  if (spec.storage.isBF16())
    stored = roundToBf16(values);
  else if (spec.storage.isF16())
    stored = b.create<arith::TruncFOp>(loc, vec(n, spec.storage), values);
  return b.create<vector::BitCastOp>(loc, vec(n * bytes, b.getI8Type()),
                                     stored);
}

void ItemEmitter::save(bool value, Value layer, Value item, Value inRange) {
  const int64_t n = spec.valuesPerItem(value), width = spec.width();
  const MatrixLayout k = matrixLayout(spec, false),
                     m = matrixLayout(spec, value);
  const int64_t layerBytes = k.bytes + matrixLayout(spec, true).bytes;
  const int64_t kOffset = value ? k.bytes : 0;
  // Items are numbered token (or token block), piece of the row, then the
  // part of a per-channel group's tokens the item scans.
  const int64_t parts = spec.groupLanes(value);
  Value part = rem(item, parts);
  Value rest = div(item, parts);
  Value row = div(rest, width / n); // The token, or the token block.
  Value channel = mul(rem(rest, width / n), n);
  Value base = matrixOffset(value, layer);

  if (!m.bits) {
    const int64_t bytes = spec.storage.getIntOrFloatBitWidth() / 8;
    Value offset = add(base, mul(add(mul(row, width), channel), bytes));
    int64_t align =
        alignmentOf({layerBytes, kOffset, bytes * width, bytes * n});
    // Raw bf16 is a copy.
    Value encoded =
        spec.storage.isBF16() && !spec.hadamard()
            ? loadBytes(cache(value), mul(destination(layer, row, channel), 2),
                        2 * n, 16)
            : toStorage(gather(value, layer, row, channel, n));
    ifThen(inRange, [&] { storeBytes(payload(), offset, encoded, align); });
    return;
  }

  // Packed values: row-major, `bits` per value, after the parameters.
  auto packedOffset = [&](Value token, Value at) {
    return add(add(base, index(m.paramBytes)),
               div(mul(add(mul(token, width), at), m.bits), 8));
  };
  const int64_t packedAlign = alignmentOf(
      {layerBytes, kOffset, m.paramBytes, width * m.bits / 8, n * m.bits / 8});

  if (m.tokenAxis) {
    // Groups of m.size channels of one token: within a piece, or across the
    // aligned lanes that hold a group's pieces. The item's P pieces of
    // n / P values lie `apart` values apart in one head row (P = 1: one
    // run of n values), so a row's lanes shuffle in fewer butterfly stages.
    const int64_t P = spec.rowPieces(value), run = n / P;
    const int64_t apart = spec.headDim / P;
    if (P > 1) {
      Value inRow = rem(rest, width / n); // Items of a row: heads x R.
      const int64_t lanes = spec.headDim / n;
      channel =
          add(mul(div(inRow, lanes), spec.headDim), mul(rem(inRow, lanes), 8));
    }
    SmallVector<Value> loaded;
    for (int64_t p = 0; p < P; ++p)
      loaded.push_back(
          loadCache(value, layer, row, add(channel, index(p * apart)), run));
    Value x = transformed(concat(loaded), channel);
    const int64_t inItem = std::min(m.size, run);
    Value lo = reduce(x, inItem, Combine::Min);
    Value hi = reduce(x, inItem, Combine::Max);
    if (m.size > run) {
      lo = laneReduce(lo, m.size / run, Combine::Min);
      hi = laneReduce(hi, m.size / run, Combine::Max);
    }
    QuantParams params = quantParams(lo, hi, m.bits);
    SmallVector<int64_t> ofValue; // Each value's group in the item.
    for (int64_t j = 0; j < n; ++j)
      ofValue.push_back(j / inItem);
    auto perValue = [&](Value v) {
      return b.create<vector::ShuffleOp>(loc, v, v, ofValue);
    };
    Value packed =
        quantize(x, perValue(params.minimum), perValue(params.inverse), m.bits);
    Value words = b.create<vector::BitCastOp>(
        loc, vec(4 * count(params.words), b.getI8Type()), params.words);
    // Per piece: run * bits / 8 packed bytes, run / inItem groups' words.
    const int64_t packedBytes = run * m.bits / 8, wordBytes = 4 * run / inItem;
    const int64_t pieceAlign =
        alignmentOf({layerBytes, kOffset, m.paramBytes, width * m.bits / 8,
                     packedBytes, P > 1 ? apart * m.bits / 8 : 0});
    const int64_t paramAlign =
        alignmentOf({layerBytes, kOffset, 4 * m.perRow, wordBytes,
                     P > 1 ? 4 * (apart / m.size) : 0});
    ifThen(inRange, [&] {
      for (int64_t p = 0; p < P; ++p) {
        Value at = add(channel, index(p * apart));
        storeBytes(payload(), packedOffset(row, at),
                   slice(packed, p * packedBytes, packedBytes), pieceAlign);
        Value group = add(mul(row, m.perRow), div(at, m.size));
        auto storeWords = [&] {
          storeBytes(payload(), add(base, mul(group, 4)),
                     slice(words, p * wordBytes, wordBytes), paramAlign);
        };
        // A group across lanes: its first lane stores the parameters.
        if (m.size <= run)
          storeWords();
        else
          ifThen(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                         rem(channel, m.size), index(0)),
                 storeWords);
      }
    });
    return;
  }

  // Groups of m.size tokens of one channel: the item's n channels over its
  // part of the group's tokens (all of them in the host form), `unroll`
  // tokens' loads at a time before their use; the group's lanes combine
  // their extremes through gpu.shuffle. A part of at most heldTokens (8
  // unless kvc-lower-kernels' held-tokens says otherwise: a Hadamard
  // group's lanes, groups of 8) is one batch, loaded and transformed once
  // and held for the encoding; a longer one is scanned twice in scf.for
  // loops (extremes, then values), scanLoads tokens' loads at a time at
  // most (kvc-lower-kernels' scan-loads). Lanes past the chunk's last token
  // rescan that token, so all lanes run every shuffle.
  const int64_t S = m.size, share = S / parts;
  const int64_t unroll =
      share <= spec.heldTokens ? share : inFlight(share, spec.scanLoads);
  Value first = add(mul(row, S), mul(part, share));
  auto tokenAt = [&](Value i) -> Value {
    return b.create<arith::MinUIOp>(loc, add(first, i), index(spec.tokens - 1));
  };
  // The transformed values of tokens start .. start + unroll - 1 of the
  // part, every load issued before the first transform.
  auto loadBatch = [&](Value start) {
    SmallVector<Value> xs;
    for (int64_t u = 0; u < unroll; ++u)
      xs.push_back(
          loadCache(value, layer, tokenAt(add(start, index(u))), channel, n));
    for (Value &x : xs)
      x = transformed(x, channel, parts);
    return xs;
  };
  auto extremes = [&](ArrayRef<Value> xs, Value &lo, Value &hi) {
    for (Value x : xs) {
      lo = b.create<arith::MinNumFOp>(loc, lo, x);
      hi = b.create<arith::MaxNumFOp>(loc, hi, x);
    }
  };
  VectorType f32 = vec(n, b.getF32Type());
  Value lo = splat(f32, b.getF32FloatAttr(INFINITY));
  Value hi = splat(f32, b.getF32FloatAttr(-INFINITY));
  SmallVector<Value> held; // The one batch, when the part is one.
  if (share == unroll) {
    held = loadBatch(index(0));
    extremes(held, lo, hi);
  } else {
    auto scan = b.create<scf::ForOp>(loc, index(0), index(share), index(unroll),
                                     ValueRange{lo, hi});
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(scan.getBody());
    Value scanLo = scan.getRegionIterArgs()[0];
    Value scanHi = scan.getRegionIterArgs()[1];
    extremes(loadBatch(scan.getInductionVar()), scanLo, scanHi);
    b.create<scf::YieldOp>(loc, ValueRange{scanLo, scanHi});
    b.setInsertionPointAfter(scan);
    lo = scan.getResult(0);
    hi = scan.getResult(1);
  }
  if (parts > 1) {
    lo = laneReduce(lo, parts, Combine::Min);
    hi = laneReduce(hi, parts, Combine::Max);
  }
  QuantParams params = quantParams(lo, hi, m.bits);
  Value group = add(mul(row, width), channel);
  Value words =
      b.create<vector::BitCastOp>(loc, vec(4 * n, b.getI8Type()), params.words);
  // The group's first lane stores its parameters.
  Value storesParams =
      parts == 1 ? inRange
                 : b.create<arith::AndIOp>(
                       loc, inRange,
                       b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                               part, index(0)));
  ifThen(storesParams, [&] {
    storeBytes(payload(), add(base, mul(group, 4)), words,
               alignmentOf({layerBytes, kOffset, 4 * width, 4 * n}));
  });
  auto encodeBatch = [&](Value start, ArrayRef<Value> xs) {
    for (auto [u, x] : llvm::enumerate(xs)) {
      Value i = add(start, index(int64_t(u)));
      Value packed = quantize(x, params.minimum, params.inverse, m.bits);
      Value inChunk = b.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::ult, add(first, i), index(spec.tokens));
      ifThen(b.create<arith::AndIOp>(loc, inRange, inChunk), [&] {
        storeBytes(payload(), packedOffset(tokenAt(i), channel), packed,
                   packedAlign);
      });
    }
  };
  if (share == unroll) {
    encodeBatch(index(0), held);
    return;
  }
  auto encode =
      b.create<scf::ForOp>(loc, index(0), index(share), index(unroll));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(encode.getBody()->getTerminator());
  encodeBatch(encode.getInductionVar(), loadBatch(encode.getInductionVar()));
}
