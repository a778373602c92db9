//===- PlanningSupport.cpp - What the planning passes share ---------------===//

#include "PlanningSupport.h"

#include "kvc/Transforms/Descriptions.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace kvc::compiler;
namespace planning = kvc::planning;

FailureOr<PlanningContext>
kvc::compiler::getPlanningContext(Operation *op, StringRef passArgument,
                                  const planning::PlanOptions &options,
                                  const PlanningContext *given) {
  if (given)
    return *given;
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
  if (!options.codecProfile.empty()) {
    kvc::StatusOr<planning::CodecProfile> loaded =
        planning::CodecProfile::load(options.codecProfile);
    if (!loaded.isOk())
      return op->emitError() << loaded.status().message();
    profile = std::move(*loaded);
  }
  PlanningContext context;
  context.cost = std::make_shared<const planning::CostModel>(
      getModelConfig(model), getTargetDesc(target), std::move(profile));
  context.options = options;
  context.layers = model.getLayers();
  context.elementType = model.getDtype();
  return context;
}

LogicalResult kvc::compiler::forEachPlan(
    ModuleOp module, StringRef passArgument,
    const planning::PlanOptions &options, function_ref<bool(PlanOp)> select,
    function_ref<LogicalResult(PlanOp, const PlanningContext &)> fn,
    const PlanningContext *given) {
  SmallVector<PlanOp> plans;
  module.walk([&](PlanOp plan) {
    if (select(plan))
      plans.push_back(plan);
  });
  if (plans.empty())
    return success();
  FailureOr<PlanningContext> context =
      getPlanningContext(module, passArgument, options, given);
  if (failed(context))
    return failure();
  for (PlanOp plan : plans)
    if (failed(fn(plan, *context)))
      return failure();
  return success();
}

StringRef kvc::compiler::getStepTier(Operation *step) {
  StringRef tier;
  step->walk([&](Operation *op) {
    if (auto fetch = dyn_cast<FetchOp>(op))
      tier = fetch.getSource().getTier();
    else if (auto store = dyn_cast<StoreOp>(op))
      tier = store.getTier();
    else
      return WalkResult::advance();
    return WalkResult::interrupt();
  });
  return tier;
}

bool kvc::compiler::holdsSegments(PlanOp plan) {
  return !plan.getBody().getOps<SegmentOp>().empty();
}

planning::Source kvc::compiler::getSource(SourceAttr source) {
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

SourceAttr kvc::compiler::getSourceAttr(MLIRContext *context,
                                        const planning::Source &source) {
  return SourceAttr::get(context, source.tier, fromVocabulary(source.form),
                         getCodecAttr(context, source.codec),
                         RangeAttr::get(context, source.box.t0, source.box.t1),
                         RangeAttr::get(context, source.box.l0, source.box.l1),
                         source.tokenGroup, source.layerGroup);
}

planning::Request kvc::compiler::getRequest(RestoreOp restore) {
  planning::Request request;
  request.tokens = restore.getTokens().getEnd();
  for (Attribute attr : restore.getSources())
    request.sources.push_back(getSource(cast<SourceAttr>(attr)));
  if (FloatAttr error = restore.getMaxErrorAttr())
    request.maxError = error.getValueAsDouble();
  if (FloatAttr kl = restore.getMaxKlAttr())
    request.maxKl = kl.getValueAsDouble();
  if (FloatAttr slo = restore.getSloMsAttr())
    request.sloSeconds = slo.getValueAsDouble() * 1e-3;
  request.forwardTokens = int64_t(restore.getForwardTokens().value_or(0));
  return request;
}

FailureOr<std::pair<planning::Request, planning::Plan>>
kvc::compiler::getSegmentPlan(PlanOp plan, int64_t layers) {
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

PlanOp kvc::compiler::buildPlanOp(OpBuilder &builder, Location loc,
                                  StringRef name,
                                  const planning::Request &request,
                                  const planning::Plan &plan, int64_t layers) {
  MLIRContext *context = builder.getContext();
  auto op = builder.create<PlanOp>(
      loc, name, RangeAttr::get(context, 0, request.tokens),
      RangeAttr::get(context, 0, layers), builder.getStringAttr(plan.strategy),
      /*prefill_step=*/IntegerAttr(), /*predicted_us=*/IntegerAttr());
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

std::optional<kvc::StepKind> kvc::compiler::getStepKind(Operation *op) {
  if (!isa<DataflowOpInterface>(op))
    return std::nullopt;
  return kvc::parseStepKind(op->getName().stripDialect());
}

Resource kvc::compiler::getResource(Operation *step) {
  std::optional<kvc::StepKind> kind = getStepKind(step);
  if (!kind)
    return Resource::compute; // A fused kernel runs on the device.
  bool onHost =
      step->getNumOperands() == 0 ||
      cast<ChunkType>(step->getOperand(0).getType()).getSpace() == Space::host;
  return fromVocabulary(kvc::planning::stepResource(*kind, onHost));
}

planning::Box kvc::compiler::getBox(RangeAttr tokens, RangeAttr layers) {
  return {tokens.getBegin(), tokens.getEnd(), layers.getBegin(),
          layers.getEnd()};
}

namespace {

/// `value` as the body of the task that produced it yields it, or as a
/// kernel's body is given it, through tasks that pass it on (itself
/// otherwise).
Value yielded(Value value) {
  while (true) {
    if (auto argument = dyn_cast<BlockArgument>(value)) {
      auto kernel = dyn_cast<KernelOp>(argument.getOwner()->getParentOp());
      if (!kernel)
        return value;
      value = kernel.getInputs()[argument.getArgNumber()];
      continue;
    }
    auto task = dyn_cast_or_null<TaskOp>(value.getDefiningOp());
    if (!task)
      return value;
    auto yield = cast<YieldOp>(task.getBody().front().getTerminator());
    value = yield->getOperand(cast<OpResult>(value).getResultNumber() - 1);
  }
}

/// The fetch of stored K and V that `value` comes from, moved and decoded
/// at most (not projected), across the tasks and kernels that carry it.
FetchOp fetchedKv(Value value) {
  while (true) {
    Operation *producer = yielded(value).getDefiningOp();
    if (auto fetch = dyn_cast_or_null<FetchOp>(producer))
      return cast<ChunkType>(fetch.getResult().getType()).getForm() == Form::kv
                 ? fetch
                 : FetchOp();
    if (!isa_and_nonnull<TransferToDeviceOp, DecompressOp, DequantOp,
                         UntransformOp>(producer))
      return {};
    value = producer->getOperand(0);
  }
}

} // namespace

StepCost kvc::compiler::getStepCost(Operation *step,
                                    const planning::CostModel &cost) {
  if (isa<KernelOp, TaskOp>(step)) {
    // A fused body or a task costs what its steps cost.
    StepCost total;
    total.priority = -1;
    step->getRegion(0).walk([&](Operation *inner) {
      if (!isa<DataflowOpInterface>(inner))
        return;
      StepCost c = getStepCost(inner, cost);
      total.seconds += c.seconds;
      total.priority = std::max(total.priority, c.priority);
    });
    total.priority = std::max(total.priority, 0);
    return total;
  }
  std::optional<kvc::StepKind> kind = getStepKind(step);
  if (!kind)
    return {};
  // The step as Pipeline.h describes it: what it reads and what it
  // produces, over its chunk's tokens and layers; a chunk a fetch or a recv
  // produced is as stored (through the task that yields it, if any), and
  // one that holds a fetch's K and V, decoded at most, is from a store.
  auto stateOf = [](Value value) {
    auto chunk = cast<ChunkType>(value.getType());
    Operation *producer = yielded(value).getDefiningOp();
    return planning::ChunkState{
        toVocabulary(chunk.getForm()), getCodecSpec(chunk.getCodec()),
        chunk.getSpace() == Space::device,
        isa_and_nonnull<FetchOp, RecvOp>(producer), bool(fetchedKv(value))};
  };
  Value chunk = step->getNumOperands() ? step->getOperand(0) : Value();
  Value result = step->getNumResults() ? step->getResult(0) : Value();
  planning::PipelineStep pipelineStep{*kind, {}, {}};
  pipelineStep.in = stateOf(chunk ? chunk : result);
  pipelineStep.out = stateOf(result ? result : chunk);
  auto compute = dyn_cast<ChunkComputeOp>(step);
  planning::Box extent =
      compute ? getBox(compute.getTokens(), compute.getLayers())
              : getBox(cast<ChunkType>((chunk ? chunk : result).getType()));
  // A fetch's tier, or the one the step's chunk was fetched from.
  const kvc::TierDesc *tier = nullptr;
  auto fetch = dyn_cast<FetchOp>(step);
  if (!fetch && chunk)
    fetch = dyn_cast_or_null<FetchOp>(yielded(chunk).getDefiningOp());
  if (fetch)
    tier = cost.target().findTier(fetch.getSource().getTier().str());
  return {planning::stepCost(cost, pipelineStep, extent, tier).seconds,
          planning::stepPriority(*kind)};
}

SmallVector<Value> kvc::compiler::stepInputs(Operation *step) {
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
