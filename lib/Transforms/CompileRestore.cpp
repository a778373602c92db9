//===- CompileRestore.cpp - The compiler as a call ------------------------===//
//
// compileRestore builds the module kvc-opt would read (model and target
// attributes, one kvc.restore per strategy) and runs kvc-restore-pipeline
// with kvc-plan's strategy set per module; compileChosen builds the kvc.plan
// a caller's planner already chose and runs the lowering alone, on the
// caller's cost model. Both build the bundle in memory from the module
// (buildPlanBundle, what kvc-emit-bundle writes), validated by the checks
// the runtime's parser runs on a bundle read from a file.
//
//===----------------------------------------------------------------------===//

#include "kvc/Transforms/CompileRestore.h"

#include "PlanningSupport.h"

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/EmitBundle.h"
#include "kvc/Conversion/KernelGen.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"

#include <cmath>

using namespace mlir;
using namespace kvc::compiler;

namespace {

/// The module holding `request` as `kvc.restore @name`.
OwningOpRef<ModuleOp> buildRequestModule(MLIRContext &context,
                                         const kvc::ModelConfig &model,
                                         const std::string &fingerprint,
                                         const kvc::TargetDesc &target,
                                         const kvc::planning::Request &request,
                                         StringRef name) {
  OpBuilder builder(&context);
  Location loc = builder.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  (*module)->setAttr(KVCDialect::kModelAttrName,
                     getModelAttr(&context, model, fingerprint));
  (*module)->setAttr(KVCDialect::kTargetAttrName,
                     getTargetAttr(&context, target));
  SmallVector<Attribute> sources;
  for (const kvc::planning::Source &source : request.sources)
    sources.push_back(getSourceAttr(&context, source));
  auto finite = [&](double value) {
    return std::isfinite(value) ? builder.getF64FloatAttr(value) : FloatAttr();
  };
  builder.setInsertionPointToEnd(module->getBody());
  builder.create<RestoreOp>(
      loc, name, RangeAttr::get(&context, 0, request.tokens),
      builder.getArrayAttr(sources), finite(request.sloSeconds * 1e3),
      finite(request.maxError), finite(request.maxKl),
      request.forwardTokens > 0
          ? builder.getI64IntegerAttr(request.forwardTokens)
          : IntegerAttr());
  return module;
}

/// One compile's MLIR context, with the kernel dialects loaded, and the
/// diagnostics it reports: errors kept for the status, warnings handed to
/// the caller.
class Compilation {
public:
  explicit Compilation(const kvc::CompileRestoreOptions &options)
      // The caller runs its own threads; the compile needs none.
      : context_(MLIRContext::Threading::DISABLED),
        handler_(&context_, [this, &options](Diagnostic &diag) {
          if (diag.getSeverity() == DiagnosticSeverity::Error)
            errors_ += (errors_.empty() ? "" : "; ") + diag.str();
          else if (diag.getSeverity() == DiagnosticSeverity::Warning &&
                   options.warnings)
            options.warnings->push_back(diag.str());
          return success();
        }) {
    DialectRegistry registry;
    registerKernelDialects(registry);
    context_.appendDialectRegistry(registry);
    context_.getOrLoadDialect<KVCDialect>();
  }

  MLIRContext &context() { return context_; }

  /// `options` with the GPU chip resolved: the target's where they name
  /// none, "none" where neither does (no kernels: the GPU dialects are not
  /// even loaded).
  static kvc::planning::PlanOptions withChip(kvc::planning::PlanOptions options,
                                             const kvc::TargetDesc &target) {
    if (options.gpuChip.empty())
      options.gpuChip = target.compute.chip;
    if (options.gpuChip.empty())
      options.gpuChip = "none";
    return options;
  }

  /// Runs `pm` over `module` and builds its plans' bundle, validated as
  /// the runtime validates a bundle it reads; errors name `what`. The
  /// module is verified once, after the last pass: verifying after every
  /// pass (kvc-opt's default, which the lit tests run) took half the
  /// compile of a long plan.
  kvc::StatusOr<kvc::PlanBundle> run(PassManager &pm, ModuleOp module,
                                     const std::string &what) {
    pm.enableVerifier(false);
    FailureOr<kvc::PlanBundle> bundle = failure();
    if (succeeded(pm.run(module)) && succeeded(verify(module)))
      bundle = buildPlanBundle(module);
    if (failed(bundle))
      return kvc::failedPrecondition("compiling " + what + ": " + errors_);
    if (kvc::Status valid = kvc::validatePlanBundle(*bundle); !valid.isOk())
      return valid.withContext("the compiled " + what);
    return std::move(*bundle);
  }

private:
  MLIRContext context_;
  std::string errors_;
  ScopedDiagnosticHandler handler_;
};

} // namespace

namespace kvc {

StatusOr<PlanBundle> compileRestore(const ModelConfig &model,
                                    const std::string &fingerprint,
                                    const TargetDesc &target,
                                    const planning::Request &request,
                                    const CompileRestoreOptions &options) {
  Compilation compilation(options);
  PlanBundle bundle;
  bundle.modelFingerprint = fingerprint;
  const planning::PlanOptions planOptions =
      Compilation::withChip(options.plan, target);
  std::vector<planning::Strategy> strategies = options.plan.strategies;
  if (strategies.empty())
    strategies = planning::strategiesFor(request.sources);
  for (planning::Strategy each : strategies) {
    const std::string strategy = planning::strategyName(each);
    OwningOpRef<ModuleOp> module = buildRequestModule(
        compilation.context(), model, fingerprint, target, request, strategy);
    PassManager pm(&compilation.context());
    RestorePipelineOptions pipeline;
    pipeline.wrap(planOptions, each);
    buildRestorePipeline(pm, pipeline);
    KVC_ASSIGN_OR_RETURN(
        compiled, compilation.run(pm, *module, "a " + strategy + " plan"));
    for (BundlePlan &plan : compiled.plans)
      bundle.plans.push_back(std::move(plan));
    // Kernels of one specialization are the same code in every plan.
    for (BundleKernel &kernel : compiled.kernels)
      if (!bundle.findKernel(kernel.name))
        bundle.kernels.push_back(std::move(kernel));
  }
  return bundle;
}

StatusOr<PlanBundle>
compileChosen(const ModelConfig &model, const std::string &fingerprint,
              std::shared_ptr<const planning::CostModel> cost,
              const planning::Request &request, const std::string &name,
              const planning::Evaluation &chosen,
              const CompileRestoreOptions &options) {
  if (!cost)
    return invalidArgument("compileChosen: no cost model");
  Compilation compilation(options);
  MLIRContext &context = compilation.context();
  OpBuilder builder(&context);
  Location loc = builder.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  ModelAttr modelAttr = getModelAttr(&context, model, fingerprint);
  (*module)->setAttr(KVCDialect::kModelAttrName, modelAttr);
  (*module)->setAttr(KVCDialect::kTargetAttrName,
                     getTargetAttr(&context, cost->target()));
  // The plan as kvc-plan would have written it, from the choice made.
  builder.setInsertionPointToEnd(module->getBody());
  PlanOp plan =
      buildPlanOp(builder, loc, name, request, chosen.plan, model.numLayers);
  plan.setPredictedUsAttr(
      builder.getI64IntegerAttr(std::llround(chosen.seconds * 1e6)));

  auto given = std::make_shared<compiler::PlanningContext>();
  given->options = Compilation::withChip(options.plan, cost->target());
  given->cost = std::move(cost);
  given->layers = modelAttr.getLayers();
  given->elementType = modelAttr.getDtype();
  PassManager pm(&context);
  buildLoweringPipeline(pm, given->options, given);
  return compilation.run(pm, *module, "the chosen " + name + " plan");
}

} // namespace kvc
