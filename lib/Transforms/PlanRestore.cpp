//===- PlanRestore.cpp - What the restore planners share ------------------===//

#include "PlanRestore.h"

#include "llvm/Support/Format.h"

namespace kvc::compiler {

namespace planning = kvc::planning;

/// "12.3 ms".
std::string ms(double seconds) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.3f ms", seconds * 1e3);
  return text;
}

namespace {

/// What a plan chose, segment by segment: "compute tokens 0-512 layers
/// 0-32; load kv tokens 512-4096 layers 0-32 (dram, int8/g32+deflate)".
std::string describePlan(const planning::Plan &plan,
                         const planning::Request &request) {
  std::string text;
  llvm::raw_string_ostream os(text);
  for (const planning::Segment &segment : plan.segments) {
    if (!text.empty())
      os << "; ";
    os << (segment.method == planning::Method::Compute  ? "compute"
           : segment.method == planning::Method::LoadKV ? "load kv"
                                                        : "load hidden")
       << " tokens " << segment.box.t0 << "-" << segment.box.t1 << " layers "
       << segment.box.l0 << "-" << segment.box.l1;
    if (segment.method != planning::Method::Compute && segment.source >= 0) {
      const planning::Source &source = request.sources[segment.source];
      os << " (" << source.tier << ", " << source.codec.str() << ")";
    }
  }
  return text;
}

} // namespace

/// The report of kvc-plan{report}: one line per baseline and for the chosen
/// plan, with when layer 0 is complete (and, for a request with a forward
/// pass, when its first token is), busy time per resource, bytes, FLOPs and
/// its time over the chosen plan's; then what each chose.
std::string formatReport(const planning::Planner &planner,
                         const planning::Request &request,
                         const std::vector<planning::Evaluation> &rows) {
  std::vector<std::string> resources;
  for (const planning::Evaluation &e : rows)
    for (const std::string &r : e.resources)
      if (llvm::find(resources, r) == resources.end())
        resources.push_back(r);
  std::string text;
  llvm::raw_string_ostream os(text);
  const planning::Evaluation &chosen = rows.back();
  const bool forward = request.forwardTokens > 0;
  const char *strategy = "strategy", *makespan = "makespan";
  const char *layer0 = "layer 0", *firstToken = "first token";
  const char *read = "read GB", *tflop = "TFLOP", *ratio = "time/chosen";
  os << llvm::format("%-9s %14s %14s", strategy, makespan, layer0);
  if (forward)
    os << llvm::format(" %14s", firstToken);
  for (const std::string &r : resources)
    os << llvm::format(" %14s", r.c_str());
  os << llvm::format(" %10s %10s %11s\n", read, tflop, ratio);
  for (const planning::Evaluation &e : rows) {
    os << llvm::format(
        "%-9s %14s %14s", e.plan.strategy.c_str(), ms(e.seconds).c_str(),
        ms(e.layerReadySeconds.empty() ? e.seconds
                                       : e.layerReadySeconds.front())
            .c_str());
    if (forward)
      os << llvm::format(" %14s", ms(e.firstTokenSeconds).c_str());
    for (const std::string &r : resources) {
      double busy = 0;
      for (size_t i = 0; i < e.resources.size(); ++i)
        if (e.resources[i] == r)
          busy = e.busy[i];
      os << llvm::format(" %14s", ms(busy).c_str());
    }
    os << llvm::format(" %10.3f %10.3f %10.2fx\n", e.bytesRead / 1e9,
                       e.flops / 1e12,
                       e.firstTokenSeconds / chosen.firstTokenSeconds);
  }
  if (forward)
    os << "(layer 0: when it holds every token; first token: when the "
          "server's forward pass over "
       << request.forwardTokens
       << " tokens ends beside the restore, its layers on the compute "
          "counted in its busy time; time/chosen: each plan's first token "
          "over the chosen "
       << chosen.plan.strategy << " plan's)\n";
  else
    os << "(layer 0: when it holds every token; time/chosen: each plan's "
          "makespan over the chosen "
       << chosen.plan.strategy << " plan's)\n";
  for (const planning::Evaluation &e : rows)
    os << llvm::format("%-9s ", e.plan.strategy.c_str())
       << describePlan(e.plan, request) << "\n";
  os << "chunks of " << planner.chunkTokens() << " tokens, loads of "
     << planner.loadLayers() << " layers each"
     << (planner.options().layerWise ? ", issued layer by layer" : "");
  return text;
}

} // namespace kvc::compiler
