//===- KernelSpec.cpp - What a generated kernel is specialized on ---------===//
//
// A KernelSpec is a kernel's compile-time constants (kind, model dims, codec,
// block size, dtypes, launch shape), read from a kvc.kernel and its module's
// model, and what follows from them: items per thread, payload bytes, the
// symbol name and the attribute the bundle's kernel table is built from.
//
//===----------------------------------------------------------------------===//

#include "KernelEmitter.h"

#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Model/RmsNorm.h"

#include <numeric>

using namespace mlir;
using namespace kvc::compiler;
using namespace kvc::compiler::detail;

MatrixLayout kvc::compiler::detail::matrixLayout(const KernelSpec &spec,
                                                 bool value) {
  MatrixLayout layout;
  layout.bits = spec.bits();
  const int64_t width = spec.width();
  if (!layout.bits) {
    layout.bytes =
        spec.tokens * width * int64_t(spec.storage.getIntOrFloatBitWidth() / 8);
    return layout;
  }
  QuantAxis axis = value ? spec.codec.getValueAxis() : spec.codec.getKeyAxis();
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

bool KernelSpec::hadamard() const {
  return codec && codec.getTransform() == Transform::hadamard;
}

int64_t KernelSpec::bits() const {
  return codec && codec.getQuant() != Quant::none ? codec.getBits() : 0;
}

int64_t KernelSpec::valuesPerItem(bool value) const {
  // 8 values (16 bytes of the cache), whatever the codec, but in a host-form
  // save: a head row under Hadamard, whole per-token groups; in the GPU form
  // those span lanes, a per-token save item under Hadamard holding
  // rowPieces() pieces of its head row.
  if (kind != KernelKind::Save)
    return 8;
  if (!host)
    return 8 * rowPieces(value);
  const int64_t row = hadamard() ? headDim : 8;
  if (!bits())
    return row;
  MatrixLayout m = matrixLayout(*this, value);
  return m.tokenAxis ? std::lcm(row, m.size) : row;
}

int64_t KernelSpec::rowPieces(bool value) const {
  // As a Hadamard restore's thread (itemsPerThread), a per-token save item
  // under Hadamard holds several pieces of one head row, fewer lanes per
  // row leaving fewer butterfly stages to shuffles: up to 8 (8 loads of 16
  // bytes in flight), few enough that each of its per-token groups lies on
  // aligned lanes (of the row's head_dim / 8 / P) at one of its pieces.
  if (host || kind != KernelKind::Save || !bits() || !hadamard())
    return 1;
  MatrixLayout m = matrixLayout(*this, value);
  if (!m.tokenAxis || m.size > headDim)
    return 1;
  return std::min({int64_t(8), headDim / 8, headDim / m.size});
}

int64_t KernelSpec::tokensPerItem(bool value) const {
  // A save item of a per-channel layout covers its groups' tokens.
  if (kind != KernelKind::Save || !bits())
    return 1;
  MatrixLayout m = matrixLayout(*this, value);
  return m.tokenAxis ? 1 : m.size;
}

int64_t KernelSpec::groupLanes(bool value) const {
  // Under Hadamard the GPU form splits a per-channel group's tokens among
  // aligned lanes (at least 8 tokens each), which combine their extremes
  // with shuffles: a lane's scans are shuffle-bound there, and more lanes
  // hide that (an H100 saves int8 with Hadamard 20% faster at 1024 tokens);
  // memory-bound scans without it run faster unsplit (25%). A head row's
  // lanes times the group's stay within a warp. kvc-lower-kernels'
  // group-lanes option overrides the choice.
  if (host || kind != KernelKind::Save || !bits())
    return 1;
  MatrixLayout m = matrixLayout(*this, value);
  if (m.tokenAxis)
    return 1;
  if (groupLanesOption)
    return groupLanesOption;
  if (!hadamard())
    return 1;
  const int64_t rowLanes = headDim / 8;
  int64_t lanes = 1;
  while (m.size % (2 * lanes) == 0 && m.size / (2 * lanes) >= 8 &&
         rowLanes * 2 * lanes <= 32)
    lanes *= 2;
  return lanes;
}

int64_t KernelSpec::itemsOf(bool value) const {
  return ceilDiv(tokens, tokensPerItem(value)) *
         (width() / valuesPerItem(value)) * groupLanes(value);
}

int64_t KernelSpec::itemsPerThread() const {
  // A save item reads 16 bytes of the cache or more.
  if (kind == KernelKind::Save)
    return 1;
  // A quantized item reads bits() bytes of packed values for the 16 bytes
  // it writes: enough items that a thread's packed loads add up to 16 bytes,
  // but at most restoreItems. Each item's values and its channels'
  // parameters stay in registers until its store: int2's 8 items took 106
  // registers (127 under Hadamard), leaving an H100 two blocks per SM, and
  // ran at 55-75% of the copy where int4's 4 (56 and 48 registers) ran at
  // 79-92% (docs/kernels.md, "Cost per value").
  const int64_t packed =
      bits() ? std::min<int64_t>(restoreItems, 16 / bits()) : 1;
  if (!hadamard())
    return packed;
  // Under Hadamard a thread's items are pieces of one head row: the whole
  // row in the host form, which has no lanes to share it with.
  const int64_t pieces = headDim / 8;
  return host ? pieces : std::min(packed, pieces);
}

int64_t KernelSpec::rowLanes() const {
  // Fewer lanes per head row leave fewer butterfly stages to shuffles: a
  // stage across lanes costs a shuffle and an FMA per value, one within a
  // thread an add or a subtract.
  if (!hadamard() || kind != KernelKind::Restore)
    return 0;
  return headDim / 8 / itemsPerThread();
}

int64_t KernelSpec::payloadBytes() const {
  if (kind == KernelKind::RmsNorm)
    return layers * tokens * hidden *
           int64_t(storage.getIntOrFloatBitWidth() / 8);
  // rope_scatter reads unquantized f32 matrices.
  return layers *
         (matrixLayout(*this, false).bytes + matrixLayout(*this, true).bytes);
}

std::string KernelSpec::symbolName() const {
  std::string name =
      std::string("kvc_") + kvc::bundleKernelKindName(kind) + "_";
  if (kind == KernelKind::RmsNorm) {
    llvm::raw_string_ostream os(name);
    os << storage << (host ? "_host" : "") << "_t" << tokens << "_l" << layers
       << "_d" << hidden;
    return name;
  }
  if (bits()) {
    // The quantization's registry name: codes of one width (int8, fp8)
    // decode differently, so their kernels must not share a symbol.
    auto axis = [](QuantAxis a) { return a == QuantAxis::token ? "t" : "c"; };
    name += std::string(codec.getQuantStage()->name) + "_k" +
            axis(codec.getKeyAxis()) + "_v" +
            axis(codec.getValueAxis()) + "_g" +
            std::to_string(codec.getGroup()) + "_";
  } else if (kind != KernelKind::RopeScatter) {
    std::string type;
    llvm::raw_string_ostream os(type);
    os << storage;
    name += "raw_" + type + "_";
  }
  if (hadamard())
    name += host ? "had_host_" : "had_";
  if (groupLanesOption)
    name += "gl" + std::to_string(groupLanesOption) + "_";
  if (heldTokens != kDefaultHeldTokens)
    name += "ht" + std::to_string(heldTokens) + "_";
  if (scanLoads != kDefaultScanLoads)
    name += "sl" + std::to_string(scanLoads) + "_";
  if (restoreItems != kDefaultRestoreItems)
    name += "ri" + std::to_string(restoreItems) + "_";
  return name + "t" + std::to_string(tokens) + "_l" + std::to_string(layers) +
         "_h" + std::to_string(kvHeads) + "x" + std::to_string(headDim) + "_b" +
         std::to_string(blockSize);
}

DictionaryAttr KernelSpec::toAttr(MLIRContext *context) const {
  Builder b(context);
  SmallVector<NamedAttribute> fields = {
      b.getNamedAttr("kind", b.getStringAttr(kvc::bundleKernelKindName(kind))),
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
  if (groupLanesOption)
    fields.push_back(
        b.getNamedAttr("group_lanes", b.getI64IntegerAttr(groupLanesOption)));
  if (heldTokens != kDefaultHeldTokens)
    fields.push_back(
        b.getNamedAttr("held_tokens", b.getI64IntegerAttr(heldTokens)));
  if (restoreItems != kDefaultRestoreItems)
    fields.push_back(
        b.getNamedAttr("restore_items", b.getI64IntegerAttr(restoreItems)));
  if (scanLoads != kDefaultScanLoads)
    fields.push_back(
        b.getNamedAttr("scan_loads", b.getI64IntegerAttr(scanLoads)));
  return b.getDictionaryAttr(fields);
}

FailureOr<KernelSpec> KernelSpec::fromAttr(DictionaryAttr attr) {
  KernelSpec spec;
  auto kind = attr.getAs<StringAttr>("kind");
  std::optional<KernelKind> parsed =
      kind ? kvc::parseBundleKernelKind(kind.getValue()) : std::nullopt;
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
  if (attr.contains("group_lanes")) {
    auto lanes = attr.getAs<IntegerAttr>("group_lanes");
    if (!lanes || lanes.getInt() < 1)
      return failure();
    spec.groupLanesOption = lanes.getInt();
  }
  if (attr.contains("held_tokens")) {
    auto held = attr.getAs<IntegerAttr>("held_tokens");
    if (!held || held.getInt() < 1)
      return failure();
    spec.heldTokens = held.getInt();
  }
  if (attr.contains("restore_items")) {
    auto items = attr.getAs<IntegerAttr>("restore_items");
    if (!items || !llvm::isPowerOf2_64(items.getInt()) || items.getInt() > 8)
      return failure();
    spec.restoreItems = items.getInt();
  }
  if (attr.contains("scan_loads")) {
    auto loads = attr.getAs<IntegerAttr>("scan_loads");
    if (!loads || loads.getInt() < 1 || loads.getInt() > 8)
      return failure();
    spec.scanLoads = loads.getInt();
  }
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
  // gather [transform] [quant] of KV, yielding the encoded chunk. A save's
  // hidden states are the prefill's activations, not rows of the paged
  // cache: the runtime encodes them on the host.
  if (auto gather = dyn_cast<GatherOp>(steps.front())) {
    if (gather.getResult().getType().getForm() != Form::kv ||
        !kernel.getInputs().empty() || kernel.getNumResults() != 1 ||
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
  if (llvm::all_of(chain, [](Operation *op) {
        return isa<DequantOp, UntransformOp>(op);
      }))
    return KernelKind::Restore;
  return std::nullopt;
}

FailureOr<KernelSpec> KernelSpec::get(KernelOp kernel, ModelAttr model,
                                      const Options &options) {
  const int64_t blockSize = options.blockSize, threads = options.threads;
  const int64_t groupLanes = options.groupLanes;
  const bool host = options.host;
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
  if (groupLanes < 0)
    return fail("group-lanes " + Twine(groupLanes) + " is negative");
  if (options.heldTokens < 1 || options.heldTokens > 16)
    return fail("held-tokens " + Twine(options.heldTokens) +
                " is not between 1 and 16 (a lane holds at most 128 values)");
  if (options.restoreItems < 1 || options.restoreItems > 8 ||
      !llvm::isPowerOf2_64(options.restoreItems))
    return fail("restore-items " + Twine(options.restoreItems) +
                " is not 1, 2, 4 or 8");
  if (options.scanLoads < 1 || options.scanLoads > 8)
    return fail("scan-loads " + Twine(options.scanLoads) +
                " is not between 1 and 8");
  if (*kind == KernelKind::RopeScatter) {
    // The GEMM before the kernel writes f32, whatever the hidden states'
    // storage.
    spec.storage = Float32Type::get(kernel.getContext());
    spec.codec = nullptr;
  }
  // A chunk no generated form covers leaves the options nothing to shape.
  if (!spec.unsupported().empty() || *kind == KernelKind::RopeScatter)
    return spec;
  if (!host && threads % 32) {
    if (spec.hadamard())
      return fail("Hadamard across a warp's lanes needs whole warps per "
                  "block (threads " +
                  Twine(threads) + ")");
    for (bool value : {false, true})
      if (*kind == KernelKind::Save && spec.bits() &&
          matrixLayout(spec, value).tokenAxis)
        return fail("per-token groups across a warp's lanes need whole "
                    "warps per block (threads " +
                    Twine(threads) + ")");
  }
  // The option caps a GPU-form quantized restore thread's items; a spec
  // records it where it changes them.
  if (!host && *kind == KernelKind::Restore && spec.bits()) {
    const int64_t packed = 16 / spec.bits();
    if (std::min(packed, options.restoreItems) !=
        std::min(packed, kDefaultRestoreItems))
      spec.restoreItems = options.restoreItems;
  }
  // The options split and hold the GPU form's per-channel groups of a
  // save; the host form's items hold whole groups.
  if (host || *kind != KernelKind::Save)
    return spec;
  for (bool value : {false, true}) {
    MatrixLayout layout = matrixLayout(spec, value);
    if (!layout.bits || layout.tokenAxis)
      continue;
    spec.heldTokens = options.heldTokens;
    spec.scanLoads = options.scanLoads;
    if (!groupLanes)
      continue;
    const int64_t rowLanes = spec.hadamard() ? spec.headDim / 8 : 1;
    if (!llvm::isPowerOf2_64(groupLanes) || layout.size % groupLanes ||
        rowLanes * groupLanes > 32 || threads % 32)
      return fail("per-channel groups of " + Twine(layout.size) +
                  " tokens split among " + Twine(groupLanes) +
                  " lanes need a power of two dividing the group, at most " +
                  Twine(32 / rowLanes) +
                  " lanes a group here, and whole warps per block");
    spec.groupLanesOption = groupLanes;
  }
  return spec;
}

std::string KernelSpec::unsupported() const {
  std::string why;
  llvm::raw_string_ostream os(why);
  if (kind == KernelKind::RopeScatter) {
    // RoPE rotates 8-channel pieces within one half of a head, or a whole
    // head of 8.
    if (headDim % 16 && headDim != 8)
      os << "RoPE over head_dim " << headDim << " needs 8 or a multiple of 16";
    return why;
  }
  const kvc::CodecStageInfo *quant = codec ? codec.getQuantStage() : nullptr;
  if (codec && codec.getLossless() != Lossless::none)
    os << "its input still carries a lossless coder (decompress on the host "
          "first)";
  else if (quant && !(kind == KernelKind::Save ? quant->deviceEncode
                                                 : quant->deviceDecode))
    os << quant->name << " is " << (kind == KernelKind::Save ? "en" : "de")
       << "coded on the host (no generated kernel)";
  else if (!storage.isBF16() && !storage.isF16() && !storage.isF32())
    os << "values are stored as neither bf16, f16 nor f32";
  else if (width() % 32)
    os << "kv_heads * head_dim = " << width() << " is not a multiple of 32";
  // A head row is whole 8-value pieces.
  else if (hadamard() && (!llvm::isPowerOf2_64(headDim) || headDim < 8))
    os << "Hadamard over head_dim " << headDim
       << " needs a power of two of at least 8";
  else if (hadamard() && !host && headDim > 256)
    os << "Hadamard across a warp's lanes needs head_dim <= 256";
  if (!why.empty() || !bits())
    return why;
  for (bool value : {false, true}) {
    MatrixLayout layout = matrixLayout(*this, value);
    if (!layout.tokenAxis)
      continue;
    if (layout.size % 8) {
      os << "per-token groups of " << layout.size
         << " values are not a multiple of 8";
      return why;
    }
    if (kind != KernelKind::Save)
      continue;
    // A save item reduces whole groups: in the GPU form across the aligned
    // lanes of one warp, in the host form within the item.
    if (width() % std::lcm(layout.size, valuesPerItem(value)))
      os << "per-token groups of " << layout.size << " values do not tile "
         << "rows of " << width();
    else if (!host && (!llvm::isPowerOf2_64(layout.size) || layout.size > 256))
      os << "per-token groups across a warp's lanes need a power of two of "
            "at most 256 values (groups of "
         << layout.size << ")";
    if (!why.empty())
      return why;
  }
  return why;
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
  // hidden = heads * head_dim, and RoPE's head_dim is 8 or a multiple of
  // 16: rows are whole 8-value pieces.
  assert(norm.hidden % 8 == 0 && "rope_scatter implies whole pieces");
  if (!norm.host && norm.threads % 32)
    return kernel.emitOpError("cannot be generated: RMSNorm across a warp's "
                              "lanes needs whole warps per block (threads ")
           << norm.threads << ")";
  return norm;
}
