//===- PlanningSupport.cpp - What the planning passes share ---------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::kvc;
namespace planning = ::kvc::planning;

FailureOr<PlanningContext>
mlir::kvc::getPlanningContext(Operation *op, StringRef passArgument,
                              StringRef profilePath, int64_t chunkTokens,
                              int64_t stagingMiB) {
  ModelAttr model = lookupModel(op);
  TargetAttr target = lookupTarget(op);
  if (!model)
    return op->emitError() << passArgument
                           << " needs the model: attach one with "
                              "--kvc-import-model=PATH/config.json";
  if (!target)
    return op->emitError() << passArgument
                           << " needs the machine: attach one with "
                              "--kvc-attach-target=targets/NAME.json";
  planning::CodecProfile profile = planning::CodecProfile::defaults();
  if (!profilePath.empty()) {
    ::kvc::StatusOr<planning::CodecProfile> loaded =
        planning::CodecProfile::load(profilePath.str());
    if (!loaded.isOk())
      return op->emitError() << loaded.status().message();
    profile = std::move(*loaded);
  }
  PlanningContext context;
  context.cost = std::make_unique<planning::CostModel>(
      getModelConfig(model), getTargetDesc(target), std::move(profile));
  context.options.chunkTokens = chunkTokens;
  context.options.stagingBytes = stagingMiB << 20;
  context.layers = model.getLayers();
  context.elementType = model.getDtype();
  return context;
}

LogicalResult mlir::kvc::forEachPlan(
    ModuleOp module, StringRef passArgument, StringRef profilePath,
    int64_t chunkTokens, int64_t stagingMiB, function_ref<bool(PlanOp)> select,
    function_ref<LogicalResult(PlanOp, const PlanningContext &)> fn) {
  SmallVector<PlanOp> plans;
  module.walk([&](PlanOp plan) {
    if (select(plan))
      plans.push_back(plan);
  });
  if (plans.empty())
    return success();
  FailureOr<PlanningContext> context = getPlanningContext(
      module, passArgument, profilePath, chunkTokens, stagingMiB);
  if (failed(context))
    return failure();
  for (PlanOp plan : plans)
    if (failed(fn(plan, *context)))
      return failure();
  return success();
}

bool mlir::kvc::holdsSegments(PlanOp plan) {
  return !plan.getBody().getOps<SegmentOp>().empty();
}

planning::Source mlir::kvc::getSource(SourceAttr source) {
  planning::Source out;
  out.tier = source.getTier().str();
  out.form = toVocabulary(source.getForm());
  out.codec = getCodecSpec(source.getCodec());
  out.box = {source.getTokens().getBegin(), source.getTokens().getEnd(),
             source.getLayers().getBegin(), source.getLayers().getEnd()};
  out.tokenGroup = source.getTokenGroup();
  out.layerGroup = source.getLayerGroup();
  return out;
}

SourceAttr mlir::kvc::getSourceAttr(MLIRContext *context,
                                    const planning::Source &source) {
  return SourceAttr::get(context, source.tier, fromVocabulary(source.form),
                         getCodecAttr(context, source.codec),
                         RangeAttr::get(context, source.box.t0, source.box.t1),
                         RangeAttr::get(context, source.box.l0, source.box.l1),
                         source.tokenGroup, source.layerGroup);
}

planning::Request mlir::kvc::getRequest(RestoreOp restore) {
  planning::Request request;
  request.tokens = restore.getTokens().getEnd();
  for (Attribute attr : restore.getSources())
    request.sources.push_back(getSource(cast<SourceAttr>(attr)));
  if (FloatAttr error = restore.getMaxErrorAttr())
    request.maxError = error.getValueAsDouble();
  if (FloatAttr slo = restore.getSloMsAttr())
    request.sloSeconds = slo.getValueAsDouble() * 1e-3;
  return request;
}

FailureOr<std::pair<planning::Request, planning::Plan>>
mlir::kvc::getSegmentPlan(PlanOp plan, int64_t layers) {
  if (plan.getTokens().getBegin() != 0 || plan.getLayers().getBegin() != 0 ||
      plan.getLayers().getEnd() != layers)
    return plan.emitOpError("restores tokens ")
           << plan.getTokens().getBegin() << " to "
           << plan.getTokens().getEnd() << " of layers "
           << plan.getLayers().getBegin() << " to " << plan.getLayers().getEnd()
           << "; planning handles plans from token 0 over every layer";
  planning::Request request;
  request.tokens = plan.getTokens().getEnd();
  planning::Plan out;
  out.strategy = plan.getStrategy().value_or("").str();
  llvm::SmallDenseMap<Attribute, int> sourceIndex;
  for (SegmentOp segment : plan.getBody().getOps<SegmentOp>()) {
    planning::Segment s;
    s.method = segment.getMethod() == Method::compute
                   ? planning::Method::Compute
               : segment.getMethod() == Method::load_kv
                   ? planning::Method::LoadKV
                   : planning::Method::LoadHidden;
    s.box = {segment.getTokens().getBegin(), segment.getTokens().getEnd(),
             segment.getLayers().getBegin(), segment.getLayers().getEnd()};
    if (std::optional<SourceAttr> source = segment.getSource()) {
      auto [it, inserted] =
          sourceIndex.try_emplace(*source, int(request.sources.size()));
      if (inserted)
        request.sources.push_back(getSource(*source));
      s.source = it->second;
    }
    out.segments.push_back(s);
  }
  return std::make_pair(std::move(request), std::move(out));
}

PlanOp mlir::kvc::buildPlanOp(OpBuilder &builder, Location loc,
                              StringRef name, const planning::Request &request,
                              const planning::Plan &plan, int64_t layers) {
  MLIRContext *context = builder.getContext();
  auto op = builder.create<PlanOp>(
      loc, name, RangeAttr::get(context, 0, request.tokens),
      RangeAttr::get(context, 0, layers), builder.getStringAttr(plan.strategy),
      /*predicted_us=*/IntegerAttr());
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(&op.getBody().emplaceBlock());
  for (const planning::Segment &s : plan.segments) {
    Method method = s.method == planning::Method::Compute ? Method::compute
                    : s.method == planning::Method::LoadKV
                        ? Method::load_kv
                        : Method::load_hidden;
    SourceAttr source =
        s.source >= 0 ? getSourceAttr(context, request.sources[s.source])
                      : SourceAttr();
    builder.create<SegmentOp>(loc, method,
                              RangeAttr::get(context, s.box.t0, s.box.t1),
                              RangeAttr::get(context, s.box.l0, s.box.l1),
                              source);
  }
  return op;
}

std::optional<::kvc::StepKind> mlir::kvc::getStepKind(Operation *op) {
  if (!isa<DataflowOpInterface>(op))
    return std::nullopt;
  return ::kvc::parseStepKind(op->getName().stripDialect());
}

Resource mlir::kvc::getResource(Operation *step) {
  std::optional<::kvc::StepKind> kind = getStepKind(step);
  if (!kind)
    return Resource::compute; // A fused kernel runs on the device.
  bool onHost =
      step->getNumOperands() == 0 ||
      cast<ChunkType>(step->getOperand(0).getType()).getSpace() == Space::host;
  return fromVocabulary(::kvc::planning::stepResource(*kind, onHost));
}

StepCost mlir::kvc::getStepCost(Operation *step,
                                const planning::CostModel &cost) {
  auto chunkOf = [](Value value) { return cast<ChunkType>(value.getType()); };
  auto volume = [](ChunkType c) {
    return std::make_pair(c.getTokens().size(), c.getLayers().size());
  };
  auto rawOf = [&](ChunkType c) {
    auto [tokens, layers] = volume(c);
    return cost.rawBytes(toVocabulary(c.getForm()), tokens, layers);
  };
  auto encodedOf = [&](ChunkType c) {
    auto [tokens, layers] = volume(c);
    return cost.encodedBytes(toVocabulary(c.getForm()),
                             getCodecSpec(c.getCodec()), tokens, layers);
  };
  StepCost result =
      llvm::TypeSwitch<Operation *, StepCost>(step)
          .Case([&](FetchOp op) {
            ChunkType c = op.getResult().getType();
            const ::kvc::TierDesc *tier =
                cost.target().findTier(op.getSource().getTier().str());
            double bytes = encodedOf(c);
            double seconds = tier ? cost.readSeconds(*tier, bytes) : 0;
            return StepCost{seconds, bytes, 0};
          })
          .Case([&](DecompressOp op) {
            ChunkType in = op.getInput().getType();
            ChunkType out = op.getResult().getType();
            return StepCost{cost.hostDecodeSeconds(getCodecSpec(in.getCodec()),
                                                   encodedOf(out))};
          })
          .Case([&](TransferToDeviceOp op) {
            return StepCost{
                cost.h2dSeconds(encodedOf(op.getInput().getType()))};
          })
          .Case([&](DequantOp op) {
            ChunkType in = op.getInput().getType();
            return StepCost{
                cost.dequantSeconds(getCodecSpec(in.getCodec()), rawOf(in))};
          })
          .Case([&](UntransformOp op) {
            ChunkType in = op.getInput().getType();
            return StepCost{cost.untransformSeconds(getCodecSpec(in.getCodec()),
                                                    rawOf(in))};
          })
          .Case([&](ProjectOp op) {
            auto [tokens, layers] = volume(op.getInput().getType());
            double flops = cost.projectFlops(tokens, layers);
            return StepCost{cost.computeSeconds(flops, tokens), 0, flops};
          })
          .Case([&](ScatterOp op) {
            return StepCost{
                cost.scatterSeconds(rawOf(op.getInput().getType()))};
          })
          .Case([&](ChunkComputeOp op) {
            RangeAttr t = op.getTokens();
            double flops = cost.prefillFlops(t.getBegin(), t.getEnd(),
                                             op.getLayers().size());
            return StepCost{cost.prefillSeconds(t.getBegin(), t.getEnd(),
                                                op.getLayers().size()),
                            0, flops};
          })
          .Case<KernelOp, TaskOp>([&](Operation *op) {
            // A fused body or a task costs what its steps cost.
            StepCost total;
            total.priority = -1;
            op->getRegion(0).walk([&](Operation *inner) {
              if (!isa<DataflowOpInterface>(inner))
                return;
              StepCost c = getStepCost(inner, cost);
              total.seconds += c.seconds;
              total.bytesRead += c.bytesRead;
              total.flops += c.flops;
              total.priority = std::max(total.priority, c.priority);
            });
            total.priority = std::max(total.priority, 0);
            return total;
          })
          // Save and transfer sides.
          .Case([&](GatherOp op) {
            return StepCost{
                cost.scatterSeconds(rawOf(op.getResult().getType()))};
          })
          .Case<TransformOp, QuantOp, CompressOp>([&](Operation *op) {
            // Encode only the stage this step adds.
            ::kvc::CodecSpec out =
                getCodecSpec(chunkOf(op->getResult(0)).getCodec());
            ::kvc::CodecSpec stage;
            if (isa<TransformOp>(op))
              stage.transform = out.transform;
            if (isa<QuantOp>(op))
              stage.quant = out.quant, stage.group = out.group;
            if (isa<CompressOp>(op))
              stage.lossless = out.lossless;
            return StepCost{cost.hostEncodeSeconds(
                stage, encodedOf(chunkOf(op->getOperand(0))))};
          })
          .Case([&](TransferToHostOp op) {
            return StepCost{
                cost.d2hSeconds(encodedOf(op.getInput().getType()))};
          })
          .Case([&](StoreOp op) {
            const ::kvc::TierDesc *tier =
                cost.target().findTier(op.getTier().str());
            double bytes = encodedOf(op.getInput().getType());
            return StepCost{tier ? cost.writeSeconds(*tier, bytes) : 0};
          })
          .Case([&](SendOp op) {
            return StepCost{
                cost.networkSeconds(encodedOf(op.getInput().getType()))};
          })
          .Default([&](Operation *) { return StepCost{}; });
  if (std::optional<::kvc::StepKind> kind = getStepKind(step))
    result.priority = ::kvc::planning::stepPriority(*kind);
  return result;
}

SmallVector<Value> mlir::kvc::stepInputs(Operation *step) {
  SmallVector<Value> inputs(step->getOperands());
  if (isa<TaskOp>(step))
    step->walk([&](Operation *inner) {
      for (Value operand : inner->getOperands())
        if (!step->isAncestor(operand.getParentRegion()->getParentOp()) &&
            !llvm::is_contained(inputs, operand))
          inputs.push_back(operand);
    });
  return inputs;
}
