//===- CompileRestore.cpp - The compiler as a call ------------------------===//
//
// Builds the module kvc-opt would read (model and target attributes, one
// kvc.restore per strategy), runs kvc-restore-pipeline with kvc-plan's
// strategy set per module, and reads the written bundle back through the
// runtime's validating parser, so an in-process compile and a kvc-opt run
// produce the same plans and face the same checks.
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

} // namespace

namespace kvc {

StatusOr<PlanBundle> compileRestore(const ModelConfig &model,
                                    const std::string &fingerprint,
                                    const TargetDesc &target,
                                    const planning::Request &request,
                                    const CompileRestoreOptions &options) {
  // The caller runs its own threads; the compile needs none.
  MLIRContext context(MLIRContext::Threading::DISABLED);
  DialectRegistry registry;
  registerKernelDialects(registry);
  context.appendDialectRegistry(registry);
  context.getOrLoadDialect<KVCDialect>();
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (diag.getSeverity() == DiagnosticSeverity::Error)
      diagnostics += (diagnostics.empty() ? "" : "; ") + diag.str();
    else if (diag.getSeverity() == DiagnosticSeverity::Warning &&
             options.warnings)
      options.warnings->push_back(diag.str());
    return success();
  });

  PlanBundle bundle;
  bundle.modelFingerprint = fingerprint;
  std::vector<planning::Strategy> strategies = options.plan.strategies;
  if (strategies.empty())
    strategies = planning::strategiesFor(request.sources);
  for (planning::Strategy each : strategies) {
    const std::string strategy = planning::strategyName(each);
    OwningOpRef<ModuleOp> module = buildRequestModule(
        context, model, fingerprint, target, request, strategy);
    PassManager pm(&context);
    RestorePipelineOptions pipeline;
    pipeline.wrap(options.plan, each);
    buildRestorePipeline(pm, pipeline);
    std::string json;
    llvm::raw_string_ostream os(json);
    if (failed(pm.run(*module)) || failed(writePlanBundle(*module, os)))
      return Status(StatusCode::FailedPrecondition,
                    "compiling a " + strategy + " plan: " + diagnostics);
    StatusOr<PlanBundle> compiled = parsePlanBundle(json);
    if (!compiled.isOk())
      return compiled.status().withContext("the compiled " + strategy +
                                           " plan");
    for (BundlePlan &plan : compiled->plans)
      bundle.plans.push_back(std::move(plan));
    // Kernels of one specialization are the same code in every plan.
    for (BundleKernel &kernel : compiled->kernels)
      if (!bundle.findKernel(kernel.name))
        bundle.kernels.push_back(std::move(kernel));
  }
  return bundle;
}

} // namespace kvc
