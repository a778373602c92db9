//===- PlanBundleTest.cpp - Plan bundle reading and validation ------------===//

#include "kvc/Runtime/Exec/PlanBundle.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>

using namespace kvc;
using Json = nlohmann::json;

namespace {

/// One KV chunk per round through a single staging slot: fetch, decompress,
/// copy, then the fused dequant-scatter kernel; the second fetch refills the
/// slot after the first chunk's copy.
Json validBundle() {
  auto step = [](const char *op, int64_t begin, int64_t end,
                 const char *codec) {
    Json s = {{"op", op},         {"form", "kv"},
              {"tokens", {begin, end}}, {"layers", {0, 4}},
              {"codec", codec}};
    if (std::string(op) == "fetch") {
      s["tier"] = "ssd";
      s["predicted_bytes"] = 4096;
    }
    return s;
  };
  Json tasks = Json::array();
  for (int64_t chunk = 0; chunk < 2; ++chunk) {
    int64_t base = chunk * 4, begin = chunk * 512, end = begin + 512;
    Json fetch = {{"id", base},
                  {"resource", "io"},
                  {"lane", chunk},
                  {"slot", 0},
                  {"steps", {step("fetch", begin, end, "int8+zstd")}}};
    if (chunk > 0)
      fetch["after"] = {base - 2};
    tasks.push_back(fetch);
    tasks.push_back({{"id", base + 1},
                     {"resource", "decode"},
                     {"lane", 0},
                     {"after", {base}},
                     {"inputs", {base}},
                     {"steps", {step("decompress", begin, end, "int8+zstd")}}});
    tasks.push_back({{"id", base + 2},
                     {"resource", "h2d"},
                     {"lane", 0},
                     {"after", {base + 1}},
                     {"inputs", {base + 1}},
                     {"steps", {step("transfer_to_device", begin, end, "int8")}}});
    tasks.push_back({{"id", base + 3},
                     {"resource", "compute"},
                     {"lane", 0},
                     {"after", {base + 2}},
                     {"inputs", {base + 2}},
                     {"kernel", "dequant_scatter"},
                     {"predicted_ns", {100, 200}},
                     {"steps",
                      {step("dequant", begin, end, "int8"),
                       step("scatter", begin, end, "raw")}}});
  }
  return {{"format", "kvc-plan-bundle"},
          {"version", 1},
          {"model_fingerprint", "abc123"},
          {"plans",
           {{{"name", "p"},
             {"tokens", {0, 1024}},
             {"layers", {0, 4}},
             {"predicted_us", 42},
             {"staging_slots", 1},
             {"tasks", tasks}}}}};
}

/// The error parsing `bundle` after `edit` gives ("" when it parses).
std::string errorAfter(const std::function<void(Json &)> &edit) {
  Json bundle = validBundle();
  edit(bundle);
  StatusOr<PlanBundle> parsed = parsePlanBundle(bundle.dump());
  return parsed ? "" : parsed.status().message();
}

Json &task(Json &bundle, int index) {
  return bundle["plans"][0]["tasks"][index];
}

TEST(PlanBundleTest, ReadsEveryField) {
  StatusOr<PlanBundle> parsed = parsePlanBundle(validBundle().dump());
  ASSERT_TRUE(parsed) << parsed.status().toString();
  EXPECT_EQ(parsed->modelFingerprint, "abc123");
  const BundlePlan *plan = parsed->findPlan("p");
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(parsed->findPlan("q"), nullptr);
  EXPECT_EQ(plan->tokens, (BundleRange{0, 1024}));
  EXPECT_EQ(plan->predictedUs, 42);
  EXPECT_EQ(plan->stagingSlots, 1);
  ASSERT_EQ(plan->tasks.size(), 8u);
  const BundleTask &fetch = plan->tasks[4];
  EXPECT_EQ(fetch.resource, Resource::IO);
  EXPECT_EQ(fetch.lane, 1);
  EXPECT_EQ(fetch.slot, 0);
  EXPECT_EQ(fetch.after, std::vector<int64_t>{2});
  EXPECT_EQ(fetch.steps[0].tier, "ssd");
  EXPECT_EQ(fetch.steps[0].codec.str(), "int8/g32+zstd");
  EXPECT_EQ(fetch.steps[0].tokens, (BundleRange{512, 1024}));
  EXPECT_EQ(fetch.steps[0].predictedBytes, 4096);
  EXPECT_FALSE(plan->tasks[1].steps[0].predictedBytes.has_value());
  const BundleTask &kernel = plan->tasks[3];
  EXPECT_EQ(kernel.kernel, "dequant_scatter");
  EXPECT_FALSE(kernel.slot.has_value());
  ASSERT_EQ(kernel.steps.size(), 2u);
  EXPECT_EQ(kernel.steps[1].kind, StepKind::Scatter);
  EXPECT_TRUE(kernel.steps[1].codec.isRaw());
  EXPECT_EQ(kernel.predictedNs, std::make_pair(int64_t(100), int64_t(200)));
}

TEST(PlanBundleTest, SameScheduleIgnoresNamesAndPredictionsOnly) {
  auto planAfter = [](const std::function<void(Json &)> &edit) {
    Json bundle = validBundle();
    edit(bundle);
    StatusOr<PlanBundle> parsed = parsePlanBundle(bundle.dump());
    EXPECT_TRUE(parsed) << parsed.status().toString();
    return parsed->plans.front();
  };
  BundlePlan base = planAfter([](Json &) {});
  EXPECT_TRUE(base.sameSchedule(planAfter([](Json &b) {
    b["plans"][0]["name"] = "joint";
    b["plans"][0]["predicted_us"] = 7;
    task(b, 3)["predicted_ns"] = {1, 2};
    task(b, 0)["steps"][0]["predicted_bytes"] = 7;
  })));
  EXPECT_FALSE(base.sameSchedule(
      planAfter([](Json &b) { task(b, 4)["lane"] = 0; })));
  EXPECT_FALSE(base.sameSchedule(planAfter(
      [](Json &b) { task(b, 1)["steps"][0]["codec"] = "int8+lz4"; })));
  EXPECT_FALSE(base.sameSchedule(
      planAfter([](Json &b) { task(b, 3)["kernel"] = "other"; })));
  EXPECT_FALSE(base.sameSchedule(planAfter([](Json &b) {
    b["plans"][0]["tasks"].erase(7);
    b["plans"][0]["tasks"].erase(6);
    b["plans"][0]["tasks"].erase(5);
    b["plans"][0]["tasks"].erase(4);
    b["plans"][0]["tokens"] = {0, 512};
  })));
}

TEST(PlanBundleTest, RejectsMalformedAndTruncatedText) {
  std::string text = validBundle().dump();
  for (std::size_t cut : {std::size_t(0), std::size_t(1), text.size() / 2,
                          text.size() - 1}) {
    StatusOr<PlanBundle> parsed = parsePlanBundle(text.substr(0, cut));
    ASSERT_FALSE(parsed) << "cut at " << cut;
    EXPECT_NE(parsed.status().message().find("invalid JSON"),
              std::string::npos);
  }
  // A number beyond a double is malformed text too, not a crash.
  StatusOr<PlanBundle> huge = parsePlanBundle(R"({"version": 1E1072})");
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.status().message(),
            "invalid JSON: number overflow parsing '1E1072'");
  EXPECT_EQ(errorAfter([](Json &b) { b = Json::array(); }),
            "document: expected a JSON object");
  EXPECT_EQ(errorAfter([](Json &b) { b["format"] = "other"; }),
            "format: expected \"kvc-plan-bundle\", got \"other\"");
  EXPECT_EQ(errorAfter([](Json &b) { b["plans"][0].erase("tasks"); }),
            "plans[0].tasks: missing required field");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 1)["steps"] = Json::array(); }),
            "plans[0].tasks[1].steps: a task runs steps");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 1)["after"] = "0"; }),
            "plans[0].tasks[1].after: expected an array, got string");
}

TEST(PlanBundleTest, RejectsUnknownVersion) {
  EXPECT_EQ(errorAfter([](Json &b) { b["version"] = 5; }),
            "version: unsupported plan bundle version 5 (this runtime reads "
            "versions 1 to 4)");
  EXPECT_EQ(errorAfter([](Json &b) { b["version"] = 0; }),
            "version: unsupported plan bundle version 0 (this runtime reads "
            "versions 1 to 4)");
}

TEST(PlanBundleTest, RejectsBadFields) {
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["resource"] = "gpu"; }),
            "plans[0].tasks[0].resource: unknown value \"gpu\" (expected one "
            "of io, decode, h2d, d2h, compute, net)");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["lane"] = -1; }),
            "plans[0].tasks[0].lane: must be >= 0");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["steps"][0]["form"] = "x"; }),
            "plans[0].tasks[0].steps[0].form: unknown value \"x\" (expected "
            "one of kv, hidden)");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["steps"][0]["op"] = "fly"; }),
            "plans[0].tasks[0].steps[0].op: unknown value \"fly\" (expected "
            "one of fetch, decompress, dequant, untransform, "
            "transfer_to_device, transfer_to_host, transform, quant, "
            "compress, project, chunk_compute, scatter, gather, store, send, "
            "recv)");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["steps"][0].erase("tier"); }),
            "plans[0].tasks[0].steps[0].tier: a fetch must name its tier");
  EXPECT_EQ(
      errorAfter([](Json &b) { task(b, 0)["steps"][0]["tokens"] = {5, 5}; }),
      "plans[0].tasks[0].steps[0].tokens: expected [begin, end] with 0 <= "
      "begin < end");
  EXPECT_EQ(
      errorAfter([](Json &b) { task(b, 0)["steps"][0]["layers"] = {0, 8}; }),
      "plans[0].tasks[0].steps[0].layers: outside the plan's layers");
  EXPECT_NE(
      errorAfter([](Json &b) { task(b, 0)["steps"][0]["codec"] = "int3"; })
          .find("plans[0].tasks[0].steps[0].codec: "),
      std::string::npos);
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 3)["predicted_ns"] = {9, 1}; }),
            "plans[0].tasks[3].predicted_ns: expected [start, finish] with "
            "start <= finish");
  EXPECT_EQ(errorAfter(
                [](Json &b) { task(b, 0)["steps"][0]["predicted_bytes"] = -1; }),
            "plans[0].tasks[0].steps[0].predicted_bytes: expected a fetch's "
            "bytes, >= 0");
  EXPECT_EQ(errorAfter(
                [](Json &b) { task(b, 1)["steps"][0]["predicted_bytes"] = 9; }),
            "plans[0].tasks[1].steps[0].predicted_bytes: expected a fetch's "
            "bytes, >= 0");
}

// A save's or a sender's prefill step: read, part of its schedule, and
// refused where it cannot mean anything.
TEST(PlanBundleTest, ReadsASavePlansPrefillStep) {
  Json gather = {{"op", "gather"},
                 {"form", "kv"},
                 {"tokens", {0, 256}},
                 {"layers", {0, 4}},
                 {"codec", "raw"}};
  Json store = gather;
  store["op"] = "store";
  store["tier"] = "ssd";
  Json bundle = {{"format", "kvc-plan-bundle"},
                 {"version", 3},
                 {"model_fingerprint", ""},
                 {"plans",
                  {{{"name", "s"},
                    {"tokens", {0, 256}},
                    {"layers", {0, 4}},
                    {"prefill_step", 256},
                    {"staging_slots", 0},
                    {"tasks",
                     {{{"id", 0},
                       {"resource", "compute"},
                       {"lane", 0},
                       {"steps", {gather}}},
                      {{"id", 1},
                       {"resource", "io"},
                       {"lane", 0},
                       {"after", {0}},
                       {"inputs", {0}},
                       {"steps", {store}}}}}}}}};
  StatusOr<PlanBundle> parsed = parsePlanBundle(bundle.dump());
  ASSERT_TRUE(parsed) << parsed.status().toString();
  EXPECT_EQ(parsed->plans[0].prefillStep, 256);
  Json other = bundle;
  other["plans"][0]["prefill_step"] = 512;
  EXPECT_FALSE(
      parsed->plans[0].sameSchedule(parsePlanBundle(other.dump())->plans[0]));
  other["plans"][0]["prefill_step"] = 0;
  EXPECT_EQ(parsePlanBundle(other.dump()).status().message(),
            "plans[0].prefill_step: 0 tokens a step (expected 1 or more)");
  EXPECT_EQ(errorAfter([](Json &b) { b["plans"][0]["prefill_step"] = 256; }),
            "plans[0].prefill_step: the plan gathers nothing; only a save or "
            "a sender runs beside a prefill");
}

TEST(PlanBundleTest, RejectsBadTaskReferences) {
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 1)["id"] = 7; }),
            "plans[0].tasks[1].id: expected 1 (ids number the tasks in "
            "order), got 7");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 1)["after"] = {0, 9}; }),
            "plans[0].tasks[1].after[1]: task 9 does not exist");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 1)["inputs"] = {1}; }),
            "plans[0].tasks[1].inputs[0]: task 1 is the task itself");
  EXPECT_EQ(errorAfter([](Json &b) { b["plans"][1] = b["plans"][0]; }),
            "plans[1].name: plan \"p\" appears twice");
}

TEST(PlanBundleTest, RejectsCycles) {
  // 0 -> 1 -> 2 -> 0.
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 0)["after"] = {2}; }),
            "plans[0]: the task graph has a cycle through task 0");
}

TEST(PlanBundleTest, RejectsValuesReadBeforeWritten) {
  // The copy reads the decoded chunk without waiting for the decoding.
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 2).erase("after"); }),
            "plans[0].tasks[2].inputs[0]: reads the value of task 1 before "
            "it is written (task 1 is not among its dependencies)");
}

// A step that computes, projects or scatters part of its chunk is refused
// before anything runs (the executor runs such steps on whole chunks).
TEST(PlanBundleTest, RejectsStepsOverPartOfTheirChunk) {
  EXPECT_EQ(errorAfter([](Json &b) {
              task(b, 3)["steps"][1]["tokens"] = {0, 256};
            }),
            "plans[0].tasks[3].steps[1]: scatter over tokens 0 to 256 of "
            "layers 0 to 4 works on part of its chunk (tokens 0 to 512 of "
            "layers 0 to 4); the executor runs it on whole chunks");
  EXPECT_EQ(errorAfter([](Json &b) {
              task(b, 7)["steps"][1]["layers"] = {0, 2};
            }),
            "plans[0].tasks[7].steps[1]: scatter over tokens 512 to 1024 of "
            "layers 0 to 2 works on part of its chunk (tokens 512 to 1024 of "
            "layers 0 to 4); the executor runs it on whole chunks");
}

TEST(PlanBundleTest, RejectsUnsafeStagingSlotReuse) {
  // The second fetch refills slot 0 while the first chunk is still decoding.
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 4)["after"] = {0}; }),
            "plans[0]: task 4 refills staging slot 0 while task 1 may still "
            "read it");
  // Or without waiting for anything.
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 4).erase("after"); }),
            "plans[0]: tasks 0 and 4 may fill staging slot 0 at the same "
            "time");
  EXPECT_EQ(errorAfter([](Json &b) { task(b, 4)["slot"] = 1; }),
            "plans[0].tasks[4].slot: slot 1 is outside the plan's 1 staging "
            "slots");
  // Every slot is a task's: a count beyond the tasks (which the validator
  // and the executor would keep state for) is refused, however large.
  EXPECT_EQ(errorAfter([](Json &b) { b["plans"][0]["staging_slots"] = 9; }),
            "plans[0].staging_slots: 9 slots for 8 tasks (expected 0 to the "
            "number of tasks)");
  EXPECT_EQ(errorAfter([](Json &b) {
              b["plans"][0]["staging_slots"] = int64_t(1) << 62;
            }),
            "plans[0].staging_slots: 4611686018427387904 slots for 8 tasks "
            "(expected 0 to the number of tasks)");
  // Two slots make the concurrent fill legal.
  EXPECT_EQ(errorAfter([](Json &b) {
              task(b, 4).erase("after");
              task(b, 4)["slot"] = 1;
              b["plans"][0]["staging_slots"] = 2;
            }),
            "");
}

TEST(PlanBundleTest, ReadsFilesAndNamesThemInErrors) {
  StatusOr<PlanBundle> missing = readPlanBundle("/nonexistent/plan.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), StatusCode::NotFound);
}

} // namespace

namespace {

constexpr const char *kRestoreKernel =
    "kvc_restore_int8_kc_vt_g32_t512_l4_h8x128_b16";

/// A kernel table entry as kvc-emit-bundle writes one.
Json kernelEntry(const char *name, const char *kind) {
  Json args = {"payload",     "key_cache", "value_cache",
               "block_table", "chunks",    "layer_rows"};
  const bool rope = std::string(kind) == "rope_scatter";
  if (rope)
    args.push_back("rope_table");
  if (std::string(kind) == "rms_norm")
    args = {"hidden", "norm_weights", "normed", "first_layer"};
  return {{"name", name},
          {"kind", kind},
          {"function", std::string(name) + "_kernel"},
          {"format", "ptx"},
          {"target", "sm_90"},
          {"binary", std::string(".version 8.5\n.target sm_90\n.entry ") +
                         name + "_kernel(\n)\n{\n}\n"},
          {"grid", {2048, 1, 1}},
          {"block", {256, 1, 1}},
          {"args", args},
          {"tokens", 512},
          {"layers", 4},
          {"kv_heads", 8},
          {"head_dim", 128},
          {"block_size", 16},
          {"storage", rope ? "f32" : "bf16"},
          {"codec", rope ? "raw" : "int8"},
          {"key_axis", "channel"},
          {"value_axis", "token"},
          {"payload_bytes", 1}};
}

/// validBundle() as version 4, its dequant-scatter tasks naming a kernel.
std::string kernelErrorAfter(const std::function<void(Json &)> &edit) {
  return errorAfter([&](Json &b) {
    b["version"] = 4;
    b["kernels"] = {kernelEntry(kRestoreKernel, "restore")};
    task(b, 3)["entry"] = kRestoreKernel;
    task(b, 7)["entry"] = kRestoreKernel;
    edit(b);
  });
}

TEST(PlanBundleTest, ReadsTheKernelTable) {
  Json bundle = validBundle();
  bundle["version"] = 4;
  bundle["kernels"] = {kernelEntry(kRestoreKernel, "restore"),
                       kernelEntry("kvc_rope_scatter_t512_l4_h8x128_b16",
                                   "rope_scatter")};
  task(bundle, 3)["entry"] = kRestoreKernel;
  StatusOr<PlanBundle> parsed = parsePlanBundle(bundle.dump());
  ASSERT_TRUE(parsed) << parsed.status().toString();
  const BundleKernel *restore = parsed->findKernel(kRestoreKernel);
  ASSERT_NE(restore, nullptr);
  EXPECT_EQ(restore->kind, BundleKernel::Kind::Restore);
  EXPECT_EQ(restore->codec.quant, CodecSpec::Quant::Int8);
  EXPECT_EQ(restore->grid, (std::array<int64_t, 3>{2048, 1, 1}));
  EXPECT_EQ(restore->format, "ptx");
  EXPECT_EQ(restore->target, "sm_90");
  EXPECT_NE(restore->binary.find(".entry"), std::string::npos);
  EXPECT_EQ(restore->args.size(), 6u);
  const BundleKernel *rope =
      parsed->findKernel("kvc_rope_scatter_t512_l4_h8x128_b16");
  ASSERT_NE(rope, nullptr);
  EXPECT_EQ(rope->kind, BundleKernel::Kind::RopeScatter);
  EXPECT_EQ(rope->args.back(), "rope_table");
  EXPECT_EQ(parsed->plans[0].tasks[3].entry, kRestoreKernel);
  // A projection's prologue names its row width.
  bundle["kernels"].push_back(
      kernelEntry("kvc_rms_norm_bf16_t512_l4_d4096", "rms_norm"));
  bundle["kernels"].back()["codec"] = "raw";
  bundle["kernels"].back()["hidden"] = 4096;
  bundle["kernels"].back()["eps"] = 1e-5;
  parsed = parsePlanBundle(bundle.dump());
  ASSERT_TRUE(parsed) << parsed.status().toString();
  const BundleKernel *norm =
      parsed->findKernel("kvc_rms_norm_bf16_t512_l4_d4096");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->kind, BundleKernel::Kind::RmsNorm);
  EXPECT_EQ(norm->hidden, 4096);
  EXPECT_EQ(norm->eps, 1e-5);
  // A kernel without a kind restores.
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["kernels"][0].erase("kind"); }),
            "");
}

// Version 3 carried PTX in fields of its own; it reads as version 4's
// format "ptx", and version 4 names its format.
TEST(PlanBundleTest, ReadsVersion3KernelsAsPtx) {
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["version"] = 3;
              Json &k = b["kernels"][0];
              k["arch"] = k["target"];
              k["ptx"] = k["binary"];
              k.erase("format");
              k.erase("target");
              k.erase("binary");
            }),
            "");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["version"] = 3; }),
            "kernels[0].arch: missing required field");
  EXPECT_EQ(
      kernelErrorAfter([](Json &b) { b["kernels"][0]["format"] = "hsaco"; }),
      "kernels[0].format: unknown format \"hsaco\" (expected \"ptx\")");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["kernels"][0].erase("format"); }),
            "kernels[0].format: missing required field");
}

TEST(PlanBundleTest, RefusesTheKernelsOfVersion2) {
  // Version 2's kernels took one chunk's origin as scalars: its plans read
  // without a kernel table, and a table is refused, not misread.
  EXPECT_EQ(errorAfter([](Json &b) { b["version"] = 2; }), "");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["version"] = 2; }),
            "kernels: a version 2 bundle's kernels take one chunk's "
            "first_token and first_layer; this runtime launches kernels over "
            "a table of chunks (version 3): compile the plans again with "
            "kvc-opt");
}

TEST(PlanBundleTest, RejectsBadKernels) {
  EXPECT_EQ(kernelErrorAfter([](Json &) {}), "");
  // Too many threads, also where their product would overflow (the bundle
  // fuzzer found 256 x 2^62 under UBSan).
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["kernels"][0]["block"] = {64, 32, 1};
            }),
            "kernels[0].block: more than 1024 threads per block");
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["kernels"][0]["block"] = {256, int64_t(1) << 62, 1};
            }),
            "kernels[0].block: more than 1024 threads per block");
  EXPECT_EQ(
      kernelErrorAfter([](Json &b) { b["kernels"][0]["target"] = "sm_70"; }),
      "kernels[0].target: unknown architecture \"sm_70\" (expected sm_80, "
      "sm_86, sm_89, sm_90 or sm_90a)");
  EXPECT_EQ(kernelErrorAfter(
                [](Json &b) { b["kernels"][0]["binary"] = ".target sm_90"; }),
            "kernels[0].binary: has no entry \"" +
                std::string(kRestoreKernel) + "_kernel\"");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["kernels"][0]["kind"] = "gemm"; }),
            "kernels[0].kind: unknown kind \"gemm\" (expected \"restore\", "
            "\"rope_scatter\", \"save\" or \"rms_norm\")");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["kernels"][0]["args"].erase(5); }),
            "kernels[0].args: a restore kernel takes each of payload, "
            "key_cache, value_cache, block_table, chunks, layer_rows once");
  // A rope_scatter kernel takes the RoPE table, reads f32 projections, and
  // serves only tasks that project hidden states.
  EXPECT_EQ(kernelErrorAfter(
                [](Json &b) { b["kernels"][0]["kind"] = "rope_scatter"; }),
            "kernels[0].args: a rope_scatter kernel takes each of payload, "
            "key_cache, value_cache, block_table, chunks, layer_rows, "
            "rope_table once");
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["kernels"][0] = kernelEntry(kRestoreKernel, "rope_scatter");
              b["kernels"][0]["storage"] = "bf16";
            }),
            "kernels[0]: a rope_scatter kernel reads raw f32 projections "
            "(storage \"f32\", codec \"raw\")");
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["kernels"][0] = kernelEntry(kRestoreKernel, "rope_scatter");
            }),
            "plans[0].tasks[3].entry: kernel \"" + std::string(kRestoreKernel) +
                "\" is a rope_scatter kernel; the task's steps do not project "
                "hidden states");
  // A save kernel serves a task that starts by gathering its chunk.
  EXPECT_EQ(kernelErrorAfter([](Json &b) { b["kernels"][0]["kind"] = "save"; }),
            "plans[0].tasks[3].entry: kernel \"" + std::string(kRestoreKernel) +
                "\" gathers 512 tokens x 4 layers of KV; the task's first "
                "step does not");
  // An rms_norm kernel takes hidden states, weights and the output, names
  // its row width, and is the prologue of a projection's rope_scatter
  // entry only.
  EXPECT_EQ(
      kernelErrorAfter([](Json &b) { b["kernels"][0]["kind"] = "rms_norm"; }),
      "kernels[0].args: a rms_norm kernel takes each of hidden, "
      "norm_weights, normed, first_layer once");
  EXPECT_EQ(kernelErrorAfter([](Json &b) {
              b["kernels"][0] = kernelEntry(kRestoreKernel, "rms_norm");
              b["kernels"][0]["codec"] = "raw";
            }),
            "kernels[0]: an rms_norm kernel normalizes raw rows of \"hidden\" "
            ">= 1 values with an \"eps\" > 0 (codec \"raw\")");
  EXPECT_EQ(kernelErrorAfter(
                [](Json &b) { task(b, 3)["prologue"] = kRestoreKernel; }),
            "plans[0].tasks[3].prologue: \"" + std::string(kRestoreKernel) +
                "\" is not an rms_norm kernel of the table for the 512 tokens "
                "x 4 layers its rope_scatter entry projects");
  EXPECT_EQ(kernelErrorAfter([](Json &b) { task(b, 3)["entry"] = "missing"; }),
            "plans[0].tasks[3].entry: no kernel \"missing\" in the bundle's "
            "kernel table");
}

} // namespace
