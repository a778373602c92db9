//===- PlanningBench.cpp - How long planning a request takes --------------===//
//
// A server plans per request, so planning must cost far less than restoring.
// The request: Llama-2-70B's shape (80 layers, GQA with 8 KV heads), 32K
// tokens, int8 KV on the SSD and hidden states in DRAM, on an H100.
//
//   build/bench/kvc-planning-bench --benchmark_repetitions=10 \
//       --benchmark_report_aggregates_only=true
//
// reports the median (p50) of each:
//   JointSearch      the analytic search over the whole space
//   Joint            the search plus its simulations and every baseline
//   RestorePipeline  kvc-restore-pipeline end to end on the IR (plan,
//                    expand, fuse, schedule, estimate)
//
//===----------------------------------------------------------------------===//

#include "kvc/Dialect/KVC/IR/KVCDialect.h"
#include "kvc/Planning/Planner.h"
#include "kvc/Transforms/Descriptions.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <benchmark/benchmark.h>

using namespace kvc;
using namespace kvc::planning;

namespace {

constexpr int64_t kTokens = 32768;

ModelConfig llama70b() {
  ModelConfig m;
  m.name = "llama-2-70b";
  m.numLayers = 80;
  m.hiddenSize = 8192;
  m.numHeads = 64;
  m.numKvHeads = 8;
  m.headDim = 128;
  m.intermediateSize = 28672;
  m.vocabSize = 32000;
  m.maxPositions = 32768;
  m.dtype = DType::BF16;
  return m;
}

TargetDesc h100() {
  return *loadTargetDesc(std::string(KVC_SOURCE_DIR) +
                         "/targets/h100-sxm.json");
}

Request request() {
  Request r;
  r.tokens = kTokens;
  CodecSpec int8;
  int8.quant = CodecSpec::Quant::Int8;
  int8.lossless = CodecSpec::Lossless::Zstd;
  r.sources = {Source{"ssd", Form::KV, int8, Box{0, kTokens, 0, 80}},
               Source{"dram", Form::Hidden, CodecSpec(), Box{0, kTokens, 0, 80}}};
  return r;
}

void JointSearch(benchmark::State &state) {
  CostModel cost(llama70b(), h100(), CodecProfile::defaults());
  Planner planner(cost, request());
  for (auto _ : state)
    benchmark::DoNotOptimize(planner.bestEstimate());
}
BENCHMARK(JointSearch)->Unit(benchmark::kMicrosecond);

void Joint(benchmark::State &state) {
  CostModel cost(llama70b(), h100(), CodecProfile::defaults());
  Planner planner(cost, request());
  double predicted = 0;
  for (auto _ : state)
    predicted = planner.joint().seconds;
  state.counters["predicted_restore_ms"] = predicted * 1e3;
}
BENCHMARK(Joint)->Unit(benchmark::kMillisecond);

void RestorePipeline(benchmark::State &state) {
  mlir::MLIRContext context;
  context.loadDialect<kvc::compiler::KVCDialect, mlir::func::FuncDialect>();
  const char *ir = R"mlir(
    kvc.restore @chat tokens 0 to 32768 from [
      #kvc.source<tier = "ssd", form = kv, codec = <quant = int8, lossless = zstd>,
                  tokens = 0 to 32768, layers = 0 to 80>,
      #kvc.source<tier = "dram", form = hidden, tokens = 0 to 32768, layers = 0 to 80>]
  )mlir";
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(ir, &context);
  (*module)->setAttr(kvc::compiler::KVCDialect::kModelAttrName,
                     kvc::compiler::getModelAttr(&context, llama70b()));
  (*module)->setAttr(kvc::compiler::KVCDialect::kTargetAttrName,
                     kvc::compiler::getTargetAttr(&context, h100()));
  for (auto _ : state) {
    state.PauseTiming();
    mlir::OwningOpRef<mlir::ModuleOp> copy = module->clone();
    mlir::PassManager pm(&context);
    kvc::compiler::buildRestorePipeline(pm, {});
    state.ResumeTiming();
    if (mlir::failed(pm.run(*copy)))
      state.SkipWithError("kvc-restore-pipeline failed");
  }
}
BENCHMARK(RestorePipeline)->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
