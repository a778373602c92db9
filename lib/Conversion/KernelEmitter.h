//===- KernelEmitter.h - One work item of a generated kernel ----*- C++ -*-===//
//
// The pieces buildKernel (KernelGen.h) builds kernels from, shared by the
// restore side (KernelEmitter.cpp) and the save side and RMSNorm prologue
// (KernelSaveEmitter.cpp): the stored layout of a K or V matrix, and
// ItemEmitter, which emits one work item's loads, arithmetic and stores.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_TRANSFORMS_KERNELEMITTER_H
#define KVC_LIB_TRANSFORMS_KERNELEMITTER_H

#include "kvc/Support/MLIR.h"

#include "kvc/Conversion/KernelGen.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"

namespace kvc::compiler::detail {

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The byte layout of one stored K or V matrix, as the runtime's codecs
/// write it (ChunkCodec.cpp): the scale/minimum pairs of every group, then
/// the values packed row-major, low bits first.
struct MatrixLayout {
  int64_t bits = 0;       ///< 0: unquantized, stored in the storage type.
  bool tokenAxis = false; ///< Groups run along a token's channels.
  int64_t size = 0;       ///< Values per group.
  int64_t perRow = 0;     ///< Groups per token (token axis).
  int64_t paramBytes = 0;
  int64_t bytes = 0;
};

/// The layout of K (`value` false) or V of a chunk of `spec`.
MatrixLayout matrixLayout(const KernelSpec &spec, bool value);

/// How many iterations of a loop of `trips` a GPU-form lane unrolls, its
/// loads issued before their first use: the largest divisor of `trips` up
/// to `most` (by default 8 loads of 16 bytes in flight per lane).
inline int64_t inFlight(int64_t trips, int64_t most = 8) {
  for (int64_t u = std::min(trips, most); u > 1; --u)
    if (trips % u == 0)
      return u;
  return 1;
}

/// The largest power of two up to 16 that divides every term: the alignment
/// of an address `sum(term_i * x_i)` for any integers x_i, the base being
/// 16-byte aligned.
inline int64_t alignmentOf(std::initializer_list<int64_t> terms) {
  int64_t align = 16;
  for (int64_t term : terms)
    while (term % align)
      align /= 2;
  return align;
}

/// Emits one work item's code; all helpers build at `b`'s insertion point.
class ItemEmitter {
public:
  ItemEmitter(OpBuilder &b, Location loc, const KernelSpec &spec,
              func::FuncOp func)
      : b(b), loc(loc), spec(spec), args(func.getArguments()),
        entry(&func.getBody().front()) {}

  /// The index constant `v`, made once at the function's entry.
  Value index(int64_t v) {
    Value &constant = constants[v];
    if (!constant)
      constant =
          OpBuilder::atBlockBegin(entry).create<arith::ConstantIndexOp>(loc, v);
    return constant;
  }
  /// Index arithmetic at the builder's insertion point, with the trivial
  /// cases (x + 0, x * 1, 0 * c, x / 1, x % 1) folded.
  Value add(Value x, Value y) {
    if (matchPattern(y, m_Zero()))
      return x;
    if (matchPattern(x, m_Zero()))
      return y;
    return b.create<arith::AddIOp>(loc, x, y);
  }
  Value mul(Value x, int64_t c) {
    if (c == 1 || matchPattern(x, m_Zero()))
      return x;
    return b.create<arith::MulIOp>(loc, x, index(c));
  }
  Value div(Value x, int64_t c) {
    return c == 1 ? x : b.create<arith::DivUIOp>(loc, x, index(c)).getResult();
  }
  Value rem(Value x, int64_t c) {
    return c == 1 ? index(0)
                  : b.create<arith::RemUIOp>(loc, x, index(c)).getResult();
  }

  /// What one item computes: the bf16 bits of its 16-byte pieces and the
  /// cache element the first one goes to.
  struct Result {
    Value element;
    SmallVector<Value> pieces;
  };

  /// Every load of items `items` of K or V (`value`) of `layer` (items of
  /// a matrix are numbered token, then piece of the row) and their
  /// arithmetic, one result per item. Under Hadamard the items are the
  /// thread's part of one head row: the whole row (host form), or a GPU
  /// restore's pieces KernelSpec::rowLanes() apart.
  SmallVector<Result> compute(bool value, Value layer, ArrayRef<Value> items);
  /// The stores of a computed item of K or V.
  void write(bool value, const Result &result);

  /// Builds `body` where `condition` holds.
  void ifThen(Value condition, function_ref<void()> body);

  /// Reads record `chunk` of the launch's chunk table (KernelGen.h: the
  /// chunk's payload offset, first token and first layer) at the builder's
  /// insertion point: the origin of the items built after it.
  void beginChunk(Value chunk);

  /// rms_norm: normalizes row `row` of the chunk (layer, then token), the
  /// pieces `lane`, lane + L, ... of it in the GPU form, all of it in the
  /// host form; stores where `inRange` holds.
  void rmsNormRow(Value row, Value lane, Value inRange);

  /// A save kernel's item `item` of K or V (`value`) of `layer` (items of a
  /// matrix are numbered token, or a per-channel layout's token block, then
  /// piece of the row): gathers its values from the cache, encodes them and
  /// stores them in the payload where `inRange` holds. Every lane runs every
  /// shuffle, so lanes past the last item pass a clamped one.
  void save(bool value, Value layer, Value item, Value inRange);

private:
  Value payload() const { return args[0]; }
  Value blockTable() const { return args[3]; }
  Value layerRows() const { return args[5]; }
  Value ropeTable() const { return args[6]; }
  VectorType vec(int64_t n, Type element) {
    return VectorType::get({n}, element);
  }
  /// A vector constant of `type` whose elements are all `value`.
  Value splat(VectorType type, Attribute value) {
    return b.create<arith::ConstantOp>(loc,
                                       DenseElementsAttr::get(type, value));
  }

  Value cache(bool value) const { return value ? args[2] : args[1]; }
  static int64_t count(Value vector) {
    return cast<VectorType>(vector.getType()).getNumElements();
  }
  /// The widest unit, up to 16 bytes, that divides `bytes` and `align`, and
  /// `memory` viewed as a memref of elements of that size (i8 .. i32,
  /// vector<2xi32>, vector<4xi32>).
  std::tuple<int64_t, Value, Type> units(Value memory, int64_t bytes,
                                         int64_t align);
  /// `bytes` bytes of `memory` at byte `offset`, known to be a multiple of
  /// `align`, as vector<bytes x i8>: loads of the widest unit the alignment
  /// allows, up to 16 bytes.
  Value loadBytes(Value memory, Value offset, int64_t bytes, int64_t align);
  /// Stores the vector<N x i8> `bytes` likewise.
  void storeBytes(Value memory, Value offset, Value bytes, int64_t align);
  /// The 8 values of matrix `value` (K or V) of `layer` at (token, channel),
  /// decoded to f32.
  Value loadValues(bool value, Value layer, Value token, Value channel);
  /// vector<8xi16> bf16 bits of 8 unquantized bf16 values, as stored.
  Value loadRawBf16(bool value, Value layer, Value token, Value channel);
  Value concat(ArrayRef<Value> pieces);
  Value slice(Value vector, int64_t offset, int64_t size);
  /// The Hadamard butterflies over `row`'s elements `len` apart, for `len`
  /// from `first` up to (not including) `end`, in that order.
  Value butterflies(Value row, int64_t first, int64_t end);
  /// The butterflies of the head row's stages that pair values held by
  /// different lanes: `values` are pieces of 8 of one head row held by
  /// `lane` (the first piece's index in its head), the row's pieces being
  /// spread over `rowLanes` lanes that are `laneStride` lanes apart.
  Value laneButterflies(Value values, Value lane, int64_t rowLanes,
                        int64_t laneStride);
  Value normalize(Value values);
  /// The orthonormal Hadamard transform of `values`, pieces of 8 of head
  /// rows starting at `channel`: whole rows (host form), or one head row's
  /// pieces whose other pieces the neighbouring lanes hold (GPU form: one
  /// 8-value piece of a save item, a restore thread's items), a row's
  /// lanes `laneStride` lanes apart.
  Value hadamard(Value values, Value channel, int64_t laneStride = 1);
  /// save: `n` values of K or V of `layer` at (token, channel) of the
  /// cache, as f32.
  Value loadCache(bool value, Value layer, Value token, Value channel,
                  int64_t n);
  /// `values` from `channel` on, transformed when the codec rotates (GPU
  /// form: a head row's pieces `laneStride` lanes apart).
  Value transformed(Value values, Value channel, int64_t laneStride = 1);
  /// loadCache, then transformed.
  Value gather(bool value, Value layer, Value token, Value channel, int64_t n);
  /// How reduce() and laneReduce() combine two values: min and max ignore
  /// NaN as the runtime's comparisons do (so their order does not matter);
  /// sums go in the order those functions state.
  enum class Combine { Min, Max, Add };
  /// The correctly rounded square root of f32 `x`, in either form.
  Value squareRoot(Value x);
  Value combine(Combine how, Value x, Value y);
  /// Each group of `size` consecutive values (a multiple of 8) reduced: its
  /// 8-value pieces elementwise in order, then the 8 partial results as
  /// (j, j + 4), then (j, j + 2), then (0, 1) (RmsNorm.h's lane total).
  Value reduce(Value values, int64_t size, Combine how);
  /// Each element of `x` reduced across groups of `lanes` aligned lanes
  /// with gpu.shuffle xor 1, 2, 4, ...: adjacent pairs first, every lane
  /// ending with the same bits.
  Value laneReduce(Value x, int64_t lanes, Combine how);

  /// A group's quantization parameters from its extremes (vectors of one
  /// value per group), as the runtime's encoder computes them.
  struct QuantParams {
    Value minimum, inverse; ///< f32
    Value words;            ///< i32: the stored f16 scale, f16 minimum.
  };
  QuantParams quantParams(Value lo, Value hi, int64_t bits);
  /// `values` quantized against their groups' `minimum` and `inverse` (one
  /// per value) and packed, low bits first, as vector<N x i8>.
  Value quantize(Value values, Value minimum, Value inverse, int64_t bits);
  /// f32 values as the bytes of the storage type.
  Value toStorage(Value values);
  /// rope_scatter: 8 f32 projections of matrix `value` of `layer` at
  /// (token, channel).
  Value loadProjected(bool value, Value layer, Value token, Value channel);
  /// rope_scatter: K's 8 projections at (token, channel), rotated.
  Value rope(Value own, Value layer, Value token, Value channel);
  Value roundToBf16(Value values);
  /// The cache element of (token, channel) of `layer`, through the block
  /// table.
  Value destination(Value layer, Value token, Value channel);
  /// The byte offset of matrix `value` of `layer` in the payload.
  Value matrixOffset(bool value, Value layer);

  OpBuilder &b;
  Location loc;
  const KernelSpec &spec;
  ValueRange args;
  Block *entry;
  /// The current chunk's origin (beginChunk): its payload's first byte, its
  /// first token in the request and first layer in the cache.
  Value payloadOffset, firstToken, firstLayer;
  llvm::DenseMap<int64_t, Value> constants;
};

} // namespace kvc::compiler::detail

#endif // KVC_LIB_TRANSFORMS_KERNELEMITTER_H
