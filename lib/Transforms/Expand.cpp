//===- Expand.cpp - kvc-expand: plan segments to per-chunk dataflow -------===//
//
// Splits every segment of a strategy-level plan into the chunks the planner
// simulated (token blocks, and layer groups for loads) and emits each chunk's
// dataflow, the steps Pipeline.h defines: loads fetch on the host, decompress
// there, cross the link still quantized, and are dequantized, untransformed,
// projected (hidden states) and scattered on the device; computed chunks run
// a chunked prefill after the chunks that hold their earlier tokens. A
// kvc.save becomes a save plan: each stored object is gathered, transformed
// and quantized on the device, copied to the host, compressed and stored.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mlir::kvc {
#define GEN_PASS_DEF_KVCEXPANDPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace mlir::kvc

using namespace mlir;
using namespace mlir::kvc;
namespace planning = ::kvc::planning;

namespace {

class ChunkEmitter {
public:
  ChunkEmitter(OpBuilder &builder, Location loc, Type elementType)
      : b(builder), loc(loc), elementType(elementType) {}

  /// The steps of planning::restoreSteps for `box` of `source` stored as
  /// `form`: into the cache (`toCache`), or to raw data on the device. Returns
  /// the last value produced (the KV a scatter writes).
  Value load(const planning::Source &source, Form form,
             const planning::Box &box, bool toCache) {
    planning::Source stored = source;
    stored.form = toVocabulary(form);
    return emit(planning::restoreSteps(stored.form, stored.codec, toCache), box,
                [&](RangeAttr tokens, RangeAttr layers, ChunkType type) {
                  return b.create<FetchOp>(
                      loc, type, getSourceAttr(b.getContext(), stored), tokens,
                      layers);
                });
  }

  /// The steps of planning::saveSteps: `box` of `form` gathered on the
  /// device, encoded with `codec` and stored to `tier`.
  void save(Form form, const ::kvc::CodecSpec &codec, const planning::Box &box,
            StringRef tier) {
    emit(
        planning::saveSteps(toVocabulary(form), codec), box,
        [&](RangeAttr, RangeAttr, ChunkType type) {
          return b.create<GatherOp>(loc, type);
        },
        tier);
  }

  Value compute(const planning::Box &box, Value hidden, ValueRange prefix) {
    MLIRContext *ctx = b.getContext();
    RangeAttr tokens = RangeAttr::get(ctx, box.t0, box.t1);
    RangeAttr layers = RangeAttr::get(ctx, box.l0, box.l1);
    auto type = ChunkType::get(ctx, Form::kv, elementType, tokens, layers,
                               Space::device, {});
    return b.create<ChunkComputeOp>(loc, type, tokens, layers, hidden, prefix);
  }

  void scatter(Value kv) { b.create<ScatterOp>(loc, kv); }

private:
  /// Emits `steps` over `box`, the first through `source` (the op that
  /// brings the chunk in: a fetch or a gather); a store writes to `tier`.
  /// Returns the last value produced.
  template <typename SourceFn>
  Value emit(ArrayRef<planning::PipelineStep> steps, const planning::Box &box,
             SourceFn source, StringRef tier = "") {
    MLIRContext *ctx = b.getContext();
    RangeAttr tokens = RangeAttr::get(ctx, box.t0, box.t1);
    RangeAttr layers = RangeAttr::get(ctx, box.l0, box.l1);
    Value value;
    for (const planning::PipelineStep &step : steps) {
      auto type = ChunkType::get(
          ctx, fromVocabulary(step.out.form), elementType, tokens, layers,
          step.out.onDevice ? Space::device : Space::host,
          getCodecAttr(ctx, step.out.codec));
      switch (step.kind) {
      case ::kvc::StepKind::Fetch:
      case ::kvc::StepKind::Gather:
        value = source(tokens, layers, type);
        break;
      case ::kvc::StepKind::Decompress:
        value = b.create<DecompressOp>(loc, type, value);
        break;
      case ::kvc::StepKind::TransferToDevice:
        value = b.create<TransferToDeviceOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Dequant:
        value = b.create<DequantOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Untransform:
        value = b.create<UntransformOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Project:
        value = b.create<ProjectOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Scatter:
        b.create<ScatterOp>(loc, value);
        break;
      case ::kvc::StepKind::Transform:
        value = b.create<TransformOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Quant:
        value = b.create<QuantOp>(loc, type, value);
        break;
      case ::kvc::StepKind::TransferToHost:
        value = b.create<TransferToHostOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Compress:
        value = b.create<CompressOp>(loc, type, value);
        break;
      case ::kvc::StepKind::Store:
        b.create<StoreOp>(loc, value, tier);
        break;
      default:
        llvm_unreachable("not a step of a restore or save");
      }
    }
    return value;
  }

  OpBuilder &b;
  Location loc;
  Type elementType;
};

struct KVCExpandPass
    : public mlir::kvc::impl::KVCExpandPassBase<KVCExpandPass> {
  using Base::Base;

  void runOnOperation() override {
    if (failed(expandSaves()))
      return signalPassFailure();
    if (failed(forEachPlan(
            getOperation(), getArgument(), codecProfile, chunkTokens,
            stagingMiB, holdsSegments,
            [&](PlanOp plan, const PlanningContext &context) {
              return expand(plan, context);
            })))
      signalPassFailure();
  }

  /// Replaces every kvc.save with a save plan: per object of its layout
  /// (token chunk x layer group, in token then layer order) and form, the
  /// save steps.
  LogicalResult expandSaves() {
    SmallVector<SaveOp> saves(getOperation().getOps<SaveOp>());
    if (saves.empty())
      return success();
    FailureOr<PlanningContext> context = getPlanningContext(
        getOperation(), getArgument(), codecProfile, chunkTokens, stagingMiB);
    if (failed(context))
      return failure();
    for (SaveOp save : saves) {
      OpBuilder builder(save);
      RangeAttr tokens = save.getTokens();
      auto plan = builder.create<PlanOp>(
          save.getLoc(), save.getSymName(), tokens,
          RangeAttr::get(builder.getContext(), 0, context->layers),
          builder.getStringAttr("save"), IntegerAttr());
      OpBuilder body = OpBuilder::atBlockEnd(&plan.getBody().emplaceBlock());
      ChunkEmitter emit(body, save.getLoc(), context->elementType);
      ::kvc::CodecSpec codec = getCodecSpec(save.getCodecAttr());
      const int64_t step = save.getObjectTokens(),
                    group = save.getObjectLayers();
      for (int64_t t0 = tokens.getBegin(); t0 < tokens.getEnd(); t0 += step)
        for (int64_t l0 = 0; l0 < context->layers; l0 += group)
          for (auto [wanted, form] :
               {std::pair{save.getKv(), Form::kv},
                std::pair{save.getHidden(), Form::hidden}})
            if (wanted)
              emit.save(form, codec,
                        planning::Box{t0, std::min(tokens.getEnd(), t0 + step),
                                      l0,
                                      std::min(context->layers, l0 + group)},
                        save.getTier());
      save.erase();
    }
    return success();
  }

  LogicalResult expand(PlanOp plan, const PlanningContext &context) {
    auto segmentPlan = getSegmentPlan(plan, context.layers);
    if (failed(segmentPlan))
      return failure();
    const auto &[request, strategy] = *segmentPlan;
    planning::Planner planner(*context.cost, request, context.options);
    std::vector<planning::Chunk> chunks = planner.chunks(strategy);

    Block &body = plan.getBody().front();
    for (Operation &op : llvm::make_early_inc_range(body))
      op.erase();
    OpBuilder builder = OpBuilder::atBlockEnd(&body);
    ChunkEmitter emit(builder, plan.getLoc(), context.elementType);

    // The raw KV on the device each chunk ends with, for later prefixes.
    std::vector<Value> kv(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      const planning::Chunk &c = chunks[i];
      if (c.method != planning::Method::Compute) {
        const planning::Source &source = request.sources[c.source];
        bool hidden = c.method == planning::Method::LoadHidden;
        kv[i] = emit.load(source, hidden ? Form::hidden : Form::kv, c.box,
                          /*toCache=*/true);
        continue;
      }
      // Attention reads every earlier token of these layers.
      SmallVector<Value> prefix;
      for (size_t j = 0; j < i; ++j) {
        const planning::Box &b = chunks[j].box;
        if (b.t0 < c.box.t0 && b.l0 < c.box.l1 && c.box.l0 < b.l1)
          prefix.push_back(kv[j]);
      }
      Value hidden;
      if (c.box.l0 > 0) {
        if (c.source < 0)
          return plan.emitOpError("computes layers ")
                 << c.box.l0 << " to " << c.box.l1 << " of tokens " << c.box.t0
                 << " to " << c.box.t1
                 << " without a hidden-state source; kvc-expand needs one "
                    "(or a compute segment starting at layer 0)";
        hidden =
            emit.load(request.sources[c.source], Form::hidden,
                      planning::Box{c.box.t0, c.box.t1, c.box.l0, c.box.l0 + 1},
                      /*toCache=*/false);
      }
      kv[i] = emit.compute(c.box, hidden, prefix);
      emit.scatter(kv[i]);
    }
    return success();
  }
};

} // namespace
