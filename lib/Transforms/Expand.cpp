//===- Expand.cpp - kvc-expand: plan segments to per-chunk dataflow -------===//
//
// Splits every segment of a strategy-level plan into the chunks the planner
// simulated (token blocks, and layer groups for loads) and emits each chunk's
// dataflow, the steps Pipeline.h defines: loads fetch on the host, decompress
// there, cross the link still quantized, and are dequantized, untransformed,
// projected (hidden states) and scattered on the device; computed chunks run
// a chunked prefill after the chunks that hold their earlier tokens. A
// kvc.save becomes a save plan: each stored object is gathered, transformed
// and quantized on the device, copied to the host, compressed and stored. A
// kvc.transfer becomes two plans, one per node: the sender's, a save plan
// whose objects are sent instead of stored, and the receiver's, a restore
// plan whose objects are received instead of fetched.
//
//===----------------------------------------------------------------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace kvc::compiler {
#define GEN_PASS_DEF_KVCEXPANDPASS
#include "kvc/Transforms/Passes.h.inc"
} // namespace kvc::compiler

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

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
  /// device, encoded with `codec` and stored to tier `sink`, or sent to node
  /// `sink` (`to`: send).
  void save(Form form, const kvc::CodecSpec &codec, const planning::Box &box,
            StringRef sink, kvc::StepKind to = kvc::StepKind::Store) {
    emit(
        planning::saveSteps(toVocabulary(form), codec, to), box,
        [&](RangeAttr, RangeAttr, ChunkType type) {
          return b.create<GatherOp>(loc, type);
        },
        sink);
  }

  /// A transfer's receiving end of `box`: KV encoded with `codec` received
  /// from node `from`, decoded and scattered into the cache.
  void receive(const kvc::CodecSpec &codec, const planning::Box &box,
               StringRef from) {
    emit(planning::restoreSteps(toVocabulary(Form::kv), codec,
                                /*toCache=*/true, kvc::StepKind::Recv),
         box, [&](RangeAttr, RangeAttr, ChunkType type) {
           return b.create<RecvOp>(loc, type, from);
         });
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
  /// brings the chunk in: a fetch, a gather or a recv); a store writes to
  /// tier `sink`, a send to node `sink`. Returns the last value produced.
  template <typename SourceFn>
  Value emit(ArrayRef<planning::PipelineStep> steps, const planning::Box &box,
             SourceFn source, StringRef sink = "") {
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
      case kvc::StepKind::Fetch:
      case kvc::StepKind::Gather:
      case kvc::StepKind::Recv:
        value = source(tokens, layers, type);
        break;
      case kvc::StepKind::Decompress:
        value = b.create<DecompressOp>(loc, type, value);
        break;
      case kvc::StepKind::TransferToDevice:
        value = b.create<TransferToDeviceOp>(loc, type, value);
        break;
      case kvc::StepKind::Dequant:
        value = b.create<DequantOp>(loc, type, value);
        break;
      case kvc::StepKind::Untransform:
        value = b.create<UntransformOp>(loc, type, value);
        break;
      case kvc::StepKind::Project:
        value = b.create<ProjectOp>(loc, type, value);
        break;
      case kvc::StepKind::Scatter:
        b.create<ScatterOp>(loc, value);
        break;
      case kvc::StepKind::Transform:
        value = b.create<TransformOp>(loc, type, value);
        break;
      case kvc::StepKind::Quant:
        value = b.create<QuantOp>(loc, type, value);
        break;
      case kvc::StepKind::TransferToHost:
        value = b.create<TransferToHostOp>(loc, type, value);
        break;
      case kvc::StepKind::Compress:
        value = b.create<CompressOp>(loc, type, value);
        break;
      case kvc::StepKind::Store:
        b.create<StoreOp>(loc, value, sink);
        break;
      case kvc::StepKind::Send:
        b.create<SendOp>(loc, value, sink);
        break;
      default:
        llvm_unreachable("not a step of a restore, save or transfer");
      }
    }
    return value;
  }

  OpBuilder &b;
  Location loc;
  Type elementType;
};

struct KVCExpandPass
    : public PlanningPass<KVCExpandPass,
                          kvc::compiler::impl::KVCExpandPassBase> {
  using PlanningPass::PlanningPass;

  void runOnOperation() override {
    if (failed(expandIntents()))
      return signalPassFailure();
    if (failed(forEachPlan(
            getOperation(), getArgument(), planOptions(), holdsSegments,
            [&](PlanOp plan, const PlanningContext &context) {
              return expand(plan, context);
            },
            given.get())))
      signalPassFailure();
  }

  /// Replaces every kvc.save with a save plan and every kvc.transfer with
  /// its sender's and receiver's plans.
  LogicalResult expandIntents() {
    SmallVector<SaveOp> saves(getOperation().getOps<SaveOp>());
    SmallVector<TransferOp> transfers(getOperation().getOps<TransferOp>());
    if (saves.empty() && transfers.empty())
      return success();
    FailureOr<PlanningContext> context = getPlanningContext(
        getOperation(), getArgument(), planOptions(), given.get());
    if (failed(context))
      return failure();
    for (SaveOp save : saves)
      expandSave(save, *context);
    for (TransferOp transfer : transfers)
      expandTransfer(transfer, *context);
    return success();
  }

  /// The objects of a layout of `step` tokens x `group` layers over
  /// `tokens` x every layer, in token then layer order: the order a prefill
  /// chunk by chunk completes them; layer-wise, in layer then token order,
  /// as a prefill of the whole request in one step completes them.
  static SmallVector<planning::Box> objects(RangeAttr tokens, int64_t layers,
                                            int64_t step, int64_t group,
                                            bool layerWise) {
    SmallVector<planning::Box> boxes;
    for (int64_t t0 = tokens.getBegin(); t0 < tokens.getEnd(); t0 += step)
      for (int64_t l0 = 0; l0 < layers; l0 += group)
        boxes.push_back({t0, std::min(tokens.getEnd(), t0 + step), l0,
                         std::min(layers, l0 + group)});
    if (layerWise)
      llvm::stable_sort(boxes,
                        [](const planning::Box &a, const planning::Box &b) {
                          return a.l0 < b.l0;
                        });
    return boxes;
  }

  /// The tokens a step of the prefill beside a save or sender computes:
  /// the whole request for a layer-wise plan, whose first layer groups are
  /// then complete long before its last (a step of one object would
  /// complete the first group only with the last object); else one
  /// object's tokens, which completes the objects in the plan's order.
  static int64_t prefillStep(RangeAttr tokens, int64_t objectTokens,
                             bool layerWise) {
    if (!layerWise)
      return objectTokens;
    return llvm::divideCeil(tokens.getEnd(), objectTokens) * objectTokens;
  }

  /// An empty plan over `tokens` x every layer, placed before `intent`;
  /// one that gathers runs beside a prefill of `prefillStep` tokens a step.
  static PlanOp createPlan(Operation *intent, StringRef name, RangeAttr tokens,
                           const PlanningContext &context, StringRef strategy,
                           std::optional<int64_t> prefillStep = {}) {
    OpBuilder builder(intent);
    auto plan = builder.create<PlanOp>(
        intent->getLoc(), name, tokens,
        RangeAttr::get(builder.getContext(), 0, context.layers),
        builder.getStringAttr(strategy),
        prefillStep ? builder.getI64IntegerAttr(*prefillStep) : IntegerAttr(),
        IntegerAttr());
    plan.getBody().emplaceBlock();
    return plan;
  }

  /// A kvc.save's plan: per object of its layout and form, the save steps.
  static void expandSave(SaveOp save, const PlanningContext &context) {
    PlanOp plan =
        createPlan(save, save.getSymName(), save.getTokens(), context, "save",
                   prefillStep(save.getTokens(), save.getObjectTokens(),
                               context.options.layerWise));
    OpBuilder body = OpBuilder::atBlockEnd(&plan.getBody().front());
    ChunkEmitter emit(body, save.getLoc(), context.elementType);
    kvc::CodecSpec codec = getCodecSpec(save.getCodecAttr());
    for (const planning::Box &box :
         objects(save.getTokens(), context.layers, save.getObjectTokens(),
                 save.getObjectLayers(), context.options.layerWise))
      for (auto [wanted, form] : {std::pair{save.getKv(), Form::kv},
                                  std::pair{save.getHidden(), Form::hidden}})
        if (wanted)
          emit.save(form, codec, box, save.getTier());
    save.erase();
  }

  /// A kvc.transfer's two plans over the same objects: `<name>_send`, per
  /// object the save steps ending in a send, and `<name>_recv`, per object
  /// a recv, the restore steps and a scatter.
  static void expandTransfer(TransferOp transfer,
                             const PlanningContext &context) {
    kvc::CodecSpec codec = getCodecSpec(transfer.getCodecAttr());
    SmallVector<planning::Box> boxes = objects(
        transfer.getTokens(), context.layers, transfer.getObjectTokens(),
        transfer.getObjectLayers(), context.options.layerWise);
    for (bool sender : {true, false}) {
      PlanOp plan = createPlan(
          transfer,
          (transfer.getSymName() + (sender ? "_send" : "_recv")).str(),
          transfer.getTokens(), context, sender ? "send" : "receive",
          sender ? std::optional<int64_t>(prefillStep(
                       transfer.getTokens(), transfer.getObjectTokens(),
                       context.options.layerWise))
                 : std::nullopt);
      OpBuilder body = OpBuilder::atBlockEnd(&plan.getBody().front());
      ChunkEmitter emit(body, transfer.getLoc(), context.elementType);
      for (const planning::Box &box : boxes) {
        if (sender)
          emit.save(Form::kv, codec, box, transfer.getNode(),
                    kvc::StepKind::Send);
        else
          emit.receive(codec, box, transfer.getSenderNode());
      }
    }
    transfer.erase();
  }

  LogicalResult expand(PlanOp plan, const PlanningContext &context) {
    auto segmentPlan = getSegmentPlan(plan, context.layers);
    if (failed(segmentPlan))
      return failure();
    const auto &[request, strategy] = *segmentPlan;
    planning::Planner planner(*context.cost, request, context.options);
    std::vector<planning::Chunk> chunks = planner.chunks(strategy);

    Block &body = plan.getBody().front();
    body.clear();
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
      for (size_t j = 0; j < i; ++j)
        if (planning::dependsOn(c, chunks[j]) && chunks[j].box.t0 < c.box.t0)
          prefix.push_back(kv[j]);
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

std::unique_ptr<Pass> kvc::compiler::createKVCExpandPass(
    const KVCExpandPassOptions &options,
    std::shared_ptr<const PlanningContext> given) {
  return createPlanningPass<KVCExpandPass>(options, std::move(given));
}
