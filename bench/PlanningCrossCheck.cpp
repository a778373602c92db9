//===- PlanningCrossCheck.cpp - The planner against the papers' tables ----===//
//
// Prints, as Markdown, what the planner predicts for the setups of HCache
// Table 3 and the grid of Cake Table 3, beside the papers' numbers. The
// output is docs/planning.md's cross-check section:
//
//   build/bench/kvc-planning-crosscheck [KVC_SOURCE_DIR]
//
//===----------------------------------------------------------------------===//

#include "kvc/Planning/Planner.h"

#include <cstdio>
#include <string>

using namespace kvc;
using namespace kvc::planning;

namespace {

std::string sourceDir = KVC_SOURCE_DIR;

TargetDesc target(const char *name) {
  StatusOr<TargetDesc> t =
      loadTargetDesc(sourceDir + "/targets/" + name + ".json");
  if (!t.isOk()) {
    std::fprintf(stderr, "%s\n", t.status().toString().c_str());
    std::exit(1);
  }
  return *t;
}

ModelConfig llama(const char *name, int64_t layers, int64_t hidden,
                  int64_t heads, int64_t ffn) {
  ModelConfig m;
  m.name = name;
  m.numLayers = layers;
  m.hiddenSize = hidden;
  m.numHeads = heads;
  m.numKvHeads = heads;
  m.headDim = hidden / heads;
  m.intermediateSize = ffn;
  m.vocabSize = 32000;
  m.maxPositions = 32768;
  m.dtype = DType::F16;
  return m;
}

Source stored(const char *tier, Form form, int64_t tokens, int64_t layers) {
  return Source{tier, form, CodecSpec(), Box{0, tokens, 0, layers}};
}

/// "31 H + 1 KV" from an HCache-style plan.
std::string schedule(const Plan &plan) {
  std::string text;
  for (const Segment &s : plan.segments) {
    const char *what = s.method == Method::LoadHidden ? "H"
                       : s.method == Method::LoadKV   ? "KV"
                                                      : "RE";
    text += (text.empty() ? "" : " + ") + std::to_string(s.box.layers()) +
            " " + what;
    if (s.box.t0 != 0)
      text += " (tokens " + std::to_string(s.box.t0) + "+)";
  }
  return text;
}

void hcacheTable() {
  std::printf("### HCache Table 3: layer schedules\n\n");
  std::printf("4096-token context, hidden states and KV both stored raw on "
              "the SSDs.\n\n");
  std::printf("| model | machine | HCache (paper) | kvc-plan{strategy=hcache} | "
              "predicted | hidden-only | KV-only | kvc-plan (joint) |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  struct Row {
    const char *paper;
    ModelConfig model;
    const char *machine;
    TargetDesc target;
  };
  // OPT-30B as a Llama-shaped model of equal size: 48 layers, hidden 7168,
  // 56 heads, and an MLP of 2 x 28672 weights per layer (3 x 19115).
  TargetDesc a100 = target("a100-40gb");
  TargetDesc tp4 = a100; // 4 x A100, one SSD each, tensor parallel.
  tp4.name = "4xa100-40gb";
  tp4.compute.denseTflops *= 4;
  tp4.compute.memGBs *= 4;
  tp4.link.h2dGBs *= 4;
  for (TierDesc &t : tp4.tiers)
    if (t.name == "ssd")
      t.readGBs = 4 * 6.9, t.lanes = 4;
  Row rows[] = {
      {"31 H + 1 KV", llama("Llama2-7B", 32, 4096, 32, 11008),
       "1x A100-40GB, 4 SSDs", a100},
      {"36 H + 4 KV", llama("Llama2-13B", 40, 5120, 40, 13824),
       "1x A100-40GB, 4 SSDs", a100},
      {"40 H + 8 RE", llama("OPT-30B", 48, 7168, 56, 19115),
       "4x A100-40GB, 1 SSD each", tp4},
  };
  for (const Row &row : rows) {
    CostModel cost(row.model, row.target, CodecProfile::defaults());
    Request r;
    r.tokens = 4096;
    int64_t layers = row.model.numLayers;
    r.sources = {stored("ssd", Form::Hidden, r.tokens, layers),
                 stored("ssd", Form::KV, r.tokens, layers)};
    Planner planner(cost, r);
    Evaluation hcache = *planner.hcache();
    Evaluation joint = planner.joint();
    std::printf("| %s | %s | %s | %s | %.1f ms | %.1f ms | %.1f ms | %s, "
                "%.1f ms |\n",
                row.model.name.c_str(), row.machine, row.paper,
                schedule(hcache.plan).c_str(), hcache.seconds * 1e3,
                planner.hiddenOnly()->seconds * 1e3,
                planner.kvOnly()->seconds * 1e3, schedule(joint.plan).c_str(),
                joint.seconds * 1e3);
  }
  std::printf("\n");
}

void cakeTable() {
  std::printf("### Cake Table 3: speedup over IO-only \\ compute-only\n\n");
  std::printf("LongAlpaca-13B (Llama-2-13B shape), 16K tokens, 512-token "
              "chunks, raw fp16 KV behind a link of the given bandwidth. "
              "Each cell: paper, then kvc-plan{strategy=cake}'s prediction "
              "(and the merge point, in tokens computed).\n\n");
  const double gbps[] = {7, 25, 32, 56, 100};
  const double utils[] = {0.125, 0.5, 0.875, 1.0};
  struct Hw {
    const char *name;
    TargetDesc target;
    double paper[4][5][2];
  };
  TargetDesc a100 = target("a100-80gb");
  TargetDesc h100 = target("h100-sxm");
  TargetDesc a100x2 = a100; // Tensor parallel over two A100s (NVLink).
  a100x2.compute.denseTflops *= 2;
  a100x2.compute.memGBs *= 2;
  // Cake's own H100 numbers imply its chunked prefill reached only 1.31x the
  // A100's speed (compute-only time at 100%, 32 Gbps: 0.73 vs 0.955 of the
  // IO-only time), not the datasheet's 3.17x: one fitted number.
  TargetDesc h100fit = h100;
  h100fit.compute.gemmPeakFraction = 0.75 * 1.31 / 3.17;
  Hw hws[] = {
      {"2xA100",
       a100x2,
       {{{1.87, 2.18}, {1.25, 5.06}, {1.18, 6.12}, {1.09, 9.54}, {1.04, 15.27}},
        {{4.57, 1.29}, {2.07, 2.03}, {1.80, 2.24}, {1.46, 3.06}, {1.30, 4.62}},
        {{7.22, 1.15}, {2.75, 1.53}, {2.36, 1.67}, {1.83, 2.17}, {1.50, 3.02}},
        {{8.10, 1.10}, {3.03, 1.43}, {2.63, 1.59}, {1.97, 2.00}, {1.54, 2.64}}}},
      {"A100",
       a100,
       {{{1.57, 2.85}, {1.14, 7.22}, {1.10, 8.95}, {1.03, 14.06}, {1.02, 23.59}},
        {{3.35, 1.46}, {1.68, 2.55}, {1.55, 3.01}, {1.30, 4.26}, {1.17, 6.48}},
        {{5.05, 1.26}, {2.18, 1.88}, {1.90, 2.10}, {1.56, 2.91}, {1.30, 4.07}},
        {{5.62, 1.21}, {2.41, 1.81}, {2.00, 1.91}, {1.69, 2.71}, {1.30, 3.52}}}},
      {"H100",
       h100,
       {{{1.74, 2.40}, {1.21, 5.80}, {1.13, 6.90}, {1.08, 11.08}, {1.05, 18.24}},
        {{4.13, 1.38}, {1.94, 2.25}, {1.72, 2.55}, {1.45, 3.62}, {1.27, 5.34}},
        {{6.23, 1.17}, {2.53, 1.66}, {2.23, 1.86}, {1.74, 2.44}, {1.50, 3.54}},
        {{7.13, 1.17}, {2.74, 1.56}, {2.40, 1.75}, {1.84, 2.25}, {1.49, 3.08}}}},
      {"H100 (fitted)",
       h100fit,
       {{{1.74, 2.40}, {1.21, 5.80}, {1.13, 6.90}, {1.08, 11.08}, {1.05, 18.24}},
        {{4.13, 1.38}, {1.94, 2.25}, {1.72, 2.55}, {1.45, 3.62}, {1.27, 5.34}},
        {{6.23, 1.17}, {2.53, 1.66}, {2.23, 1.86}, {1.74, 2.44}, {1.50, 3.54}},
        {{7.13, 1.17}, {2.74, 1.56}, {2.40, 1.75}, {1.84, 2.25}, {1.49, 3.08}}}},
  };
  ModelConfig model = llama("LongAlpaca-13B", 40, 5120, 40, 13824);
  std::printf("| hardware | util |");
  for (double g : gbps)
    std::printf(" %.0f Gbps |", g);
  std::printf("\n|---|---|---|---|---|---|---|\n");
  double sumIo = 0, sumCompute = 0;
  int cells = 0;
  for (const Hw &hw : hws) {
    double hwIo = 0, hwCompute = 0;
    for (int u = 0; u < 4; ++u) {
      std::printf("| %s | %.1f%% |", hw.name, utils[u] * 100);
      for (int g = 0; g < 5; ++g) {
        TargetDesc t = hw.target;
        t.compute.restoreShare = utils[u];
        t.tiers = {TierDesc{"net", TierDesc::Kind::Remote, gbps[g] / 8,
                            gbps[g] / 8, 100, 1}};
        CostModel cost(model, t, CodecProfile::defaults());
        Request r;
        r.tokens = 16384;
        r.sources = {stored("net", Form::KV, r.tokens, model.numLayers)};
        PlanOptions options;
        options.chunkTokens = 512;
        Planner planner(cost, r, options);
        Evaluation cake = *planner.cake();
        double io = planner.kvOnly()->seconds / cake.seconds;
        double compute = planner.computeOnly().seconds / cake.seconds;
        int64_t merge = cake.plan.segments[0].method == Method::Compute
                            ? cake.plan.segments[0].box.t1
                            : 0;
        std::printf(" %.2f\\%.2f / **%.2f\\%.2f** (%ld) |", hw.paper[u][g][0],
                    hw.paper[u][g][1], io, compute, long(merge));
        hwIo += io / hw.paper[u][g][0];
        hwCompute += compute / hw.paper[u][g][1];
      }
      std::printf("\n");
    }
    std::printf("| %s | mean predicted/paper | %.2f over IO-only, %.2f over "
                "compute-only | | | | |\n",
                hw.name, hwIo / 20, hwCompute / 20);
    sumIo += hwIo;
    sumCompute += hwCompute;
    cells += 20;
  }
  std::printf("\nMean ratio predicted/paper over all %d cells: %.2f (over "
              "IO-only), %.2f (over compute-only).\n\n",
              cells, sumIo / cells, sumCompute / cells);
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1)
    sourceDir = argv[1];
  hcacheTable();
  cakeTable();
  return 0;
}
