//===- LowerKernels.cpp - kvc-lower-kernels: fused kernels as loop nests --===//
//
// Each kvc.kernel of a generated kind becomes a function (KernelGen.h)
// whose body is
//
//   scf.parallel %block = 0 to G {          // -> blockIdx.x
//     scf.parallel %thread = 0 to T {       // -> threadIdx.x
//       if (the block's matrix is V) { P items of V } else { P items of K }
//
// One work item writes 8 bf16 values of one cache row (one 16-byte store);
// in the host form of a Hadamard kernel, a whole head row. Each K or V
// matrix of a layer gets its own blocks, so a block runs one layout's code
// (each specialized for its own quantization axis). Within a matrix, items
// are numbered token, then piece of the row: thread t of the matrix's block
// g computes items g * T * P + s * T + t for s < P, so each load and store
// instruction of a warp touches consecutive pieces, and a thread issues the
// loads of all P items before its first store (P = 16 / bits for quantized
// payloads: 16 bytes of packed values in flight per thread). Every payload
// access loads the widest unit its statically known alignment allows, up to
// 16 bytes, through a memref of vector elements, so the NVPTX backend emits
// ld.global.v4.u32 and st.global.v4.b32.
//
// Under Hadamard the GPU form keeps one piece per thread: the butterflies
// of stages 1, 2 and 4 run within the piece, those of stages 8 .. head_dim/2
// across the lanes of the head row through gpu.shuffle xor (a head row is
// head_dim / 8 consecutive lanes of one warp). The host form, which
// kvc-kernels-to-llvm can lower, transforms the row within one item.
//
// A rope_scatter item loads its 8 f32 projections, and for K the 8 it is
// paired with (channel +- head_dim / 2) and 8 cosines and sines of the
// token's RoPE table row, then rotates and rounds as the runtime does
// (Rope.h). Restore items decode:
//
// The arithmetic is the runtime's, operation for operation:
// minimum + scale * q (the product is exact: an f16 scale times an 8-bit
// integer fits a float's mantissa), the Hadamard butterflies in the same
// order on the same operands, then the same round-to-nearest-even to bf16
// (the hardware's cvt.rn.bf16 in the GPU form, integer ops in the host
// form). So the generated code equals decodeChunkToBf16 bit for bit on
// every value that is not NaN (a NaN stays NaN; its payload is the
// hardware's): KernelJitTest runs the host form through
// buildKernelsToLLVMPipeline, kvc-kernel-bench the GPU form on a GPU.
//
//===----------------------------------------------------------------------===//

#include "kvc/Transforms/KernelGen.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/SCFToGPU/SCFToGPUPass.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Transforms/Passes.h"

#include <cmath>
#include <numeric>

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCLOWERKERNELSPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;

//===----------------------------------------------------------------------===//
// KernelSpec
//===----------------------------------------------------------------------===//

bool KernelSpec::hadamard() const {
  return codec && codec.getTransform() == Transform::hadamard;
}

int64_t KernelSpec::bits() const {
  return codec && codec.getQuant() != Quant::none ? codec.getBits() : 0;
}

int64_t KernelSpec::valuesPerItem() const {
  return hadamard() && host ? headDim : 8;
}

int64_t KernelSpec::items() const {
  return 2 * layers * tokens * (width() / valuesPerItem());
}

int64_t KernelSpec::itemsPerThread() const {
  // A quantized item reads bits() bytes of packed values for 16 bytes it
  // writes; enough items that a thread's packed loads add up to 16 bytes.
  // (A host-form Hadamard item is a whole head row already.)
  int64_t b = bits();
  return b && !(hadamard() && host) ? 16 / b : 1;
}

namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

MatrixLayout matrixLayout(const KernelSpec &spec, bool value) {
  MatrixLayout layout;
  layout.bits = spec.bits();
  const int64_t width = spec.width();
  if (!layout.bits) {
    layout.bytes = spec.tokens * width *
                   int64_t(spec.storage.getIntOrFloatBitWidth() / 8);
    return layout;
  }
  QuantAxis axis =
      value ? spec.codec.getValueAxis() : spec.codec.getKeyAxis();
  layout.tokenAxis = axis == QuantAxis::token;
  int64_t along = layout.tokenAxis ? width : spec.tokens;
  int64_t across = layout.tokenAxis ? spec.tokens : width;
  layout.size = std::min(spec.codec.getGroup(), along);
  layout.perRow = ceilDiv(width, layout.size);
  layout.paramBytes = 4 * across * ceilDiv(along, layout.size);
  layout.bytes =
      layout.paramBytes + ceilDiv(spec.tokens * width * layout.bits, 8);
  return layout;
}

/// The largest power of two up to 16 that divides every term: the alignment
/// of an address `sum(term_i * x_i)` for any integers x_i, the base being
/// 16-byte aligned.
int64_t alignmentOf(std::initializer_list<int64_t> terms) {
  int64_t align = 16;
  for (int64_t term : terms)
    while (term % align)
      align /= 2;
  return align;
}

} // namespace

int64_t KernelSpec::payloadBytes() const {
  // rope_scatter reads unquantized f32 matrices.
  return layers * (matrixLayout(*this, false).bytes +
                   matrixLayout(*this, true).bytes);
}

std::string KernelSpec::symbolName() const {
  std::string name =
      std::string("kvc_") + ::kvc::bundleKernelKindName(kind) + "_";
  if (int64_t b = bits()) {
    auto axis = [](QuantAxis a) { return a == QuantAxis::token ? "t" : "c"; };
    name += "int" + std::to_string(b) + "_k" + axis(codec.getKeyAxis()) +
            "_v" + axis(codec.getValueAxis()) + "_g" +
            std::to_string(codec.getGroup()) + "_";
  } else if (kind == KernelKind::Restore) {
    std::string type;
    llvm::raw_string_ostream os(type);
    os << storage;
    name += "raw_" + type + "_";
  }
  if (hadamard())
    name += host ? "had_host_" : "had_";
  return name + "t" + std::to_string(tokens) + "_l" + std::to_string(layers) +
         "_h" + std::to_string(kvHeads) + "x" + std::to_string(headDim) +
         "_b" + std::to_string(blockSize);
}

DictionaryAttr KernelSpec::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> fields = {
      b.getNamedAttr("kind",
                     b.getStringAttr(::kvc::bundleKernelKindName(kind))),
      b.getNamedAttr("tokens", b.getI64IntegerAttr(tokens)),
      b.getNamedAttr("layers", b.getI64IntegerAttr(layers)),
      b.getNamedAttr("kv_heads", b.getI64IntegerAttr(kvHeads)),
      b.getNamedAttr("head_dim", b.getI64IntegerAttr(headDim)),
      b.getNamedAttr("block_size", b.getI64IntegerAttr(blockSize)),
      b.getNamedAttr("threads", b.getI64IntegerAttr(threads)),
      b.getNamedAttr("storage", TypeAttr::get(storage))};
  if (codec)
    fields.push_back(b.getNamedAttr("codec", codec));
  if (host)
    fields.push_back(b.getNamedAttr("host", b.getUnitAttr()));
  return b.getDictionaryAttr(fields);
}

FailureOr<KernelSpec> KernelSpec::fromAttr(DictionaryAttr attr) {
  KernelSpec spec;
  auto kind = attr.getAs<StringAttr>("kind");
  std::optional<KernelKind> parsed =
      kind ? ::kvc::parseBundleKernelKind(kind.getValue()) : std::nullopt;
  if (!parsed)
    return failure();
  spec.kind = *parsed;
  for (auto [name, field] :
       {std::pair<StringRef, int64_t *>{"tokens", &spec.tokens},
        {"layers", &spec.layers},
        {"kv_heads", &spec.kvHeads},
        {"head_dim", &spec.headDim},
        {"block_size", &spec.blockSize},
        {"threads", &spec.threads}}) {
    auto value = attr.getAs<IntegerAttr>(name);
    if (!value || value.getInt() < 1)
      return failure();
    *field = value.getInt();
  }
  auto storage = attr.getAs<TypeAttr>("storage");
  if (!storage)
    return failure();
  spec.storage = storage.getValue();
  spec.codec = attr.getAs<CodecAttr>("codec");
  if (attr.get("codec") && !spec.codec)
    return failure();
  spec.host = attr.contains("host");
  return spec;
}

std::optional<KernelKind> KernelSpec::kindOf(KernelOp kernel) {
  SmallVector<Operation *> steps;
  for (Operation &op : kernel.getBody().front())
    if (!isa<YieldOp>(op))
      steps.push_back(&op);
  if (steps.empty() || !isa<ScatterOp>(steps.back()) ||
      kernel.getInputs().size() != 1)
    return std::nullopt;
  ArrayRef<Operation *> chain = ArrayRef(steps).drop_back();
  if (chain.size() == 1 && isa<ProjectOp>(chain.front()))
    return KernelKind::RopeScatter;
  if (llvm::all_of(chain,
                   [](Operation *op) { return isa<DequantOp, UntransformOp>(op); }))
    return KernelKind::Restore;
  return std::nullopt;
}

FailureOr<KernelSpec> KernelSpec::get(KernelOp kernel, ModelAttr model,
                                      int64_t blockSize, int64_t threads,
                                      bool host) {
  std::optional<KernelKind> kind = kindOf(kernel);
  assert(kind && "not a kernel of a generated kind");
  auto chunk = cast<ChunkType>(kernel.getBody().getArgument(0).getType());
  auto fail = [&](const Twine &message) -> FailureOr<KernelSpec> {
    return kernel.emitOpError("cannot be generated: ") << message;
  };
  if (!model)
    return fail("the module has no #kvc.model (run kvc-import-model)");
  KernelSpec spec;
  spec.kind = *kind;
  spec.tokens = chunk.getTokens().getEnd() - chunk.getTokens().getBegin();
  spec.layers = chunk.getLayers().getEnd() - chunk.getLayers().getBegin();
  spec.kvHeads = model.getKvHeads();
  spec.headDim = model.getHeadDim();
  spec.blockSize = blockSize;
  spec.storage = chunk.getElementType();
  spec.codec = chunk.getCodec();
  spec.threads = threads;
  spec.host = host;
  if (blockSize <= 0 || threads <= 0 || threads > 1024)
    return fail("block size and threads per block must be positive (threads "
                "at most 1024)");
  if (*kind == KernelKind::RopeScatter) {
    // The GEMM before the kernel writes f32, whatever the hidden states'
    // storage; RoPE rotates 8-channel pieces within one half of a head.
    spec.storage = Float32Type::get(kernel.getContext());
    spec.codec = nullptr;
    if (spec.headDim % 16)
      return fail("RoPE over head_dim " + Twine(spec.headDim) +
                  " needs a multiple of 16");
    return spec;
  }
  if (chunk.getForm() != Form::kv)
    return fail("it scatters hidden states, not KV");
  if (spec.codec && spec.codec.getLossless() != Lossless::none)
    return fail("its input still carries a lossless coder (decompress on "
                "the host first)");
  if (!spec.storage.isBF16() && !spec.storage.isF16() && !spec.storage.isF32())
    return fail("values are stored as neither bf16, f16 nor f32");
  if (spec.width() % 32)
    return fail("kv_heads * head_dim = " + Twine(spec.width()) +
                " is not a multiple of 32");
  if (spec.hadamard() && !llvm::isPowerOf2_64(spec.headDim))
    return fail("Hadamard over head_dim " + Twine(spec.headDim) +
                " needs a power of two");
  if (spec.hadamard() && !host && (spec.headDim > 256 || threads % 32))
    return fail("Hadamard across a warp's lanes needs head_dim <= 256 and "
                "whole warps per block (threads " +
                Twine(threads) + ")");
  if (spec.bits()) {
    for (bool value : {false, true}) {
      MatrixLayout layout = matrixLayout(spec, value);
      if (layout.tokenAxis && layout.size % 8)
        return fail("per-token groups of " + Twine(layout.size) +
                    " values are not a multiple of 8");
    }
  }
  return spec;
}

//===----------------------------------------------------------------------===//
// Code generation
//===----------------------------------------------------------------------===//

namespace {

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

  /// Every load of item `item` of K or V (`value`) of `layer` (items of a
  /// matrix are numbered token, then piece of the row) and its arithmetic.
  Result compute(bool value, Value layer, Value item);
  /// The stores of a computed item of K or V.
  void write(bool value, const Result &result);

private:
  Value payload() const { return args[0]; }
  VectorType vec(int64_t n, Type element) {
    return VectorType::get({n}, element);
  }
  /// A vector constant of `type` whose elements are all `value`.
  Value splat(VectorType type, Attribute value) {
    return b.create<arith::ConstantOp>(loc,
                                       DenseElementsAttr::get(type, value));
  }

  /// `bytes` bytes of `memory` at byte `offset`, known to be a multiple of
  /// `align`, as vector<bytes x i8>: loads of the widest unit the alignment
  /// allows, up to 16 bytes.
  Value loadBytes(Value memory, Value offset, int64_t bytes, int64_t align);
  /// The 8 values of matrix `value` (K or V) of `layer` at (token, channel),
  /// decoded to f32.
  Value loadValues(bool value, Value layer, Value token, Value channel);
  /// vector<8xi16> bf16 bits of 8 unquantized bf16 values, as stored.
  Value loadRawBf16(bool value, Value layer, Value token, Value channel);
  Value concat(ArrayRef<Value> pieces);
  Value slice(Value vector, int64_t offset, int64_t size);
  /// The Hadamard butterflies of stages 1 .. n/2 over `row`'s values.
  Value butterflies(Value row, int64_t n);
  /// The stages 8 .. head_dim/2 of an 8-value piece held by `lane` (the
  /// piece's index in its head), exchanged with the other lanes of the head
  /// row through gpu.shuffle.
  Value laneButterflies(Value piece, Value lane);
  Value normalize(Value values);
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
  llvm::DenseMap<int64_t, Value> constants;
};

Value ItemEmitter::loadBytes(Value memory, Value offset, int64_t bytes,
                             int64_t align) {
  const int64_t unit = std::min({align, bytes, int64_t(16)});
  Type i8 = b.getI8Type(), i32 = b.getI32Type();
  Type element = unit == 16  ? Type(vec(4, i32))
                 : unit == 8 ? Type(vec(2, i32))
                             : Type(b.getIntegerType(8 * unit));
  Value size = div(b.create<memref::DimOp>(loc, memory, index(0)), unit);
  Value view = b.create<memref::ViewOp>(
      loc, MemRefType::get({ShapedType::kDynamic}, element), memory, index(0),
      ValueRange{size});
  Value first = div(offset, unit);
  SmallVector<Value> pieces;
  for (int64_t k = 0; k < bytes / unit; ++k) {
    Value loaded = b.create<memref::LoadOp>(
        loc, view, ValueRange{k ? add(first, index(k)) : first});
    if (!isa<VectorType>(element))
      loaded = b.create<vector::BroadcastOp>(loc, vec(1, element), loaded);
    pieces.push_back(
        b.create<vector::BitCastOp>(loc, vec(unit, i8), loaded));
  }
  return concat(pieces);
}

Value ItemEmitter::concat(ArrayRef<Value> pieces) {
  SmallVector<Value> level(pieces);
  while (level.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      int64_t n = cast<VectorType>(level[i].getType()).getNumElements();
      SmallVector<int64_t> mask(2 * n);
      std::iota(mask.begin(), mask.end(), 0);
      next.push_back(
          b.create<vector::ShuffleOp>(loc, level[i], level[i + 1], mask));
    }
    level = std::move(next);
  }
  return level.front();
}

Value ItemEmitter::slice(Value vector, int64_t offset, int64_t size) {
  SmallVector<int64_t> mask(size);
  std::iota(mask.begin(), mask.end(), offset);
  return b.create<vector::ShuffleOp>(loc, vector, vector, mask);
}

Value ItemEmitter::matrixOffset(bool value, Value layer) {
  MatrixLayout k = matrixLayout(spec, false), v = matrixLayout(spec, true);
  Value offset = mul(layer, k.bytes + v.bytes);
  return value ? add(offset, index(k.bytes)) : offset;
}

Value ItemEmitter::loadRawBf16(bool value, Value layer, Value token,
                               Value channel) {
  const int64_t width = spec.width();
  MatrixLayout k = matrixLayout(spec, false);
  Value element = add(mul(token, width), channel);
  Value offset = add(matrixOffset(value, layer), mul(element, 2));
  int64_t align = alignmentOf({2 * k.bytes, value ? k.bytes : 0, 2 * width,
                               2 * spec.valuesPerItem(), 16});
  Value bytes = loadBytes(payload(), offset, 16, align);
  return b.create<vector::BitCastOp>(loc, vec(8, b.getI16Type()), bytes);
}

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
                                 bytes * spec.valuesPerItem(), 8 * bytes});
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
                   spec.valuesPerItem() * m.bits / 8, m.bits});
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
  // The integers as floats, exactly: 2^23 + q has q in its mantissa bits,
  // and subtracting 2^23 is exact. An OR and an add on the GPU's full-rate
  // pipes, where uitofp takes its quarter-rate conversion unit.
  Value biased = b.create<arith::OrIOp>(
      loc, ints, splat(vec(8, i32), b.getI32IntegerAttr(0x4B000000)));
  Value q = b.create<arith::SubFOp>(
      loc, b.create<arith::BitcastOp>(loc, vec(8, f32), biased),
      splat(vec(8, f32), b.getF32FloatAttr(8388608.0f)));

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
    int64_t align = alignmentOf({layerBytes, kOffset, 4 * width,
                                 4 * spec.valuesPerItem(), 32});
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
  return b.create<arith::AddFOp>(loc, minimum,
                                 b.create<arith::MulFOp>(loc, scale, q));
}

Value ItemEmitter::butterflies(Value row, int64_t n) {
  // The runtime's butterflies (ChunkCodec.cpp, hadamard()): for each stage
  // `len`, x[j], x[j + len] = x[j] + x[j + len], x[j] - x[j + len] for the
  // j whose bit `len` is clear.
  const int64_t size = cast<VectorType>(row.getType()).getNumElements();
  for (int64_t len = 1; len < n; len *= 2) {
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

Value ItemEmitter::laneButterflies(Value piece, Value lane) {
  // Stage len >= 8 pairs piece p with piece p ^ (len / 8) of the same head
  // row, held by the lane that far away. The lane whose bit is clear holds
  // the low values and keeps low + high; the other keeps low - high, which
  // it computes as low + (-high) (the same rounding: IEEE defines a - b as
  // a + (-b)), -high being its own value with the sign bit flipped: a shuffle,
  // an xor and an add per value and stage.
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  VectorType type = vec(8, f32), words = vec(8, i32);
  for (int64_t len = 8; len < spec.headDim; len *= 2) {
    const int64_t distance = len / 8;
    Value high = b.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::ne,
        b.create<arith::AndIOp>(loc, lane, index(distance)), index(0));
    Value sign = b.create<vector::BroadcastOp>(
        loc, words,
        b.create<arith::SelectOp>(
            loc, high,
            b.create<arith::ConstantIntOp>(loc, int32_t(0x80000000), 32),
            b.create<arith::ConstantIntOp>(loc, 0, 32)));
    Value partner = splat(type, b.getF32FloatAttr(0));
    Value offset = b.create<arith::ConstantIntOp>(loc, distance, 32);
    Value width = b.create<arith::ConstantIntOp>(loc, 32, 32);
    for (int64_t j = 0; j < 8; ++j) {
      Value own = b.create<vector::ExtractOp>(loc, piece, ArrayRef<int64_t>{j});
      Value theirs = b.create<gpu::ShuffleOp>(loc, own, offset, width,
                                              gpu::ShuffleMode::XOR)
                         .getShuffleResult();
      partner = b.create<vector::InsertOp>(loc, theirs, partner,
                                           ArrayRef<int64_t>{j});
    }
    Value signed_ = b.create<arith::BitcastOp>(
        loc, type,
        b.create<arith::XOrIOp>(
            loc, b.create<arith::BitcastOp>(loc, words, piece), sign));
    piece = b.create<arith::AddFOp>(loc, partner, signed_);
  }
  return piece;
}

Value ItemEmitter::normalize(Value values) {
  // Every value of the transform times 1/sqrt(head_dim), as the runtime.
  const float norm = 1.0f / std::sqrt(float(spec.headDim));
  return b.create<arith::MulFOp>(
      loc, values,
      splat(cast<VectorType>(values.getType()), b.getF32FloatAttr(norm)));
}

Value ItemEmitter::loadProjected(bool value, Value layer, Value token,
                                 Value channel) {
  const int64_t width = spec.width(), matrix = 4 * spec.tokens * width;
  Value offset = add(add(mul(layer, 2 * matrix), index(value ? matrix : 0)),
                     mul(add(mul(token, width), channel), 4));
  int64_t align = alignmentOf({2 * matrix, matrix, 4 * width, 32});
  return b.create<vector::BitCastOp>(loc, vec(8, b.getF32Type()),
                                     loadBytes(payload(), offset, 32, align));
}

Value ItemEmitter::rope(Value own, Value layer, Value token, Value channel) {
  // applyRope (Rope.h): with h = head_dim / 2 and j < h, channel j of a head
  // becomes x[j] * cos - x[j + h] * sin and channel j + h becomes
  // x[j + h] * cos + x[j] * sin. The 8 channels lie in one half.
  const int64_t half = spec.headDim / 2;
  Value inHead = rem(channel, spec.headDim);
  Value first = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, inHead,
                                        index(half));
  Value partnerChannel = b.create<arith::SelectOp>(
      loc, first, add(channel, index(half)),
      b.create<arith::SubIOp>(loc, channel, index(half)));
  Value partner = loadProjected(false, layer, token, partnerChannel);
  // Table row first_token + token: half cosines, then half sines.
  Value row = add(args[4], token);
  Value cosOffset =
      mul(add(mul(row, spec.headDim), rem(inHead, half)), 4);
  int64_t align = alignmentOf({4 * spec.headDim, 32});
  Type f32 = b.getF32Type();
  Value cos = b.create<vector::BitCastOp>(
      loc, vec(8, f32), loadBytes(args[7], cosOffset, 32, align));
  Value sin = b.create<vector::BitCastOp>(
      loc, vec(8, f32),
      loadBytes(args[7], add(cosOffset, index(4 * half)), 32, align));
  Value ownCos = b.create<arith::MulFOp>(loc, own, cos);
  Value partnerSin = b.create<arith::MulFOp>(loc, partner, sin);
  Value low = b.create<arith::SubFOp>(loc, ownCos, partnerSin);
  Value high = b.create<arith::AddFOp>(loc, ownCos, partnerSin);
  return b.create<arith::SelectOp>(loc, first, low, high);
}

Value ItemEmitter::roundToBf16(Value values) {
  // The GPU form converts with the hardware's round-to-nearest-even
  // (cvt.rn.bf16x2.f32, one instruction per two values).
  if (!spec.host)
    return b.create<vector::BitCastOp>(
        loc, vec(8, b.getI16Type()),
        b.create<arith::TruncFOp>(loc, vec(8, b.getBF16Type()), values));
  // The host form spells floatToBf16 (Base/Half.h) out in integers: round
  // to nearest even; NaN stays quiet NaN.
  VectorType words = vec(8, b.getI32Type());
  auto word = [&](int32_t v) { return splat(words, b.getI32IntegerAttr(v)); };
  Value w = b.create<vector::BitCastOp>(loc, words, values);
  Value high = b.create<arith::ShRUIOp>(loc, w, word(16));
  Value lsb = b.create<arith::AndIOp>(loc, high, word(1));
  Value rounded = b.create<arith::ShRUIOp>(
      loc,
      b.create<arith::AddIOp>(loc, w,
                              b.create<arith::AddIOp>(loc, lsb, word(0x7FFF))),
      word(16));
  Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, values,
                                      values);
  Value quiet = b.create<arith::OrIOp>(loc, high, word(0x40));
  Value out = b.create<arith::SelectOp>(loc, nan, quiet, rounded);
  return b.create<arith::TruncIOp>(loc, vec(8, b.getI16Type()), out);
}

Value ItemEmitter::destination(Value layer, Value token, Value channel) {
  // The token's row: table[t / B] * B + t % B, in layer first_layer + layer.
  Value position = add(args[4], token);
  Value block = b.create<arith::IndexCastOp>(
      loc, b.getIndexType(),
      b.create<memref::LoadOp>(loc, args[3],
                               ValueRange{div(position, spec.blockSize)}));
  Value slot =
      add(mul(block, spec.blockSize), rem(position, spec.blockSize));
  Value row = add(b.create<arith::MulIOp>(loc, add(args[5], layer), args[6]),
                  slot);
  return add(mul(row, spec.width()), channel);
}

ItemEmitter::Result ItemEmitter::compute(bool value, Value layer, Value item) {
  const int64_t perItem = spec.valuesPerItem();
  const int64_t perRow = spec.width() / perItem;
  Value token = div(item, perRow);
  Value first = mul(rem(item, perRow), perItem);
  Result result;
  if (spec.kind == KernelKind::RopeScatter) {
    Value projected = loadProjected(value, layer, token, first);
    if (!value)
      projected = rope(projected, layer, token, first);
    result.pieces.push_back(roundToBf16(projected));
  } else if (!spec.bits() && !spec.hadamard() && spec.storage.isBF16()) {
    // Raw bf16: a 16-byte copy per item.
    result.pieces.push_back(loadRawBf16(value, layer, token, first));
  } else {
    SmallVector<Value> values;
    for (int64_t s = 0; s < perItem / 8; ++s)
      values.push_back(loadValues(value, layer, token,
                                  s ? add(first, index(8 * s)) : first));
    if (spec.hadamard() && spec.host) {
      // The host form: the whole head row in one item.
      Value rowValues = normalize(butterflies(concat(values), spec.headDim));
      for (int64_t s = 0; s < perItem / 8; ++s)
        values[s] = slice(rowValues, 8 * s, 8);
    } else if (spec.hadamard()) {
      Value lane = rem(div(first, 8), spec.headDim / 8);
      values[0] = normalize(laneButterflies(butterflies(values[0], 8), lane));
    }
    for (Value v : values)
      result.pieces.push_back(roundToBf16(v));
  }
  result.element = destination(layer, token, first);
  return result;
}

void ItemEmitter::write(bool value, const Result &result) {
  Value cache = value ? args[2] : args[1];
  Type piece = vec(8, b.getI16Type());
  Value size = div(b.create<memref::DimOp>(loc, cache, index(0)), 16);
  Value view = b.create<memref::ViewOp>(
      loc, MemRefType::get({ShapedType::kDynamic}, piece), cache, index(0),
      ValueRange{size});
  Value first = div(result.element, 8);
  for (auto [s, bits] : llvm::enumerate(result.pieces))
    b.create<memref::StoreOp>(
        loc, bits, view, ValueRange{s ? add(first, index(int64_t(s))) : first});
}

} // namespace

func::FuncOp mlir::kvc::buildKernel(OpBuilder &builder, Location loc,
                                           const KernelSpec &spec) {
  MLIRContext *ctx = builder.getContext();
  Type bytes = MemRefType::get({ShapedType::kDynamic}, builder.getI8Type());
  Type table = MemRefType::get({ShapedType::kDynamic}, builder.getI32Type());
  Type index = builder.getIndexType();
  SmallVector<Type> args = {bytes, bytes, bytes, table, index, index, index};
  if (spec.kind == KernelKind::RopeScatter)
    args.push_back(bytes); // rope_table
  auto func = builder.create<func::FuncOp>(loc, spec.symbolName(),
                                           FunctionType::get(ctx, args, {}));
  OpBuilder b = OpBuilder::atBlockBegin(func.addEntryBlock());
  ItemEmitter emitter(b, loc, spec, func);
  auto constant = [&](int64_t v) { return emitter.index(v); };
  // Each K or V matrix of a layer gets its own blocks, so a block runs the
  // code of one layout. Thread t of the matrix's block g computes items
  // g * T * P + s * T + t, s < P: each of its P loads and stores is a
  // warp's consecutive pieces, and the P items are loaded and decoded
  // before the first store, so a thread keeps P items' bytes in flight.
  // Past the matrix's last item a thread recomputes that item and does not
  // write it.
  const int64_t perThread = spec.itemsPerThread();
  const int64_t items = spec.items() / (2 * spec.layers); // per matrix
  const int64_t span = spec.threads * perThread;
  const int64_t blocksPerMatrix = ceilDiv(items, span);
  Value zero = constant(0), one = constant(1);
  auto grid = b.create<scf::ParallelOp>(
      loc, ValueRange{zero},
      ValueRange{constant(2 * spec.layers * blocksPerMatrix)}, ValueRange{one});
  b.setInsertionPoint(grid.getBody()->getTerminator());
  auto block = b.create<scf::ParallelOp>(
      loc, ValueRange{constant(0)}, ValueRange{constant(spec.threads)},
      ValueRange{constant(1)});
  b.setInsertionPoint(block.getBody()->getTerminator());
  Value blockId = grid.getInductionVars()[0];
  Value matrix = emitter.div(blockId, blocksPerMatrix);
  Value layer = emitter.div(matrix, 2);
  Value firstItem =
      emitter.add(emitter.mul(emitter.rem(blockId, blocksPerMatrix), span),
                  block.getInductionVars()[0]);
  Value isValue = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne,
                                          emitter.rem(matrix, 2), zero);
  auto ifOp = b.create<scf::IfOp>(loc, isValue, /*withElseRegion=*/true);
  for (bool value : {true, false}) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(value ? ifOp.thenBlock() : ifOp.elseBlock());
    SmallVector<std::pair<Value, ItemEmitter::Result>> computed;
    for (int64_t s = 0; s < perThread; ++s) {
      Value item =
          s ? emitter.add(firstItem, constant(s * spec.threads)) : firstItem;
      Value clamped = b.create<arith::MinUIOp>(loc, item, constant(items - 1));
      computed.emplace_back(item, emitter.compute(value, layer, clamped));
    }
    for (auto &[item, result] : computed) {
      Value inRange = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult,
                                              item, constant(items));
      auto store = b.create<scf::IfOp>(loc, inRange, /*withElseRegion=*/false);
      OpBuilder::InsertionGuard insertion(b);
      b.setInsertionPointToStart(store.thenBlock());
      emitter.write(value, result);
    }
  }
  b.setInsertionPointToEnd(&func.getBody().front());
  b.create<func::ReturnOp>(loc);
  return func;
}

//===----------------------------------------------------------------------===//
// Pipelines
//===----------------------------------------------------------------------===//

void mlir::kvc::buildKernelsToPTXPipeline(OpPassManager &pm, StringRef chip) {
  pm.addNestedPass<func::FuncOp>(createGpuMapParallelLoopsPass());
  pm.addNestedPass<func::FuncOp>(createParallelLoopToGpuPass());
  pm.addNestedPass<func::FuncOp>(createLowerAffinePass());
  // Constants move into the launch, so the kernel's parameters are the
  // function's arguments alone (bundleKernelArgNames(), in use order).
  pm.addPass(createGpuLauchSinkIndexComputationsPass());
  pm.addPass(createGpuKernelOutliningPass());
  GpuNVVMAttachTargetOptions target;
  target.chip = chip.str();
  target.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(target));
  OpPassManager &gpu = pm.nest<gpu::GPUModuleOp>();
  gpu.addPass(createConvertSCFToCFPass());
  gpu.addPass(createConvertVectorToLLVMPass());
  gpu.addPass(createConvertGpuOpsToNVVMOps());
  gpu.addPass(createCanonicalizerPass());
  gpu.addPass(createCSEPass());
  gpu.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = "isa";
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::kvc::buildKernelsToLLVMPipeline(OpPassManager &pm) {
  pm.addPass(createConvertSCFToCFPass());
  pm.addPass(createConvertVectorToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

//===----------------------------------------------------------------------===//
// kvc-lower-kernels
//===----------------------------------------------------------------------===//

namespace {

struct KVCLowerKernelsPass
    : public mlir::kvc::impl::KVCLowerKernelsPassBase<KVCLowerKernelsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto model = module->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName);
    SymbolTable symbols(module);
    OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
    WalkResult result = module.walk([&](KernelOp kernel) {
      // Other chains stay for the runtime to run step by step.
      if (!KernelSpec::kindOf(kernel))
        return WalkResult::advance();
      FailureOr<KernelSpec> spec =
          KernelSpec::get(kernel, model, blockSize, threads, host);
      if (failed(spec))
        return WalkResult::interrupt();
      std::string name = spec->symbolName();
      if (!symbols.lookup(name)) {
        func::FuncOp func = buildKernel(builder, kernel.getLoc(), *spec);
        func->setAttr(KVCDialect::kEntryAttrName,
                      spec->toAttr(builder.getContext()));
        symbols.insert(func);
      }
      kernel->setAttr(KVCDialect::kEntryAttrName,
                      FlatSymbolRefAttr::get(builder.getContext(), name));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
