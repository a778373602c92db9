//===- ExecutorFixture.h - A model, a store, plans to restore ---*- C++ -*-===//
//
// The fixture of the executor's tests (ExecutorTest.cpp, DynamicCakeTest.cpp):
// a small model, a request saved to a store in every form, plans that split
// it between compute and loads, and the exact cache a full prefill makes.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_UNITTESTS_RUNTIME_EXECUTORFIXTURE_H
#define KVC_UNITTESTS_RUNTIME_EXECUTORFIXTURE_H

#include "TestModel.h"
#include "Tolerance.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Codec/ChunkCodec.h"
#include "kvc/Runtime/Exec/Executor.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/Safetensors.h"
#include "kvc/Runtime/Save/SavePlan.h"
#include "kvc/Runtime/Save/Saver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <thread>

namespace kvc::exec_test {

constexpr int64_t kTokens = 300;

/// How a test plan restores the request: compute tokens [0, merge), load
/// the rest; loads read hidden states for layers [0, hiddenLayers) and KV
/// for the others (HCache's split); chunks of `chunk` tokens.
struct Split {
  int64_t merge = 0;
  int64_t hiddenLayers = 0;
  int64_t chunk = 64;
  /// Staging slots for the loads (0: none); a fetch reusing a slot waits
  /// for the copy of the chunk that used it before, as kvc-schedule orders.
  int64_t slots = 0;
  /// Tokens [merge, end) compute layers [0, computeLayers) instead of
  /// loading them (HCache's recompute complement); loads start above.
  int64_t computeLayers = 0;
};

inline BundleStep step(const char *op, const char *form, int64_t t0, int64_t t1,
                       int64_t l0, int64_t l1, const char *tier = "") {
  BundleStep s;
  s.kind = *parseStepKind(op);
  s.form = *parseForm(form);
  s.tokens = {t0, t1};
  s.layers = {l0, l1};
  s.tier = tier;
  return s;
}

/// A scheduled plan as kvc-schedule shapes it: per loaded chunk, fetch on
/// alternating io lanes -> decompress -> copy -> (project +) scatter; per
/// computed chunk, one compute task. A fetch into a slot waits for the copy
/// of the slot's previous chunk, a copy for its scatter.
inline BundlePlan makePlan(const Split &split, int64_t layers) {
  BundlePlan plan;
  plan.name = "test";
  plan.tokens = {0, kTokens};
  plan.layers = {0, layers};
  auto add = [&](Resource resource, int64_t lane, std::vector<BundleStep> steps,
                 std::vector<int64_t> after) {
    BundleTask task;
    task.id = int64_t(plan.tasks.size());
    task.resource = resource;
    task.lane = lane;
    task.after = after;
    task.inputs = after;
    task.steps = std::move(steps);
    plan.tasks.push_back(std::move(task));
    return plan.tasks.back().id;
  };
  int64_t lane = 0, fetches = 0;
  plan.stagingSlots = split.slots;
  std::vector<int64_t> lastCopy(split.slots, -1), lastScatter(split.slots, -1);
  for (int64_t t0 = 0; t0 < kTokens; t0 += split.chunk) {
    int64_t t1 = std::min(kTokens, t0 + split.chunk);
    if (t1 <= split.merge) {
      add(Resource::Compute, 0,
          {step("chunk_compute", "kv", t0, t1, 0, layers),
           step("scatter", "kv", t0, t1, 0, layers)},
          {});
      continue;
    }
    t0 = std::max(t0, split.merge);
    const int64_t low = split.computeLayers;
    if (low > 0)
      add(Resource::Compute, 0,
          {step("chunk_compute", "kv", t0, t1, 0, low),
           step("scatter", "kv", t0, t1, 0, low)},
          {});
    for (bool hidden : {true, false}) {
      int64_t split_ = std::max(low, split.hiddenLayers);
      int64_t l0 = hidden ? low : split_;
      int64_t l1 = hidden ? split_ : layers;
      if (l0 == l1)
        continue;
      const char *form = hidden ? "hidden" : "kv";
      int64_t slot = split.slots ? fetches++ % split.slots : -1;
      std::vector<int64_t> wait;
      if (slot >= 0 && lastCopy[slot] >= 0)
        wait.push_back(lastCopy[slot]);
      int64_t f = add(Resource::IO, lane++ % 2,
                      {step("fetch", form, t0, t1, l0, l1, "dram")}, wait);
      plan.tasks[f].inputs.clear();
      if (slot >= 0)
        plan.tasks[f].slot = slot;
      int64_t d = add(Resource::Decode, 0,
                      {step("decompress", form, t0, t1, l0, l1)}, {f});
      std::vector<int64_t> copyAfter = {d};
      if (slot >= 0 && lastScatter[slot] >= 0)
        copyAfter.push_back(lastScatter[slot]);
      int64_t c =
          add(Resource::H2D, 0,
              {step("transfer_to_device", form, t0, t1, l0, l1)}, copyAfter);
      plan.tasks[c].inputs = {d};
      if (slot >= 0)
        lastCopy[slot] = c;
      std::vector<BundleStep> last;
      if (hidden)
        last.push_back(step("project", "hidden", t0, t1, l0, l1));
      last.push_back(step("scatter", "kv", t0, t1, l0, l1));
      int64_t sc = add(Resource::Compute, 0, std::move(last), {c});
      if (slot >= 0)
        lastScatter[slot] = sc;
    }
  }
  return plan;
}

/// A kernel of `kind` specialized for `step`'s chunk of `model`'s KV in
/// 16-token blocks: what the kernel tables of the helpers below share.
inline BundleKernel kernelOver(BundleKernel::Kind kind, const BundleStep &step,
                               const ModelConfig &model) {
  BundleKernel kernel;
  kernel.kind = kind;
  kernel.tokens = step.tokens.size();
  kernel.layers = step.layers.size();
  kernel.kvHeads = model.numKvHeads;
  kernel.headDim = model.headDim;
  kernel.blockSize = 16;
  return kernel;
}

/// `plan` (makePlan's) with each loaded KV chunk's scatter made a generated
/// restore kernel for `codec` (its lossless stage left to the host), and
/// the kernels it names: from `generated` (a bundle kvc-opt made; an error
/// when it lacks one) or, without it, made up with the runtime's payload
/// sizes and placeholder PTX.
inline StatusOr<PlanBundle>
withKernels(BundlePlan plan, const ModelConfig &model, const CodecSpec &codec,
            const std::vector<BundleKernel> *generated = nullptr) {
  CodecSpec onDevice = codec;
  onDevice.lossless = CodecSpec::Lossless::None;
  PlanBundle bundle{kPlanBundleVersion, "", {}, {}};
  for (BundleTask &task : plan.tasks)
    if (task.steps[0].kind == StepKind::Fetch)
      task.steps[0].codec = codec;
  for (BundleTask &task : plan.tasks) {
    // A lone scatter ends a loaded chunk's chain; computed chunks and
    // projections keep their steps.
    if (task.steps.size() != 1 || task.steps[0].kind != StepKind::Scatter)
      continue;
    const BundleStep scatter = task.steps[0];
    if (onDevice.quant != CodecSpec::Quant::None) {
      BundleStep dequant = scatter;
      dequant.kind = StepKind::Dequant;
      task.steps.insert(task.steps.begin(), dequant);
    }
    BundleKernel kernel =
        kernelOver(BundleKernel::Kind::Restore, scatter, model);
    kernel.codec = onDevice;
    if (generated) {
      auto same = [&](const BundleKernel &k) {
        return k.kind == kernel.kind && k.tokens == kernel.tokens &&
               k.layers == kernel.layers && k.kvHeads == kernel.kvHeads &&
               k.headDim == kernel.headDim && k.codec == kernel.codec;
      };
      auto found = std::find_if(generated->begin(), generated->end(), same);
      if (found == generated->end())
        return notFound("no generated kernel decodes " + onDevice.str() +
                        " over " + std::to_string(kernel.tokens) +
                        " tokens x " + std::to_string(kernel.layers) +
                        " layers");
      kernel = *found;
    } else {
      kernel.name = "restore_t" + std::to_string(kernel.tokens) + "_l" +
                    std::to_string(kernel.layers);
      kernel.function = kernel.name;
      kernel.target = "sm_90";
      kernel.binary = ".target sm_90\n.entry " + kernel.name + "(\n";
      kernel.args = bundleKernelArgNames(kernel.kind);
      std::vector<float> zeros(2 * kernel.layers * kernel.tokens *
                               model.numKvHeads * model.headDim);
      KVC_ASSIGN_OR_RETURN(
          payload, encodeChunk(zeros.data(),
                               chunkShape(model, Form::KV, kernel.tokens,
                                          scatter.layers.begin, kernel.layers),
                               onDevice, DType::BF16));
      kernel.payloadBytes = int64_t(payload.size());
    }
    task.kernel = "dequant_scatter";
    task.entry = kernel.name;
    if (!bundle.findKernel(kernel.name))
      bundle.kernels.push_back(std::move(kernel));
  }
  bundle.plans.push_back(std::move(plan));
  return bundle;
}

/// `plan` (makePlan's) with each projection made generated kernels, an
/// rms_norm prologue and a rope_scatter epilogue for `model`: from
/// `generated` (a bundle kvc-opt made; an error when it lacks one) or,
/// without it, made up with placeholder PTX.
inline StatusOr<PlanBundle>
withProjectionKernels(BundlePlan plan, const ModelConfig &model,
                      const std::vector<BundleKernel> *generated = nullptr) {
  PlanBundle bundle{kPlanBundleVersion, "", {}, {}};
  // Adds the kernel (once per name) and returns its name.
  auto add = [&](BundleKernel kernel,
                 const std::string &name) -> StatusOr<std::string> {
    if (generated) {
      auto same = [&](const BundleKernel &k) {
        return k.kind == kernel.kind && k.tokens == kernel.tokens &&
               k.layers == kernel.layers && k.storage == kernel.storage;
      };
      auto found = std::find_if(generated->begin(), generated->end(), same);
      if (found == generated->end())
        return notFound(
            "no generated " + std::string(bundleKernelKindName(kernel.kind)) +
            " kernel for " + std::to_string(kernel.tokens) + " tokens x " +
            std::to_string(kernel.layers) + " layers");
      kernel = *found;
    } else {
      kernel.name = kernel.function = name;
      kernel.target = "sm_90";
      kernel.binary = ".target sm_90\n.entry " + name + "(\n";
      kernel.args = bundleKernelArgNames(kernel.kind);
    }
    const std::string added = kernel.name;
    if (!bundle.findKernel(added))
      bundle.kernels.push_back(std::move(kernel));
    return added;
  };
  for (BundleTask &task : plan.tasks) {
    if (task.steps.size() != 2 || task.steps[0].kind != StepKind::Project)
      continue;
    const BundleStep &project = task.steps[0];
    BundleKernel rope =
        kernelOver(BundleKernel::Kind::RopeScatter, project, model);
    rope.storage = "f32";
    rope.payloadBytes =
        rope.layers * 2 * rope.tokens * model.numKvHeads * model.headDim * 4;
    BundleKernel norm = rope;
    norm.kind = BundleKernel::Kind::RmsNorm;
    norm.storage = dtypeName(model.dtype);
    norm.hidden = model.hiddenSize;
    norm.eps = model.rmsNormEps;
    const std::string shape =
        "_t" + std::to_string(rope.tokens) + "_l" + std::to_string(rope.layers);
    KVC_ASSIGN_OR_RETURN(entry, add(rope, "rope_scatter" + shape));
    KVC_ASSIGN_OR_RETURN(prologue, add(norm, "rms_norm" + shape));
    task.kernel = "project_scatter";
    task.entry = entry;
    task.prologue = prologue;
  }
  bundle.plans.push_back(std::move(plan));
  return bundle;
}

/// `plan` (a save plan, savePlanFor's) with each gather made a generated
/// save kernel for `store`'s objects in `codec` (its lossless stage left to
/// the host): from `generated` (a bundle kvc-opt made; an error when it
/// lacks one) or, without it, made up with placeholder PTX.
inline StatusOr<PlanBundle>
withSaveKernels(BundlePlan plan, const ChunkObjects &store,
                const CodecSpec &codec,
                const std::vector<BundleKernel> *generated = nullptr) {
  const ModelConfig &model = store.model();
  CodecSpec onDevice = codec;
  onDevice.lossless = CodecSpec::Lossless::None;
  PlanBundle bundle{kPlanBundleVersion, "", {}, {}};
  for (BundleTask &task : plan.tasks) {
    const BundleStep &gather = task.steps.front();
    if (gather.kind != StepKind::Gather)
      continue;
    BundleKernel kernel = kernelOver(BundleKernel::Kind::Save, gather, model);
    kernel.codec = onDevice;
    kernel.storage = dtypeName(model.dtype);
    if (generated) {
      auto same = [&](const BundleKernel &k) {
        return k.kind == kernel.kind && k.tokens == kernel.tokens &&
               k.layers == kernel.layers && k.codec == kernel.codec &&
               (!onDevice.isRaw() || k.storage == kernel.storage);
      };
      auto found = std::find_if(generated->begin(), generated->end(), same);
      if (found == generated->end())
        return notFound("no generated kernel saves " + onDevice.str() +
                        " over " + std::to_string(kernel.tokens) +
                        " tokens x " + std::to_string(kernel.layers) +
                        " layers");
      kernel = *found;
    } else {
      kernel.name = kernel.function = "save_t" + std::to_string(kernel.tokens) +
                                      "_l" + std::to_string(kernel.layers);
      kernel.target = "sm_90";
      kernel.binary = ".target sm_90\n.entry " + kernel.name + "(\n";
      kernel.args = bundleKernelArgNames(kernel.kind);
      const ChunkShape shape = chunkShape(model, Form::KV, kernel.tokens,
                                          gather.layers.begin, kernel.layers);
      const std::vector<float> zeros(shape.numel());
      kernel.payloadBytes = int64_t(
          encodeChunk(zeros.data(), shape, onDevice, model.dtype)->size());
    }
    task.entry = kernel.name;
    if (!bundle.findKernel(kernel.name))
      bundle.kernels.push_back(std::move(kernel));
  }
  bundle.plans.push_back(std::move(plan));
  return bundle;
}

/// The object name of the stored KV chunk holding token 200, layers 2-3.
inline std::string victim(ChunkStore &store,
                          const std::vector<int32_t> &tokens) {
  for (const ChunkRef &ref :
       store.refs(tokens.data(), int64_t(tokens.size()), Form::KV, CodecSpec()))
    if (ref.tokenBegin <= 200 && 200 < ref.tokenEnd && ref.layerBegin == 2)
      return ref.name();
  ADD_FAILURE() << "no such chunk";
  return "";
}

class ExecutorTest : public ::testing::Test {
protected:
  void SetUp() override {
    useModel(DType::BF16);
    PagedCacheConfig config;
    config.layers = model_->config().numLayers;
    config.numKvHeads = model_->config().numKvHeads;
    config.headDim = model_->config().headDim;
    config.numBlocks = 8 * ((kTokens + 15) / 16);
    cache_ = std::move(device_->createCache(config).value());
    pools_ = std::move(
        device_
            ->createPools(
                {{"io:dram", 2}, {"decode", 2}, {"h2d", 1}, {"compute", 1}})
            .value());
  }

  /// Makes the test's model a fresh one in `dtype`, with its context saved
  /// to a new store and its full prefill as the reference.
  void useModel(DType dtype) {
    useModelAt(test::generateTestModel(std::string("exec-") + dtypeName(dtype),
                                       7, 4, 128, dtype));
  }

  /// The test's model as a Qwen3 with `attention_bias` (random q, k, v and
  /// output biases and per-head q and k norms on the generated weights): a
  /// restore that drops any of them computes other K and V.
  void useQwen3WithBiases() {
    const std::string base = test::generateTestModel("exec-qwen-base", 7);
    auto llama = LlamaModel::load(base);
    ASSERT_TRUE(llama) << llama.status().toString();
    StatusOr<TensorMap> tensors = loadSafetensors(base);
    ASSERT_TRUE(tensors) << tensors.status().toString();
    const ModelConfig &c = (*llama)->config();
    const int64_t q = c.numHeads * c.headDim, kv = c.numKvHeads * c.headDim;
    std::mt19937 random(11);
    auto values = [&](int64_t n, float center, float spread) {
      std::uniform_real_distribution<float> draw(center - spread,
                                                 center + spread);
      Tensor t{{n}, std::vector<float>(size_t(n))};
      for (float &x : t.data)
        x = draw(random);
      return t;
    };
    for (int64_t l = 0; l < c.numLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      (*tensors)[p + "q_proj.bias"] = values(q, 0, 0.5f);
      (*tensors)[p + "k_proj.bias"] = values(kv, 0, 0.5f);
      (*tensors)[p + "v_proj.bias"] = values(kv, 0, 0.5f);
      (*tensors)[p + "o_proj.bias"] = values(c.hiddenSize, 0, 0.5f);
      (*tensors)[p + "q_norm.weight"] = values(c.headDim, 1, 0.5f);
      (*tensors)[p + "k_norm.weight"] = values(c.headDim, 1, 0.5f);
    }
    const std::string dir = test::tempPath("exec-qwen3");
    ASSERT_TRUE(writeModelDirectory(dir, c, *tensors,
                                    R"({"model_type": "qwen3",
                                        "attention_bias": true})")
                    .isOk());
    useModelAt(dir);
    ASSERT_TRUE(model_->config().qkvBias && model_->config().outputBias &&
                model_->config().qkNorm);
  }

  void useModelAt(const std::string &dir) {
    auto model = LlamaModel::load(dir);
    ASSERT_TRUE(model) << model.status().toString();
    model_ = std::move(model).value();
    tokens_.resize(kTokens);
    for (int64_t i = 0; i < kTokens; ++i)
      tokens_[i] = int32_t((i * 37 + 11) % model_->config().vocabSize);
    tier_ = std::shared_ptr<Tier>(std::move(openTier("mem://").value()));
    store_ = makeStore(*model_);
    ASSERT_TRUE(saveContext(*model_, *store_, tokens_, {}).isOk());
    reference_ = model_->newCache();
    ASSERT_TRUE(model_->prefill(reference_, tokens_.data(), kTokens).isOk());
  }

  std::unique_ptr<ChunkStore> makeStore(const LlamaModel &model,
                                        int64_t chunkTokens = 64) {
    StoreLayout layout;
    layout.chunkTokens = chunkTokens;
    layout.layerGroup = 2;
    return std::make_unique<ChunkStore>(tier_, model.config(),
                                        model.fingerprint(), "", layout);
  }

  /// The request restored into `table` of the test's cache from `store`
  /// (the test's by default) as tier "dram".
  RestoreTarget targetFor(const BlockTable &table,
                          ChunkStore *store = nullptr) {
    RestoreTarget target;
    target.model = model_.get();
    target.stores["dram"] = store ? store : store_.get();
    target.tokens = &tokens_;
    target.cache = cache_.get();
    target.table = &table;
    target.device = device_;
    return target;
  }

  StatusOr<RestoreMetrics> run(const BundlePlan &plan, BlockTable &table,
                               ChunkStore *store = nullptr) {
    EXPECT_TRUE(validatePlanBundle(PlanBundle{1, "", {plan}}).isOk());
    return restore(*pools_, plan, targetFor(table, store));
  }

  /// Largest error of the restored cache against the full prefill, relative
  /// to the largest |K| or |V| of the reference.
  double relativeError(const BlockTable &table) {
    StatusOr<RestoreError> error =
        restoreError(*model_, reference_, kTokens, *cache_, table, *device_);
    EXPECT_TRUE(error) << error.status().toString();
    return error ? error->max : 1.0;
  }

  /// Fraction of the restored values that differ from the full prefill
  /// rounded to bf16: a handful where chunked and full prefills round apart,
  /// many where a restore path rounds anything on the way.
  double mismatched(const BlockTable &table) {
    const int64_t kv = model_->kvDim();
    std::vector<float> k(kTokens * kv), v(kTokens * kv);
    int64_t differ = 0, total = 0;
    for (int64_t l = 0; l < model_->config().numLayers; ++l) {
      EXPECT_TRUE(
          cache_->read(table, l, 0, kTokens, k.data(), v.data()).isOk());
      for (int64_t i = 0; i < kTokens * kv; ++i) {
        differ += k[i] != bf16ToFloat(floatToBf16(reference_.k[l][i]));
        differ += v[i] != bf16ToFloat(floatToBf16(reference_.v[l][i]));
        total += 2;
      }
    }
    return double(differ) / double(total);
  }

  /// A restore with `split` is exact: within bf16 rounding (2^-8 relative)
  /// of the full prefill.
  void expectExact(const Split &split, int64_t expectedFallbacks = 0) {
    BlockTable table = *cache_->allocate(kTokens);
    StatusOr<RestoreMetrics> metrics =
        run(makePlan(split, model_->config().numLayers), table);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(int64_t(metrics->fallbacks.size()), expectedFallbacks);
    // Computed chunks attend over the paged cache; only recomputing a
    // fallback needs an exact context of its own.
    if (expectedFallbacks == 0)
      EXPECT_EQ(metrics->exactContextBytes, 0);
    else
      EXPECT_GT(metrics->exactContextBytes, 0);
    EXPECT_LT(relativeError(table), 1.0 / 128);
    cache_->release(table);
  }

  /// Every strategy's split restores exactly.
  void expectEveryStrategyExact() {
    const int64_t layers = model_->config().numLayers;
    expectExact({/*merge=*/kTokens, 0, 64}); // compute
    expectExact({0, 0, 64});                 // kv
    expectExact({0, layers, 64});            // hidden
    expectExact({128, 0, 64});               // cake
    expectExact({0, layers / 2, 64});        // hcache
    expectExact({128, layers / 2, 64});      // joint
    expectExact({96, 1, 96});                // chunks off the store grid
  }

  /// Eight restores of different splits at once into one cache, each exact.
  void expectConcurrentRestoresExact() {
    const int64_t layers = model_->config().numLayers;
    std::vector<Split> splits = {{kTokens, 0, 64}, {0, 0, 64}, {0, layers, 64},
                                 {128, 0, 64},     {0, 2, 64}, {128, 2, 64},
                                 {96, 1, 96},      {64, 3, 32}};
    std::vector<BlockTable> tables;
    for (std::size_t i = 0; i < splits.size(); ++i)
      tables.push_back(*cache_->allocate(kTokens));
    std::vector<Status> results(splits.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < splits.size(); ++i)
      threads.emplace_back([&, i] {
        StatusOr<RestoreMetrics> metrics =
            run(makePlan(splits[i], layers), tables[i]);
        results[i] = metrics.status();
      });
    for (std::thread &t : threads)
      t.join();
    for (std::size_t i = 0; i < splits.size(); ++i) {
      EXPECT_TRUE(results[i].isOk()) << i << ": " << results[i].toString();
      EXPECT_LT(relativeError(tables[i]), 1.0 / 128) << "restore " << i;
    }
  }

  /// A store of the request's KV (or `form`) in `codec`, in objects of
  /// `chunkTokens` tokens.
  std::unique_ptr<ChunkStore> storeIn(const CodecSpec &codec,
                                      int64_t chunkTokens = 64,
                                      Form form = Form::KV) {
    std::unique_ptr<ChunkStore> store = makeStore(*model_, chunkTokens);
    SaveOptions options;
    options.forms = {form};
    options.codec = codec;
    Status saved = saveContext(*model_, *store, tokens_, options).status();
    EXPECT_TRUE(saved.isOk()) << saved.toString();
    return store;
  }

  /// Restores `bundle`'s plan from `store`, with its kernel table unless
  /// `kernels` is false, into a fresh table of the test's cache; `cache`
  /// gets every layer's K and V as read back, `error` relativeError's.
  StatusOr<RestoreMetrics> restoreWith(const PlanBundle &bundle,
                                       ChunkStore &store,
                                       std::vector<float> *cache = nullptr,
                                       bool kernels = true,
                                       double *error = nullptr) {
    Status valid = validatePlanBundle(bundle);
    EXPECT_TRUE(valid.isOk()) << valid.toString();
    BlockTable table = *cache_->allocate(kTokens);
    RestoreOptions options;
    if (kernels)
      options.kernels = &bundle.kernels;
    StatusOr<RestoreMetrics> metrics = restore(
        *pools_, bundle.plans.front(), targetFor(table, &store), options);
    if (metrics && cache) {
      const int64_t n = kTokens * model_->kvDim();
      cache->assign(2 * model_->config().numLayers * n, 0);
      for (int64_t l = 0; l < model_->config().numLayers; ++l) {
        Status read = device_->readBack(*cache_, table, l, 0, kTokens,
                                        cache->data() + 2 * l * n,
                                        cache->data() + (2 * l + 1) * n);
        EXPECT_TRUE(read.isOk()) << read.toString();
      }
    }
    if (metrics && error)
      *error = relativeError(table);
    cache_->release(table);
    return metrics;
  }

  /// The kernels kvc-opt generated for this fixture's model
  /// (gen-kernels.py --shapes 64x4,44x4 --restores ...) decode every codec
  /// composition a plan may load through the backend's launches, each
  /// chunk on the device, into the cache the runtime's own decode makes,
  /// bit for bit.
  void expectGeneratedKernelsDecodeAsTheHost(
      const std::vector<BundleKernel> &generated) {
    const int64_t layers = model_->config().numLayers;
    for (const char *text :
         {"raw", "hadamard+lz4", "int8+zstd", "int4+deflate", "int2",
          "hadamard+int8", "hadamard+int4+zstd", "hadamard+int2+lz4",
          "int4/g64/k=token/v=token+zstd"}) {
      SCOPED_TRACE(text);
      StatusOr<CodecSpec> codec = parseCodecSpec(text);
      ASSERT_TRUE(codec) << codec.status().toString();
      std::unique_ptr<ChunkStore> store = storeIn(*codec);
      StatusOr<PlanBundle> bundle = withKernels(
          makePlan({0, 0, 64}, layers), model_->config(), *codec, &generated);
      ASSERT_TRUE(bundle) << bundle.status().toString();
      std::vector<float> byKernels, onHost;
      StatusOr<RestoreMetrics> metrics =
          restoreWith(*bundle, *store, &byKernels);
      ASSERT_TRUE(metrics) << metrics.status().toString();
      EXPECT_EQ(metrics->kernelChunks, (kTokens + 63) / 64);
      EXPECT_TRUE(metrics->kernelsNotLaunched.empty())
          << metrics->kernelsNotLaunched.front();
      metrics = restoreWith(*bundle, *store, &onHost, /*kernels=*/false);
      ASSERT_TRUE(metrics) << metrics.status().toString();
      EXPECT_EQ(metrics->kernelChunks, 0);
      EXPECT_TRUE(byKernels == onHost);
    }
  }

  /// The compiler's projection kernels in `generated` project every hidden
  /// chunk of a hidden-states plan into the cache, near the full prefill:
  /// the prologue rounds the GEMM's input to bf16 (and a GPU's GEMM its
  /// weights), which moves K and V by a few bf16 steps (a wrong row or
  /// rotation moves them by their own size).
  void
  expectGeneratedProjectionsExact(const std::vector<BundleKernel> &generated) {
    const int64_t layers = model_->config().numLayers;
    StatusOr<PlanBundle> bundle = withProjectionKernels(
        makePlan({0, layers, 64}, layers), model_->config(), &generated);
    ASSERT_TRUE(bundle) << bundle.status().toString();
    double error = 1;
    StatusOr<RestoreMetrics> metrics =
        restoreWith(*bundle, *store_, nullptr, /*kernels=*/true, &error);
    ASSERT_TRUE(metrics) << metrics.status().toString();
    EXPECT_EQ(metrics->kernelChunks, (kTokens + 63) / 64);
    EXPECT_TRUE(metrics->kernelsNotLaunched.empty())
        << metrics->kernelsNotLaunched.front();
    EXPECT_LT(error, 1.0 / 32);
    std::printf("generated projections: largest error %.4g\n", error);
  }

  /// Calls `check` with each raw KV and hidden-state object of the request
  /// in `store` beside the same object in the test's store (saved by the
  /// CPU model), both decoded; returns how many.
  int64_t forEachObjectAsSaved(
      ChunkStore &store,
      const std::function<void(const ChunkRef &, const std::vector<float> &,
                               const std::vector<float> &)> &check) {
    int64_t objects = 0;
    for (Form form : {Form::KV, Form::Hidden})
      for (const ChunkRef &ref :
           store.refs(tokens_.data(), kTokens, form, CodecSpec())) {
        std::vector<float> ours(store.shape(ref).numel()),
            saved(store.shape(ref).numel());
        EXPECT_TRUE(store.get(ref, ours.data()).isOk()) << ref.name();
        EXPECT_TRUE(store_->get(ref, saved.data()).isOk()) << ref.name();
        check(ref, ours, saved);
        ++objects;
      }
    return objects;
  }

  /// A table of the test's cache holding the request's full prefill.
  BlockTable prefilledTable() {
    BlockTable table = *cache_->allocate(kTokens);
    Status computed =
        runner()
            .prefill(tokens_, *cache_, table)
            ->compute({0, kTokens, 0, model_->config().numLayers});
    EXPECT_TRUE(computed.isOk()) << computed.toString();
    return table;
  }

  /// savePlanFor's save of the request in `codec` to tier "disk" of
  /// `store`'s layout, its gathers naming save kernels (withSaveKernels:
  /// from `generated`, or made up).
  StatusOr<PlanBundle>
  savePlanWithKernels(const ChunkStore &store, const CodecSpec &codec,
                      const std::vector<BundleKernel> *generated = nullptr) {
    return withSaveKernels(
        savePlanFor(store, kTokens, {Form::KV}, codec, "disk"), store, codec,
        generated);
  }

  /// Runs `bundle`'s first save plan over `table` of the test's cache into
  /// `store` (the tier its stores name), launching the bundle's save
  /// kernels when `launch`.
  StatusOr<SaveMetrics> saveWithKernels(const BlockTable &table,
                                        ChunkStore &store,
                                        const PlanBundle &bundle, bool launch) {
    EXPECT_TRUE(validatePlanBundle(bundle).isOk());
    const BundlePlan &plan = bundle.plans.front();
    PagedCacheSource source(*device_, *cache_, table);
    SaveTarget target;
    target.source = &source;
    for (const BundleTask &task : plan.tasks)
      for (const BundleStep &step : task.steps)
        if (step.kind == StepKind::Store)
          target.stores[step.tier] = &store;
    target.tokens = &tokens_;
    SaveRunOptions options;
    if (launch)
      options.kernels = &bundle.kernels;
    KVC_ASSIGN_OR_RETURN(pools, device_->createPools(planResources(plan)));
    return save(*pools, plan, target, options);
  }

  /// A store of the test's layout on a tier of its own.
  ChunkStore storeOn(std::shared_ptr<Tier> tier) const {
    return ChunkStore(std::move(tier), model_->config(), model_->fingerprint(),
                      "", store_->layout());
  }

  /// Saves `bundle`'s first plan (KV in `codec`) from `table` with its save
  /// kernels launched and not: both write every object, the first through
  /// the kernels, and the stores hold the same bytes.
  void expectSaveKernelsStoreAsTheHost(const BlockTable &table,
                                       const PlanBundle &bundle,
                                       const CodecSpec &codec) {
    SCOPED_TRACE(codec.str());
    std::map<bool, std::shared_ptr<Tier>> tiers;
    for (bool launch : {true, false}) {
      tiers[launch] = std::shared_ptr<Tier>(*openTier("mem://"));
      ChunkStore store = storeOn(tiers[launch]);
      StatusOr<SaveMetrics> saved =
          saveWithKernels(table, store, bundle, launch);
      ASSERT_TRUE(saved) << saved.status().toString();
      const int64_t objects =
          int64_t(store.refs(tokens_.data(), kTokens, Form::KV, codec).size());
      EXPECT_EQ(saved->written, objects);
      EXPECT_EQ(saved->kernelChunks, launch ? objects : 0);
      EXPECT_LE(saved->kernelLaunches, saved->kernelChunks);
      EXPECT_EQ(saved->kernelLaunches > 0, launch);
      EXPECT_TRUE(saved->kernelsNotLaunched.empty())
          << saved->kernelsNotLaunched.front();
    }
    StatusOr<std::vector<std::string>> names = tiers[false]->list("");
    ASSERT_TRUE(names.isOk());
    ASSERT_FALSE(names->empty());
    for (const std::string &name : *names) {
      std::string ours, hosts;
      ASSERT_TRUE(tiers[true]->get(name, ours).isOk()) << name;
      ASSERT_TRUE(tiers[false]->get(name, hosts).isOk()) << name;
      EXPECT_EQ(ours, hosts) << name;
    }
  }

  /// The same, for savePlanWithKernels' plan in `codec`.
  void expectSaveKernelsStoreAsTheHost(
      const BlockTable &table, const CodecSpec &codec,
      const std::vector<BundleKernel> *generated = nullptr) {
    StatusOr<PlanBundle> bundle =
        savePlanWithKernels(*store_, codec, generated);
    ASSERT_TRUE(bundle) << bundle.status().toString();
    expectSaveKernelsStoreAsTheHost(table, *bundle, codec);
  }

  /// A prefilled cache saved with every save kernel composition in
  /// `generated` (kvc-opt's, for the store's objects, zstd after them on
  /// the host): stored as the host's encoder stores it, byte for byte.
  void
  expectGeneratedSavesAsTheHost(const std::vector<BundleKernel> &generated) {
    BlockTable table = prefilledTable();
    std::vector<CodecSpec> codecs;
    for (const BundleKernel &kernel : generated)
      if (kernel.kind == BundleKernel::Kind::Save &&
          std::find(codecs.begin(), codecs.end(), kernel.codec) == codecs.end())
        codecs.push_back(kernel.codec);
    EXPECT_FALSE(codecs.empty()) << "no generated save kernels";
    for (CodecSpec codec : codecs) {
      codec.lossless = CodecSpec::Lossless::Zstd;
      expectSaveKernelsStoreAsTheHost(table, codec, &generated);
    }
    cache_->release(table);
  }

  /// `plan`'s only form and codec on steps of `kind` (its fetches', or its
  /// stores').
  static std::pair<Form, CodecSpec> storedAs(const BundlePlan &plan,
                                             StepKind kind) {
    std::optional<std::pair<Form, CodecSpec>> found;
    for (const BundleTask &task : plan.tasks)
      for (const BundleStep &step : task.steps)
        if (step.kind == kind) {
          EXPECT_TRUE(!found || *found == std::pair(step.form, step.codec))
              << plan.name;
          found = {step.form, step.codec};
        }
    EXPECT_TRUE(found) << plan.name << " has no such step";
    return found.value_or(std::pair(Form::KV, CodecSpec()));
  }

  /// The plans kvc-opt's pipelines compiled for this model with gpu-chip
  /// (`restoresPath`: exec-restores.json, `savesPath`: exec-saves.json):
  /// every fused task names a kernel of the bundle's table; every KV chunk
  /// a restore plan loads, raw or quantized (before a computed rest too), is
  /// decoded by that kernel into the cache the host decode makes; every
  /// chunk of int8 hidden states is projected by the projection's kernels
  /// near the full prefill; and every object a save plan stores is encoded
  /// by its gather's kernel, byte for byte as the host encodes it.
  void expectCompiledPlansLaunchTheirKernels(const std::string &restoresPath,
                                             const std::string &savesPath) {
    std::map<std::string, PlanBundle> bundles;
    for (const std::string &path : {restoresPath, savesPath}) {
      StatusOr<PlanBundle> bundle = readPlanBundle(path);
      ASSERT_TRUE(bundle) << bundle.status().toString();
      ASSERT_EQ(bundle->plans.size(), path == restoresPath ? 4u : 2u) << path;
      for (const BundlePlan &plan : bundle->plans)
        for (const BundleTask &task : plan.tasks)
          EXPECT_EQ(task.kernel.empty(), task.entry.empty())
              << path << ": " << plan.name << " task " << task.id;
      bundles[path] = std::move(*bundle);
    }
    const PlanBundle &restores = bundles[restoresPath];
    for (const BundlePlan &plan : restores.plans) {
      SCOPED_TRACE(plan.name);
      PlanBundle one = restores;
      one.plans = {plan};
      const auto [form, codec] = storedAs(plan, StepKind::Fetch);
      std::unique_ptr<ChunkStore> store = storeIn(codec, 64, form);
      std::vector<float> byKernels, onHost;
      double error = 1;
      StatusOr<RestoreMetrics> metrics =
          restoreWith(one, *store, &byKernels, /*kernels=*/true, &error);
      ASSERT_TRUE(metrics) << metrics.status().toString();
      // Every loaded chunk of 64 tokens: all of them, or the 192 tokens
      // loaded before the computed rest.
      EXPECT_EQ(metrics->kernelChunks, plan.name == "int4_then_compute"
                                           ? 192 / 64
                                           : (kTokens + 63) / 64);
      EXPECT_TRUE(metrics->kernelsNotLaunched.empty())
          << metrics->kernelsNotLaunched.front();
      if (form == Form::Hidden) {
        // As expectGeneratedProjectionsExact's, from int8 hidden states
        // that the host dequantizes before the kernels.
        EXPECT_LT(error, 1.0 / 32);
        continue;
      }
      metrics = restoreWith(one, *store, &onHost, /*kernels=*/false);
      ASSERT_TRUE(metrics) << metrics.status().toString();
      EXPECT_TRUE(byKernels == onHost);
    }
    const PlanBundle &saves = bundles[savesPath];
    BlockTable table = prefilledTable();
    for (const BundlePlan &plan : saves.plans) {
      SCOPED_TRACE(plan.name);
      PlanBundle one = saves;
      one.plans = {plan};
      expectSaveKernelsStoreAsTheHost(table, one,
                                      storedAs(plan, StepKind::Store).second);
    }
    cache_->release(table);
  }

  /// The model's runner on device_, made on first use.
  ModelRunner &runner() {
    if (!runner_)
      runner_ = device_->createRunner(*model_);
    return *runner_;
  }

  /// The device restores run on (set before SetUp).
  Device *device_ = &cpuDevice();
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<int32_t> tokens_;
  std::shared_ptr<Tier> tier_;
  std::unique_ptr<ChunkStore> store_;
  LlamaModel::Cache reference_;
  std::unique_ptr<PagedKVCache> cache_;
  std::unique_ptr<ResourcePools> pools_;
};

// Chunks are held in bf16 once decoded, hidden states in the model's own
// dtype: models stored in f16 and f32 restore as exactly as bf16 ones. An
// f32 model's hidden states are stored exactly, so K and V projected from
// them round to the bf16 values of a full prefill but for the few that the
// BLAS kernel's order of summation (CPU-dependent: up to 0.3% on AMD EPYC)
// puts on the other side of a rounding boundary; rounding the hidden states
// to bf16 on the way would change a third of the values.

} // namespace kvc::exec_test

#endif // KVC_UNITTESTS_RUNTIME_EXECUTORFIXTURE_H
