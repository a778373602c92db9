//===- KVCOps.cpp - Operations of the kvc dialect -------------------------===//
//
// Verifiers reject every plan that cannot run, naming the offending field or
// range. Coverage (plans, chunk-compute prefixes) is checked on a grid of the
// range boundaries, so overlaps and gaps are reported as concrete ranges.
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCOps.h"
#include "kvc/Dialect/KVC/IR/KVCVocabulary.h"
#include "kvc/Support/Hadamard.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"

#include <optional>

using namespace mlir;
using namespace kvc::compiler;

#include "kvc/Dialect/KVC/IR/KVCInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "kvc/Dialect/KVC/IR/KVCOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

ModelAttr kvc::compiler::lookupModel(Operation *op) {
  for (; op; op = op->getParentOp())
    if (auto model = op->getAttrOfType<ModelAttr>(KVCDialect::kModelAttrName))
      return model;
  return {};
}

TargetAttr kvc::compiler::lookupTarget(Operation *op) {
  for (; op; op = op->getParentOp())
    if (auto target =
            op->getAttrOfType<TargetAttr>(KVCDialect::kTargetAttrName))
      return target;
  return {};
}

namespace {

/// `a to b` for diagnostics.
std::string str(RangeAttr range) {
  return std::to_string(range.getBegin()) + " to " +
         std::to_string(range.getEnd());
}

/// Checks a token range against the model's context length and a layer
/// range against its layer count, when the enclosing module has a model.
LogicalResult verifyTokensAndLayers(Operation *op, RangeAttr tokens,
                                    RangeAttr layers) {
  ModelAttr model = lookupModel(op);
  auto emitError = [&] { return op->emitOpError(); };
  if (failed(verifyRange(emitError, "tokens", tokens,
                         model ? model.getMaxPositions() : 0,
                         "max_positions")))
    return failure();
  if (layers && failed(verifyRange(emitError, "layers", layers,
                                   model ? model.getLayers() : 0, "layers")))
    return failure();
  return success();
}

/// Checks that `tier` exists in the enclosing target, when there is one.
LogicalResult verifyTier(Operation *op, StringRef tier) {
  TargetAttr target = lookupTarget(op);
  if (!target || target.findTier(tier))
    return success();
  return op->emitOpError("names tier \"")
         << tier << "\", which target \"" << target.getName()
         << "\" does not have";
}

/// Checks that a Hadamard `codec` of `form` rows has the power-of-two blocks
/// the runtime's codec rotates, when the enclosing module has a model: KV
/// rows head by head, hidden-state rows in the largest power of two (up to
/// 256) dividing them.
LogicalResult verifyRotation(Operation *op, Form form, CodecAttr codec) {
  ModelAttr model = lookupModel(op);
  if (!model || !codec || codec.getTransform() != Transform::hadamard)
    return success();
  const int64_t width = form == Form::kv
                            ? model.getKvHeads() * model.getHeadDim()
                            : model.getHidden();
  if (kvc::hadamardRotates(toVocabulary(form), width, model.getHeadDim()))
    return success();
  if (form == Form::kv)
    return op->emitOpError("rotates KV with Hadamard over head_dim ")
           << model.getHeadDim() << ", which is not a power of two";
  return op->emitOpError("rotates hidden states with Hadamard, whose rows of ")
         << width << " values have no power-of-two blocks";
}

/// Checks a source against the model and the target.
LogicalResult verifySource(Operation *op, SourceAttr source) {
  ModelAttr model = lookupModel(op);
  if (model && source.getLayers().getEnd() > model.getLayers())
    return op->emitOpError("source layers ")
           << str(source.getLayers()) << " exceed the model's layers ("
           << model.getLayers() << ")";
  if (failed(verifyRotation(op, source.getForm(), source.getCodec())))
    return failure();
  return verifyTier(op, source.getTier());
}

Transform transformOf(CodecAttr codec) {
  return codec ? codec.getTransform() : Transform::none;
}
Quant quantOf(CodecAttr codec) { return codec ? codec.getQuant() : Quant::none; }
Lossless losslessOf(CodecAttr codec) {
  return codec ? codec.getLossless() : Lossless::none;
}

/// Checks that `chunk` is raw KV or hidden states on the device; `what`
/// names the operand in diagnostics.
LogicalResult verifyDeviceRaw(Operation *op, StringRef what, ChunkType chunk) {
  if (!chunk.isRaw())
    return op->emitOpError() << what << " is still encoded with "
                             << chunk.getCodec() << "; decode it first";
  if (chunk.getSpace() != Space::device)
    return op->emitOpError() << what
                             << " is in host memory; transfer it to the "
                                "device first";
  return success();
}

/// An axis-aligned block of tokens x layers.
struct Tile {
  int64_t t0, t1, l0, l1;
  static Tile of(RangeAttr tokens, RangeAttr layers) {
    return {tokens.getBegin(), tokens.getEnd(), layers.getBegin(),
            layers.getEnd()};
  }
};

/// Where a set of blocks fails to tile a region.
struct CoverageFault {
  enum Kind { Gap, Overlap } kind;
  int64_t t0, t1, l0, l1; ///< The offending cells.
};

/// Returns the first gap of `blocks` over `whole` (and, when `checkOverlap`,
/// the first cell two blocks share), scanning a grid of block boundaries in
/// token-major order. Each cell's cover count comes from one 2-D prefix sum
/// over the grid: O(blocks + cells), where counting every block per cell
/// made a long plan's verification quadratic.
std::optional<CoverageFault> findCoverageFault(ArrayRef<Tile> blocks,
                                               Tile whole,
                                               bool checkOverlap) {
  SmallVector<Tile> clamped;
  SmallVector<int64_t> ts = {whole.t0, whole.t1}, ls = {whole.l0, whole.l1};
  for (const Tile &b : blocks) {
    Tile c = {std::clamp(b.t0, whole.t0, whole.t1),
              std::clamp(b.t1, whole.t0, whole.t1),
              std::clamp(b.l0, whole.l0, whole.l1),
              std::clamp(b.l1, whole.l0, whole.l1)};
    clamped.push_back(c);
    ts.append({c.t0, c.t1});
    ls.append({c.l0, c.l1});
  }
  llvm::sort(ts);
  llvm::sort(ls);
  ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
  ls.erase(std::unique(ls.begin(), ls.end()), ls.end());

  // counts[ti][li]: the blocks covering cell [ts[ti], ts[ti+1]) x
  // [ls[li], ls[li+1]), from +1/-1 at each block's corners summed over both
  // axes.
  const size_t rows = ts.size(), cols = ls.size();
  SmallVector<int64_t> counts(rows * cols, 0);
  auto at = [&](size_t ti, size_t li) -> int64_t & {
    return counts[ti * cols + li];
  };
  auto index = [](ArrayRef<int64_t> axis, int64_t value) {
    return size_t(llvm::lower_bound(axis, value) - axis.begin());
  };
  for (const Tile &c : clamped) {
    if (c.t0 >= c.t1 || c.l0 >= c.l1)
      continue; // Outside `whole`: covers none of its cells.
    const size_t t0 = index(ts, c.t0), t1 = index(ts, c.t1);
    const size_t l0 = index(ls, c.l0), l1 = index(ls, c.l1);
    ++at(t0, l0);
    --at(t1, l0);
    --at(t0, l1);
    ++at(t1, l1);
  }
  for (size_t ti = 0; ti < rows; ++ti)
    for (size_t li = 0; li < cols; ++li)
      at(ti, li) += (ti ? at(ti - 1, li) : 0) + (li ? at(ti, li - 1) : 0) -
                    (ti && li ? at(ti - 1, li - 1) : 0);

  for (size_t ti = 0; ti + 1 < rows; ++ti) {
    for (size_t li = 0; li + 1 < cols; ++li) {
      const int64_t count = at(ti, li);
      if (count == 0) {
        // Extend the gap over the following uncovered layers.
        size_t lj = li + 1;
        while (lj + 1 < cols && at(ti, lj) == 0)
          ++lj;
        return CoverageFault{CoverageFault::Gap, ts[ti], ts[ti + 1], ls[li],
                             ls[lj]};
      }
      if (checkOverlap && count > 1)
        return CoverageFault{CoverageFault::Overlap, ts[ti], ts[ti + 1],
                             ls[li], ls[li + 1]};
    }
  }
  return std::nullopt;
}

} // namespace

//===----------------------------------------------------------------------===//
// Intent
//===----------------------------------------------------------------------===//

LogicalResult RestoreOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), {})))
    return failure();
  for (Attribute attr : getSources())
    if (failed(verifySource(*this, cast<SourceAttr>(attr))))
      return failure();
  if (std::optional<uint64_t> forward = getForwardTokens()) {
    const int64_t tokens = int64_t(*forward);
    if (tokens <= 0)
      return emitOpError("forward_tokens must be 1 or more, got ") << tokens;
    ModelAttr model = lookupModel(*this);
    if (model && getTokens().getEnd() + tokens > model.getMaxPositions())
      return emitOpError("forward_tokens ")
             << tokens << " after " << getTokens().getEnd()
             << " restored tokens exceed the model's max_positions ("
             << model.getMaxPositions() << ")";
  }
  return success();
}

/// The objects of a save or transfer have tokens and layers.
template <typename OpTy> static LogicalResult verifyObjectLayout(OpTy op) {
  if (op.getObjectTokens() <= 0 || op.getObjectLayers() <= 0)
    return op.emitOpError("chunk_tokens and layer_group must be positive, got ")
           << op.getObjectTokens() << " and " << op.getObjectLayers();
  return success();
}

LogicalResult SaveOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), {})))
    return failure();
  if (!getKv() && !getHidden())
    return emitOpError("saves nothing: name kv, hidden or both");
  if (failed(verifyObjectLayout(*this)))
    return failure();
  for (auto [saved, form] :
       {std::pair(getKv(), Form::kv), std::pair(getHidden(), Form::hidden)})
    if (saved && failed(verifyRotation(*this, form, getCodecAttr())))
      return failure();
  return verifyTier(*this, getTier());
}

LogicalResult TransferOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), {})))
    return failure();
  if (getNode().empty())
    return emitOpError("needs a destination node");
  if (getSenderNode().empty())
    return emitOpError("needs a sending node when it names one");
  if (failed(verifyRotation(*this, Form::kv, getCodecAttr())))
    return failure();
  return verifyObjectLayout(*this);
}

//===----------------------------------------------------------------------===//
// Strategy
//===----------------------------------------------------------------------===//

namespace {

/// Checks that `block` (which `owner` covers) lies inside `plan`.
LogicalResult verifyInside(PlanOp plan, const Tile &block, Operation *owner) {
  Tile whole = Tile::of(plan.getTokens(), plan.getLayers());
  if (block.t0 >= whole.t0 && block.t1 <= whole.t1 && block.l0 >= whole.l0 &&
      block.l1 <= whole.l1)
    return success();
  return owner->emitOpError("covers tokens ")
         << block.t0 << " to " << block.t1 << " of layers " << block.l0
         << " to " << block.l1 << ", outside plan @" << plan.getSymName()
         << " (tokens " << str(plan.getTokens()) << ", layers "
         << str(plan.getLayers()) << ")";
}

/// Checks that `blocks` (written by `owners`) tile `plan` exactly.
LogicalResult verifyTiling(PlanOp plan, ArrayRef<Tile> blocks,
                           ArrayRef<Operation *> owners, StringRef what) {
  Tile whole = Tile::of(plan.getTokens(), plan.getLayers());
  for (auto [block, owner] : llvm::zip(blocks, owners))
    if (failed(verifyInside(plan, block, owner)))
      return failure();
  std::optional<CoverageFault> fault =
      findCoverageFault(blocks, whole, /*checkOverlap=*/true);
  if (!fault)
    return success();
  return plan.emitOpError("'")
         << plan.getSymName() << "' " << what
         << (fault->kind == CoverageFault::Gap ? " leave tokens "
                                               : " overlap on tokens ")
         << fault->t0 << " to " << fault->t1 << " of layers " << fault->l0
         << " to " << fault->l1
         << (fault->kind == CoverageFault::Gap ? " uncovered" : "");
}

} // namespace

LogicalResult PlanOp::verifyRegions() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), getLayers())))
    return failure();
  if (std::optional<int64_t> step = getPrefillStep()) {
    if (*step <= 0)
      return emitOpError("prefill_step ")
             << *step << ": a prefill step computes 1 token or more";
    bool gathers = false;
    getBody().walk([&](GatherOp) { gathers = true; });
    if (!gathers)
      return emitOpError("'") << getSymName()
                              << "' has a prefill_step but gathers nothing: "
                                 "only a save or a sender runs beside a "
                                 "prefill";
  }

  // A plan is checked at its level: segments if it has any, else the chunks
  // its scatters write (dataflow and exec levels), else, for a save plan or
  // a transfer's sender, the chunks each form's stores or sends write.
  SmallVector<Tile> blocks;
  SmallVector<Operation *> owners;
  for (SegmentOp segment : getBody().getOps<SegmentOp>()) {
    blocks.push_back(Tile::of(segment.getTokens(), segment.getLayers()));
    owners.push_back(segment);
  }
  if (!blocks.empty()) {
    // Segments say what to do, steps how: both in one plan would be two
    // descriptions of the same work, and kvc-expand would replace the
    // steps with the segments'.
    for (Operation &op : getBody().front())
      if (!isa<SegmentOp>(op))
        return emitOpError("'")
               << getSymName() << "' holds segments and '"
               << op.getName().getStringRef()
               << "': a plan holds segments or the steps that carry them "
                  "out, not both";
    return verifyTiling(*this, blocks, owners, "segments");
  }
  // Every chunk a step makes lies inside the plan, whether or not a scatter,
  // store or send ends its chain.
  WalkResult inside = getBody().walk([&](Operation *op) {
    for (Type type : op->getResultTypes())
      if (auto chunk = dyn_cast<ChunkType>(type))
        if (failed(verifyInside(
                *this, Tile::of(chunk.getTokens(), chunk.getLayers()), op)))
          return WalkResult::interrupt();
    return WalkResult::advance();
  });
  if (inside.wasInterrupted())
    return failure();
  getBody().walk([&](ScatterOp scatter) {
    auto chunk = cast<ChunkType>(scatter.getInput().getType());
    blocks.push_back(Tile::of(chunk.getTokens(), chunk.getLayers()));
    owners.push_back(scatter);
  });
  if (!blocks.empty())
    return verifyTiling(*this, blocks, owners, "scatters");
  // A save plan's stores, or a transfer sender's sends, tile it form by
  // form.
  bool writes = false;
  auto tileWrites = [&](auto opTag, StringRef what) -> LogicalResult {
    using OpTy = decltype(opTag);
    for (Form form : {Form::kv, Form::hidden}) {
      blocks.clear();
      owners.clear();
      getBody().walk([&](OpTy op) {
        auto chunk = cast<ChunkType>(op.getInput().getType());
        if (chunk.getForm() != form)
          return;
        blocks.push_back(Tile::of(chunk.getTokens(), chunk.getLayers()));
        owners.push_back(op);
      });
      writes |= !blocks.empty();
      if (!blocks.empty() &&
          failed(verifyTiling(*this, blocks, owners,
                              (stringifyForm(form) + " " + what).str())))
        return failure();
    }
    return success();
  };
  if (failed(tileWrites(StoreOp(), "stores")) ||
      failed(tileWrites(SendOp(), "sends")))
    return failure();
  // Neither segments, scatters, stores nor sends: the scatters' (empty)
  // tiling names the gap.
  if (!writes)
    return verifyTiling(*this, blocks, owners, "scatters");
  return success();
}

LogicalResult SegmentOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), getLayers())))
    return failure();
  std::optional<SourceAttr> source = getSource();
  Method method = getMethod();
  if (method != Method::compute) {
    Form form = method == Method::load_kv ? Form::kv : Form::hidden;
    if (!source)
      return emitOpError(stringifyMethod(method)) << " segment needs a source";
    if (source->getForm() != form)
      return emitOpError(stringifyMethod(method))
             << " segment needs a " << stringifyForm(form)
             << " source, got a " << stringifyForm(source->getForm())
             << " source";
  }
  if (source) {
    if (failed(verifySource(*this, *source)))
      return failure();
    if (method == Method::compute && source->getForm() != Form::hidden)
      return emitOpError("compute segment can only take hidden states from "
                         "its source, got a ")
             << stringifyForm(source->getForm()) << " source";
    // A compute segment reads only the hidden states entering its first layer.
    RangeAttr needed =
        method == Method::compute
            ? RangeAttr::get(getContext(), getLayers().getBegin(),
                             getLayers().getBegin() + 1)
            : getLayers();
    if (!source->getTokens().contains(getTokens()))
      return emitOpError("tokens ")
             << str(getTokens()) << " lie outside the source's tokens "
             << str(source->getTokens());
    if (!source->getLayers().contains(needed))
      return emitOpError("layers ")
             << str(needed) << " lie outside the source's layers "
             << str(source->getLayers());
  }
  if (method != Method::compute || getLayers().getBegin() == 0 || source)
    return success();
  // Without a source, the hidden states entering the first layer come from a
  // compute segment of the same tokens that ends there.
  int64_t first = getLayers().getBegin();
  for (SegmentOp other : (*this)->getParentRegion()->getOps<SegmentOp>())
    if (other.getMethod() == Method::compute &&
        other.getLayers().getEnd() == first &&
        other.getTokens().contains(getTokens()))
      return success();
  return emitOpError("compute segment of layers ")
         << str(getLayers()) << " needs the hidden states entering layer "
         << first << ": no compute segment of tokens " << str(getTokens())
         << " ends there and it names no hidden-state source";
}

//===----------------------------------------------------------------------===//
// Dataflow
//===----------------------------------------------------------------------===//

LogicalResult kvc::compiler::detail::verifyStageOp(Operation *op, Stage stage) {
  auto in = cast<ChunkType>(op->getOperand(0).getType());
  auto out = cast<ChunkType>(op->getResult(0).getType());
  if (in.getForm() != out.getForm() ||
      in.getElementType() != out.getElementType())
    return op->emitOpError("changes the form or element type of its chunk");
  if (in.getTokens() != out.getTokens())
    return op->emitOpError("result tokens ")
           << str(out.getTokens()) << " differ from input tokens "
           << str(in.getTokens());
  if (in.getLayers() != out.getLayers())
    return op->emitOpError("result layers ")
           << str(out.getLayers()) << " differ from input layers "
           << str(in.getLayers());

  CodecAttr inCodec = in.getCodec(), outCodec = out.getCodec();
  auto requireNotCompressed = [&](StringRef fix) -> LogicalResult {
    if (losslessOf(inCodec) == Lossless::none)
      return success();
    return op->emitOpError("input is still compressed (")
           << stringifyLossless(losslessOf(inCodec)) << "); " << fix;
  };
  auto requireNotQuantized = [&](StringRef fix) -> LogicalResult {
    if (quantOf(inCodec) == Quant::none)
      return success();
    return op->emitOpError("input is still quantized (")
           << stringifyQuant(quantOf(inCodec)) << "); " << fix;
  };

  ChunkType expected;
  switch (stage) {
  case Stage::Decompress:
    if (losslessOf(inCodec) == Lossless::none)
      return op->emitOpError("input is not compressed");
    expected = in.withCodec(inCodec.withLossless(Lossless::none));
    break;
  case Stage::Compress:
    if (failed(requireNotCompressed("it cannot be compressed twice")))
      return failure();
    if (losslessOf(outCodec) == Lossless::none)
      return op->emitOpError("result names no lossless coder");
    expected = in.withCodec(
        inCodec ? inCodec.withLossless(outCodec.getLossless())
                : CodecAttr::getOrRaw(op->getContext(), Transform::none,
                                      Quant::none, QuantAxis::channel,
                                      QuantAxis::token, 32,
                                      outCodec.getLossless()));
    break;
  case Stage::Dequant:
    if (quantOf(inCodec) == Quant::none)
      return op->emitOpError("input is not quantized");
    if (failed(requireNotCompressed("decompress it first")))
      return failure();
    expected = in.withCodec(inCodec.withQuant(Quant::none));
    break;
  case Stage::Quant:
    if (failed(requireNotQuantized("it cannot be quantized twice")) ||
        failed(requireNotCompressed("quantize before compressing")))
      return failure();
    if (quantOf(outCodec) == Quant::none)
      return op->emitOpError("result names no quantization");
    expected = in.withCodec(CodecAttr::getOrRaw(
        op->getContext(), transformOf(inCodec), outCodec.getQuant(),
        outCodec.getKeyAxis(), outCodec.getValueAxis(), outCodec.getGroup(),
        Lossless::none));
    break;
  case Stage::Untransform:
    if (transformOf(inCodec) == Transform::none)
      return op->emitOpError("input is not transformed");
    if (failed(requireNotCompressed("decompress it first")) ||
        failed(requireNotQuantized("dequantize it first")))
      return failure();
    expected = in.withCodec(inCodec.withTransform(Transform::none));
    break;
  case Stage::Transform:
    if (transformOf(inCodec) != Transform::none)
      return op->emitOpError("input is already transformed");
    if (failed(requireNotCompressed("transform before compressing")) ||
        failed(requireNotQuantized("transform before quantizing")))
      return failure();
    if (transformOf(outCodec) == Transform::none)
      return op->emitOpError("result names no transform");
    expected = in.withCodec(CodecAttr::getOrRaw(
        op->getContext(), outCodec.getTransform(), Quant::none,
        QuantAxis::channel, QuantAxis::token, 32, Lossless::none));
    break;
  case Stage::ToDevice:
    if (in.getSpace() != Space::host)
      return op->emitOpError("input is already on the device");
    expected = in.withSpace(Space::device);
    break;
  case Stage::ToHost:
    if (in.getSpace() != Space::device)
      return op->emitOpError("input is already in host memory");
    expected = in.withSpace(Space::host);
    break;
  }
  if (out != expected)
    return op->emitOpError("result type ")
           << out << " does not match the expected " << expected;
  return success();
}

LogicalResult FetchOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), getLayers())) ||
      failed(verifySource(*this, getSource())))
    return failure();
  SourceAttr source = getSource();
  if (!source.getTokens().contains(getTokens()))
    return emitOpError("tokens ") << str(getTokens())
                                  << " lie outside the source's tokens "
                                  << str(source.getTokens());
  if (!source.getLayers().contains(getLayers()))
    return emitOpError("layers ") << str(getLayers())
                                  << " lie outside the source's layers "
                                  << str(source.getLayers());
  ChunkType result = getResult().getType();
  if (result.getForm() != source.getForm())
    return emitOpError("result form ")
           << stringifyForm(result.getForm()) << " differs from the source's "
           << stringifyForm(source.getForm());
  if (result.getCodec() != source.getCodec()) {
    InFlightDiagnostic diag = emitOpError("result codec ");
    if (result.getCodec())
      diag << result.getCodec();
    else
      diag << "(raw)";
    diag << " differs from the codec the source is stored in, ";
    if (source.getCodec())
      diag << source.getCodec();
    else
      diag << "(raw)";
    return diag;
  }
  if (result.getSpace() != Space::host)
    return emitOpError("fetches into host memory; the result must be host");
  if (result.getTokens() != getTokens() || result.getLayers() != getLayers())
    return emitOpError("result ranges differ from the fetched tokens ")
           << str(getTokens()) << " and layers " << str(getLayers());
  return success();
}

LogicalResult ProjectOp::verify() {
  ChunkType in = getInput().getType(), out = getResult().getType();
  if (in.getForm() != Form::hidden)
    return emitOpError("needs hidden-state input, got a ")
           << stringifyForm(in.getForm()) << " chunk";
  if (failed(verifyDeviceRaw(*this, "input", in)))
    return failure();
  ChunkType expected =
      ChunkType::get(getContext(), Form::kv, in.getElementType(),
                     in.getTokens(), in.getLayers(), Space::device, {});
  if (out != expected)
    return emitOpError("result type ")
           << out << " does not match the expected " << expected;
  return success();
}

LogicalResult ChunkComputeOp::verify() {
  if (failed(verifyTokensAndLayers(*this, getTokens(), getLayers())))
    return failure();
  ChunkType result = getResult().getType();
  if (result.getForm() != Form::kv)
    return emitOpError("result must be raw KV on the device, got a ")
           << stringifyForm(result.getForm()) << " chunk";
  if (failed(verifyDeviceRaw(*this, "result", result)))
    return failure();
  if (result.getTokens() != getTokens() || result.getLayers() != getLayers())
    return emitOpError("result ranges differ from the computed tokens ")
           << str(getTokens()) << " and layers " << str(getLayers());

  int64_t first = getLayers().getBegin();
  if (Value hidden = getHidden()) {
    if (first == 0)
      return emitOpError("starts at layer 0, which reads token embeddings; "
                         "drop the hidden-state input");
    auto chunk = cast<ChunkType>(hidden.getType());
    if (chunk.getForm() != Form::hidden)
      return emitOpError("'from' operand must hold hidden states, got a ")
             << stringifyForm(chunk.getForm()) << " chunk";
    if (failed(verifyDeviceRaw(*this, "'from' operand", chunk)))
      return failure();
    if (!chunk.getTokens().contains(getTokens()) ||
        !chunk.getLayers().contains(first))
      return emitOpError("'from' operand (tokens ")
             << str(chunk.getTokens()) << ", layers " << str(chunk.getLayers())
             << ") does not hold the hidden states entering layer " << first
             << " for tokens " << str(getTokens());
  } else if (first > 0) {
    return emitOpError("starts at layer ")
           << first << " and needs the hidden states entering it ('from')";
  }

  SmallVector<Tile> prefix;
  for (Value value : getPrefix()) {
    auto chunk = cast<ChunkType>(value.getType());
    if (chunk.getForm() != Form::kv)
      return emitOpError("'after' operands must hold KV, got a ")
             << stringifyForm(chunk.getForm()) << " chunk";
    if (failed(verifyDeviceRaw(*this, "'after' operand", chunk)))
      return failure();
    prefix.push_back(Tile::of(chunk.getTokens(), chunk.getLayers()));
  }
  if (getTokens().getBegin() == 0)
    return success();
  Tile needed = {0, getTokens().getBegin(), first, getLayers().getEnd()};
  if (std::optional<CoverageFault> gap =
          findCoverageFault(prefix, needed, /*checkOverlap=*/false))
    return emitOpError("attends to tokens ")
           << gap->t0 << " to " << gap->t1 << " of layers " << gap->l0
           << " to " << gap->l1 << ", which no 'after' operand provides";
  return success();
}

LogicalResult ScatterOp::verify() {
  ChunkType in = getInput().getType();
  if (in.getForm() != Form::kv)
    return emitOpError("writes KV into the cache, got a ")
           << stringifyForm(in.getForm()) << " chunk; project it first";
  return verifyDeviceRaw(*this, "input", in);
}

LogicalResult GatherOp::verify() {
  return verifyDeviceRaw(*this, "result", getResult().getType());
}

LogicalResult StoreOp::verify() {
  if (getInput().getType().getSpace() != Space::host)
    return emitOpError("writes from host memory; transfer the chunk to the "
                       "host first");
  return verifyTier(*this, getTier());
}

LogicalResult SendOp::verify() {
  if (getInput().getType().getSpace() != Space::host)
    return emitOpError("sends from host memory; transfer the chunk to the "
                       "host first");
  if (getNode().empty())
    return emitOpError("needs a destination node");
  return success();
}

LogicalResult RecvOp::verify() {
  if (getResult().getType().getSpace() != Space::host)
    return emitOpError("receives into host memory; the result must be host");
  if (getNode().empty())
    return emitOpError("needs a source node");
  return success();
}

//===----------------------------------------------------------------------===//
// Exec
//===----------------------------------------------------------------------===//

namespace {
/// Checks that the body's yield returns `types`.
LogicalResult verifyYield(Operation *op, Region &body, TypeRange types) {
  auto yield = cast<YieldOp>(body.front().getTerminator());
  if (yield.getValues().getTypes() != types)
    return op->emitOpError("body yields ")
           << yield.getValues().size() << " values of types "
           << yield.getValues().getTypes() << ", but the op returns "
           << types;
  return success();
}
} // namespace

LogicalResult TaskOp::verifyRegions() {
  // I64Attr getters return uint64_t; read the signed value.
  if (int64_t lane = getLaneAttr().getInt(); lane < 0)
    return emitOpError("lane must not be negative, got ") << lane;
  if (IntegerAttr slot = getSlotAttr(); slot && slot.getInt() < 0)
    return emitOpError("slot must not be negative, got ") << slot.getInt();
  if (failed(verifyYield(*this, getBody(), getValues().getTypes())))
    return failure();
  Resource resource = getResource();
  for (Operation &op : getBody().front().without_terminator()) {
    if (isa<KernelOp>(op)) {
      if (resource != Resource::compute)
        return op.emitOpError("runs on compute, not on ")
               << stringifyResource(resource);
      continue;
    }
    auto step = dyn_cast<DataflowOpInterface>(op);
    if (!step)
      return op.emitOpError("is not a dataflow step and cannot run in a task");
    if (!step.canRunOn(resource))
      return op.emitOpError("cannot run on ")
             << stringifyResource(resource);
  }
  return success();
}

LogicalResult KernelOp::verifyRegions() {
  Block &entry = getBody().front();
  if (entry.getArgumentTypes() != getInputs().getTypes())
    return emitOpError("body arguments ")
           << entry.getArgumentTypes() << " do not match the inputs "
           << getInputs().getTypes();
  if (failed(verifyYield(*this, getBody(), getResultTypes())))
    return failure();
  for (Operation &op : entry.without_terminator()) {
    auto step = dyn_cast<DataflowOpInterface>(op);
    if (!step || !step.isFusible())
      return op.emitOpError("cannot be fused into a kernel");
  }
  return success();
}
