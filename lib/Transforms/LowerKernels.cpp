//===- LowerKernels.cpp - kvc-lower-kernels: fused kernels as loop nests --===//
//
// Each kvc.kernel of a generated kind becomes a function (KernelGen.h)
// whose body is
//
//   scf.parallel %block = 0 to G {          // -> blockIdx.x
//     scf.parallel %thread = 0 to T {       // -> threadIdx.x
//       if (the block's matrix is V) { P items of V } else { P items of K }
//
// One work item writes (a save kernel's reads) 8 bf16 values of one cache
// row, one 16-byte access; in the host form of a Hadamard kernel, a whole
// head row (of a save kernel's per-token layout, whole groups). Each K or V
// matrix of a layer gets its own blocks, so a block runs one layout's code
// (each specialized for its own quantization axis). Within a matrix, items
// are numbered token, then piece of the row: thread t of the matrix's block
// g computes items g * T * P + s * T + t for s < P, so each load and store
// instruction of a warp touches consecutive pieces, and a thread issues the
// loads of all P items before its first store (P = 16 / bits for quantized
// restore payloads: 16 bytes of packed values in flight per thread). Every
// payload access loads the widest unit its statically known alignment allows,
// up to 16 bytes, through a memref of vector elements, so the NVPTX backend
// emits ld.global.v4.u32 and st.global.v4.b32.
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
// (Rope.h).
//
// A save item runs the other way: it loads 8 values of a cache row (one
// 16-byte load through the block table), transforms them as above, and
// encodes them into the payload, one item per thread. Per-token groups
// (a multiple of 8 channels) are reduced in the thread, then across the
// group's aligned lanes (gpu.shuffle xor, min and max); the group's first
// lane stores the scale and minimum, every lane its packed values. A
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
// Restore items decode. The arithmetic is the runtime's, operation for
// operation:
// minimum + scale * q (the product is exact: an f16 scale times an 8-bit
// integer fits a float's mantissa), the Hadamard butterflies in the same
// order on the same operands, then the same round-to-nearest-even to bf16
// (the hardware's cvt.rn.bf16 in the GPU form, integer ops in the host
// form). So the generated code equals decodeChunkToBf16 (a save kernel
// encodeChunk) bit for bit on every value that is not NaN (a NaN stays NaN;
// its payload is the hardware's): KernelJitTest runs the host form through
// buildKernelsToLLVMPipeline, kvc-kernel-bench the GPU form on a GPU.
//
//===----------------------------------------------------------------------===//

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Transforms/KernelGen.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/SCFToGPU/SCFToGPUPass.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
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

bool KernelSpec::hadamard() const {
  return codec && codec.getTransform() == Transform::hadamard;
}

int64_t KernelSpec::bits() const {
  return codec && codec.getQuant() != Quant::none ? codec.getBits() : 0;
}

int64_t KernelSpec::valuesPerItem(bool value) const {
  // The GPU form: 8 values (16 bytes of the cache), whatever the codec;
  // Hadamard rows and per-token groups wider than that span lanes.
  if (!host)
    return 8;
  const int64_t row = hadamard() ? headDim : 8;
  if (kind != KernelKind::Save || !bits())
    return row;
  // A save item holds whole groups: their extremes are reduced in it.
  MatrixLayout m = matrixLayout(*this, value);
  return m.tokenAxis ? std::lcm(row, m.size) : row;
}

int64_t KernelSpec::tokensPerItem(bool value) const {
  // A save item of a per-channel layout covers its groups' tokens.
  if (kind != KernelKind::Save || !bits())
    return 1;
  MatrixLayout m = matrixLayout(*this, value);
  return m.tokenAxis ? 1 : m.size;
}

int64_t KernelSpec::itemsOf(bool value) const {
  return ceilDiv(tokens, tokensPerItem(value)) *
         (width() / valuesPerItem(value));
}

int64_t KernelSpec::itemsPerThread() const {
  // A quantized item reads bits() bytes of packed values for 16 bytes it
  // writes; enough items that a thread's packed loads add up to 16 bytes.
  // (A host-form Hadamard item is a whole head row already; a save item
  // reads 16 bytes of the cache or more.)
  int64_t b = bits();
  return b && kind != KernelKind::Save && !(hadamard() && host) ? 16 / b : 1;
}

int64_t KernelSpec::payloadBytes() const {
  if (kind == KernelKind::RmsNorm)
    return layers * tokens * hidden *
           int64_t(storage.getIntOrFloatBitWidth() / 8);
  // rope_scatter reads unquantized f32 matrices.
  return layers * (matrixLayout(*this, false).bytes +
                   matrixLayout(*this, true).bytes);
}

std::string KernelSpec::symbolName() const {
  std::string name =
      std::string("kvc_") + ::kvc::bundleKernelKindName(kind) + "_";
  if (kind == KernelKind::RmsNorm) {
    llvm::raw_string_ostream os(name);
    os << storage << (host ? "_host" : "") << "_t" << tokens << "_l" << layers
       << "_d" << hidden;
    return name;
  }
  if (int64_t b = bits()) {
    auto axis = [](QuantAxis a) { return a == QuantAxis::token ? "t" : "c"; };
    name += "int" + std::to_string(b) + "_k" + axis(codec.getKeyAxis()) +
            "_v" + axis(codec.getValueAxis()) + "_g" +
            std::to_string(codec.getGroup()) + "_";
  } else if (kind != KernelKind::RopeScatter) {
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
  if (kind == KernelKind::RmsNorm) {
    fields.push_back(b.getNamedAttr("hidden", b.getI64IntegerAttr(hidden)));
    fields.push_back(b.getNamedAttr("eps", b.getF64FloatAttr(eps)));
  }
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
  if (spec.kind == KernelKind::RmsNorm) {
    auto hidden = attr.getAs<IntegerAttr>("hidden");
    auto eps = attr.getAs<FloatAttr>("eps");
    if (!hidden || hidden.getInt() < 8 || !eps)
      return failure();
    spec.hidden = hidden.getInt();
    spec.eps = eps.getValueAsDouble();
  }
  return spec;
}

std::optional<KernelKind> KernelSpec::kindOf(KernelOp kernel) {
  SmallVector<Operation *> steps;
  for (Operation &op : kernel.getBody().front())
    if (!isa<YieldOp>(op))
      steps.push_back(&op);
  if (steps.empty())
    return std::nullopt;
  // gather [transform] [quant], yielding the encoded chunk.
  if (isa<GatherOp>(steps.front())) {
    if (!kernel.getInputs().empty() || kernel.getNumResults() != 1 ||
        kernel.getBody().front().getTerminator()->getOperand(0) !=
            steps.back()->getResult(0) ||
        !llvm::all_of(ArrayRef(steps).drop_front(), [](Operation *op) {
          return isa<TransformOp, QuantOp>(op);
        }))
      return std::nullopt;
    return KernelKind::Save;
  }
  if (!isa<ScatterOp>(steps.back()) || kernel.getInputs().size() != 1)
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
  // The chunk a save kernel encodes is its result; the others' their input.
  auto chunk = cast<ChunkType>(*kind == KernelKind::Save
                                   ? kernel.getResult(0).getType()
                                   : kernel.getBody().getArgument(0).getType());
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
    return fail(*kind == KernelKind::Save
                    ? "it gathers hidden states, not KV"
                    : "it scatters hidden states, not KV");
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
      if (!layout.tokenAxis)
        continue;
      if (layout.size % 8)
        return fail("per-token groups of " + Twine(layout.size) +
                    " values are not a multiple of 8");
      if (*kind != KernelKind::Save)
        continue;
      // A save item reduces whole groups: in the GPU form across the
      // aligned lanes of one warp, in the host form within the item.
      if (spec.width() % std::lcm(layout.size, spec.valuesPerItem(value)))
        return fail("per-token groups of " + Twine(layout.size) +
                    " values do not tile rows of " + Twine(spec.width()));
      if (!host && (!llvm::isPowerOf2_64(layout.size) || layout.size > 256 ||
                    threads % 32))
        return fail("per-token groups across a warp's lanes need a power of "
                    "two of at most 256 values and whole warps per block "
                    "(groups of " +
                    Twine(layout.size) + ", threads " + Twine(threads) + ")");
    }
  }
  return spec;
}

FailureOr<KernelSpec> KernelSpec::prologue(KernelOp kernel, ModelAttr model,
                                           const KernelSpec &spec) {
  assert(spec.kind == KernelKind::RopeScatter && "not a projection's kernel");
  KernelSpec norm = spec;
  norm.kind = KernelKind::RmsNorm;
  norm.storage = cast<ChunkType>(kernel.getBody().getArgument(0).getType())
                     .getElementType();
  norm.hidden = model.getHidden();
  norm.eps = model.getRmsNormEps().convertToDouble();
  // hidden = heads * head_dim, and RoPE's head_dim is a multiple of 16:
  // rows are whole 16-byte pieces.
  assert(norm.hidden % 8 == 0 && "rope_scatter implies whole pieces");
  if (!norm.host && norm.threads % 32)
    return kernel.emitOpError("cannot be generated: RMSNorm across a warp's "
                              "lanes needs whole warps per block (threads ")
           << norm.threads << ")";
  return norm;
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

  /// Builds `body` where `condition` holds.
  void ifThen(Value condition, function_ref<void()> body);

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
  /// The Hadamard butterflies of stages 1 .. n/2 over `row`'s values.
  Value butterflies(Value row, int64_t n);
  /// The stages 8 .. head_dim/2 of an 8-value piece held by `lane` (the
  /// piece's index in its head), exchanged with the other lanes of the head
  /// row through gpu.shuffle.
  Value laneButterflies(Value piece, Value lane);
  Value normalize(Value values);
  /// The orthonormal Hadamard transform, in the spec's form, of `values`
  /// starting at `channel`: whole head rows (host form) or one 8-value piece
  /// whose head row spans its neighbouring lanes (GPU form).
  Value hadamard(Value values, Value channel);
  /// save: `n` values of K or V of `layer` at (token, channel) of the
  /// cache, as f32, transformed when the codec rotates.
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
  /// vector<1> `x` reduced across groups of `lanes` aligned lanes with
  /// gpu.shuffle xor 1, 2, 4, ...: adjacent pairs first, every lane ending
  /// with the same bits.
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
  llvm::DenseMap<int64_t, Value> constants;
};

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
                               2 * spec.valuesPerItem(value), 16});
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

Value ItemEmitter::hadamard(Value values, Value channel) {
  if (spec.host)
    return normalize(butterflies(values, spec.headDim));
  Value lane = rem(div(channel, 8), spec.headDim / 8);
  return normalize(laneButterflies(butterflies(values, 8), lane));
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
  Value nan = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNO, values,
                                      values);
  Value quiet = b.create<arith::OrIOp>(loc, high, word(0x40));
  Value out = b.create<arith::SelectOp>(loc, nan, quiet, rounded);
  return b.create<arith::TruncIOp>(loc, vec(n, b.getI16Type()), out);
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
  const int64_t perItem = spec.valuesPerItem(value);
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
    if (spec.hadamard()) {
      Value rowValues = hadamard(concat(values), first);
      for (int64_t s = 0; s < perItem / 8; ++s)
        values[s] = perItem == 8 ? rowValues : slice(rowValues, 8 * s, 8);
    }
    for (Value v : values)
      result.pieces.push_back(roundToBf16(v));
  }
  result.element = destination(layer, token, first);
  return result;
}

void ItemEmitter::write(bool value, const Result &result) {
  SmallVector<Value> bytes;
  for (Value piece : result.pieces)
    bytes.push_back(
        b.create<vector::BitCastOp>(loc, vec(16, b.getI8Type()), piece));
  storeBytes(cache(value), mul(result.element, 2), concat(bytes), 16);
}

Value ItemEmitter::gather(bool value, Value layer, Value token, Value channel,
                          int64_t n) {
  // The cache row is 16-byte aligned and the channel a multiple of 8.
  Value element = destination(layer, token, channel);
  Value bits = b.create<vector::BitCastOp>(
      loc, vec(n, b.getBF16Type()),
      loadBytes(cache(value), mul(element, 2), 2 * n, 16));
  Value values = b.create<arith::ExtFOp>(loc, vec(n, b.getF32Type()), bits);
  return spec.hadamard() ? hadamard(values, channel) : values;
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
  Value own = b.create<vector::ExtractOp>(loc, x, ArrayRef<int64_t>{0});
  Value width = b.create<arith::ConstantIntOp>(loc, 32, 32);
  for (int64_t distance = 1; distance < lanes; distance *= 2) {
    Value offset = b.create<arith::ConstantIntOp>(loc, distance, 32);
    Value theirs =
        b.create<gpu::ShuffleOp>(loc, own, offset, width, gpu::ShuffleMode::XOR)
            .getShuffleResult();
    own = combine(how, own, theirs);
  }
  return b.create<vector::BroadcastOp>(loc, x.getType(), own);
}

void ItemEmitter::rmsNormRow(Value row, Value lane, Value inRange) {
  // RmsNorm.h's order: lane l sums the squares of pieces l, l + L, ... in
  // 8 partial sums; a lane's total; the lanes' totals pairwise.
  const int64_t h = spec.hidden, pieces = h / 8;
  const int64_t lanes = ::kvc::rmsNormLanes(h);
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
  const int64_t steps = ceilDiv(pieces, lanes);
  VectorType accType = vec(8 * held, f32);
  auto sum =
      b.create<scf::ForOp>(loc, index(0), index(steps), index(1),
                           ValueRange{splat(accType, b.getF32FloatAttr(0))});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(sum.getBody());
    SmallVector<Value> xs;
    for (int64_t j = 0; j < held; ++j)
      xs.push_back(piece(sum.getInductionVar(), j).first);
    Value x = concat(xs);
    b.create<scf::YieldOp>(loc, ValueRange{b.create<arith::AddFOp>(
                                    loc, sum.getRegionIterArgs()[0],
                                    b.create<arith::MulFOp>(loc, x, x))});
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
  // out = (x * scale) * weight, rounded to bf16.
  auto write = b.create<scf::ForOp>(loc, index(0), index(steps), index(1));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(write.getBody()->getTerminator());
  Value weightRow = mul(add(args[3], layer), h);
  for (int64_t j = 0; j < held; ++j) {
    auto [x, in] = piece(write.getInductionVar(), j);
    Value p = b.create<arith::MinUIOp>(
        loc,
        add(mul(write.getInductionVar(), lanes), spec.host ? index(j) : lane),
        index(pieces - 1));
    Value weight = b.create<vector::BitCastOp>(
        loc, vec(8, f32),
        loadBytes(args[1], mul(add(weightRow, mul(p, 8)), 4), 32,
                  alignmentOf({4 * h, 32})));
    Value out = roundToBf16(b.create<arith::MulFOp>(
        loc, b.create<arith::MulFOp>(loc, x, scales), weight));
    Value bytesOut =
        b.create<vector::BitCastOp>(loc, vec(16, b.getI8Type()), out);
    ifThen(b.create<arith::AndIOp>(loc, inRange, in), [&] {
      storeBytes(args[2], mul(add(mul(row, h), mul(p, 8)), 2), bytesOut, 16);
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
  APFloat tiny(APFloat::IEEEhalf(), APInt(16, ::kvc::kTinyQuantScale));
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
  Value row = div(item, width / n); // The token, or the token block.
  Value channel = mul(rem(item, width / n), n);
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
  auto packedOffset = [&](Value token) {
    return add(add(base, index(m.paramBytes)),
               div(mul(add(mul(token, width), channel), m.bits), 8));
  };
  const int64_t packedAlign = alignmentOf(
      {layerBytes, kOffset, m.paramBytes, width * m.bits / 8, n * m.bits / 8});

  if (m.tokenAxis) {
    // Groups of m.size channels of one token: within the item, or across
    // the m.size / 8 aligned lanes that hold a group's pieces.
    const int64_t inItem = std::min(m.size, n);
    Value x = gather(value, layer, row, channel, n);
    Value lo = reduce(x, inItem, Combine::Min);
    Value hi = reduce(x, inItem, Combine::Max);
    if (m.size > n) {
      lo = laneReduce(lo, m.size / n, Combine::Min);
      hi = laneReduce(hi, m.size / n, Combine::Max);
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
    Value group = add(mul(row, m.perRow), div(channel, m.size));
    Value paramOffset = add(base, mul(group, 4));
    Value words = b.create<vector::BitCastOp>(
        loc, vec(4 * count(params.words), b.getI8Type()), params.words);
    int64_t paramAlign =
        alignmentOf({layerBytes, kOffset, 4 * m.perRow, 4 * (n / inItem)});
    ifThen(inRange, [&] {
      storeBytes(payload(), packedOffset(row), packed, packedAlign);
      if (m.size <= n) {
        storeBytes(payload(), paramOffset, words, paramAlign);
        return;
      }
      // The group's first lane stores its parameters.
      ifThen(b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq,
                                     rem(channel, m.size), index(0)),
             [&] { storeBytes(payload(), paramOffset, words, paramAlign); });
    });
    return;
  }

  // Groups of m.size tokens of one channel: the item's n channels over the
  // token block, scanned twice (extremes, then values). Lanes past the
  // chunk's last token rescan that token, so all lanes run every shuffle.
  const int64_t S = m.size;
  Value first = mul(row, S);
  auto tokenAt = [&](Value i) -> Value {
    return b.create<arith::MinUIOp>(loc, add(first, i), index(spec.tokens - 1));
  };
  VectorType f32 = vec(n, b.getF32Type());
  auto scan = b.create<scf::ForOp>(
      loc, index(0), index(S), index(1),
      ValueRange{splat(f32, b.getF32FloatAttr(INFINITY)),
                 splat(f32, b.getF32FloatAttr(-INFINITY))});
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(scan.getBody());
    Value x = gather(value, layer, tokenAt(scan.getInductionVar()), channel, n);
    b.create<scf::YieldOp>(
        loc,
        ValueRange{
            b.create<arith::MinNumFOp>(loc, scan.getRegionIterArgs()[0], x),
            b.create<arith::MaxNumFOp>(loc, scan.getRegionIterArgs()[1], x)});
  }
  QuantParams params =
      quantParams(scan.getResult(0), scan.getResult(1), m.bits);
  Value group = add(mul(row, width), channel);
  Value words =
      b.create<vector::BitCastOp>(loc, vec(4 * n, b.getI8Type()), params.words);
  ifThen(inRange, [&] {
    storeBytes(payload(), add(base, mul(group, 4)), words,
               alignmentOf({layerBytes, kOffset, 4 * width, 4 * n}));
  });
  auto encode = b.create<scf::ForOp>(loc, index(0), index(S), index(1));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(encode.getBody()->getTerminator());
  Value i = encode.getInductionVar();
  Value token = tokenAt(i);
  Value packed = quantize(gather(value, layer, token, channel, n),
                          params.minimum, params.inverse, m.bits);
  Value inChunk = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult,
                                          add(first, i), index(spec.tokens));
  ifThen(b.create<arith::AndIOp>(loc, inRange, inChunk), [&] {
    storeBytes(payload(), packedOffset(token), packed, packedAlign);
  });
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
  if (spec.kind == KernelKind::RmsNorm)
    args = {bytes, bytes, bytes, index};
  auto func = builder.create<func::FuncOp>(loc, spec.symbolName(),
                                           FunctionType::get(ctx, args, {}));
  OpBuilder b = OpBuilder::atBlockBegin(func.addEntryBlock());
  ItemEmitter emitter(b, loc, spec, func);
  auto constant = [&](int64_t v) { return emitter.index(v); };
  // Blocks x threads; leaves the builder in the threads' body.
  auto nest = [&](int64_t blocks) -> std::pair<Value, Value> {
    auto grid = b.create<scf::ParallelOp>(loc, ValueRange{constant(0)},
                                          ValueRange{constant(blocks)},
                                          ValueRange{constant(1)});
    b.setInsertionPoint(grid.getBody()->getTerminator());
    auto block = b.create<scf::ParallelOp>(loc, ValueRange{constant(0)},
                                           ValueRange{constant(spec.threads)},
                                           ValueRange{constant(1)});
    b.setInsertionPoint(block.getBody()->getTerminator());
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
    const int64_t lanes = spec.host ? 1 : ::kvc::rmsNormLanes(spec.hidden);
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
  // before the first store, so a thread keeps P items' bytes in flight.
  // Past the matrix's last item a thread recomputes that item and does not
  // write it.
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
  Value firstItem = emitter.add(
      emitter.mul(emitter.rem(blockId, blocksPerMatrix), span), threadId);
  Value isValue = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne,
                                          emitter.rem(matrix, 2), zero);
  auto ifOp = b.create<scf::IfOp>(loc, isValue, /*withElseRegion=*/true);
  for (bool value : {true, false}) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(value ? ifOp.thenBlock() : ifOp.elseBlock());
    const int64_t items = spec.itemsOf(value);
    SmallVector<std::pair<Value, Value>> pending; // (item, clamped)
    for (int64_t s = 0; s < perThread; ++s) {
      Value item =
          s ? emitter.add(firstItem, constant(s * spec.threads)) : firstItem;
      pending.emplace_back(
          item, b.create<arith::MinUIOp>(loc, item, constant(items - 1)));
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
        emitter.ifThen(
            inRange(emitter.mul(emitter.rem(blockId, blocksPerMatrix), span)),
            work);
      continue;
    }
    SmallVector<ItemEmitter::Result> computed;
    for (auto [item, clamped] : pending)
      computed.push_back(emitter.compute(value, layer, clamped));
    for (auto [item, result] : llvm::zip(pending, computed))
      emitter.ifThen(inRange(item.first),
                     [&] { emitter.write(value, result); });
  }
  return finish();
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
  pm.addPass(createConvertMathToLLVMPass());
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
      auto generate = [&](const KernelSpec &generated) {
        std::string name = generated.symbolName();
        if (!symbols.lookup(name)) {
          func::FuncOp func = buildKernel(builder, kernel.getLoc(), generated);
          func->setAttr(KVCDialect::kEntryAttrName,
                        generated.toAttr(builder.getContext()));
          symbols.insert(func);
        }
        return FlatSymbolRefAttr::get(builder.getContext(), name);
      };
      kernel->setAttr(KVCDialect::kEntryAttrName, generate(*spec));
      if (spec->kind == KernelKind::RopeScatter) {
        // The projection's RMSNorm, before the runtime's GEMM.
        FailureOr<KernelSpec> norm = KernelSpec::prologue(kernel, model, *spec);
        if (failed(norm))
          return WalkResult::interrupt();
        kernel->setAttr(KVCDialect::kPrologueAttrName, generate(*norm));
      }
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
