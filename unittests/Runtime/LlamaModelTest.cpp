//===- LlamaModelTest.cpp - Tests for the reference model -----------------===//

#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Base/Half.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/RmsNorm.h"
#include "kvc/Runtime/Model/Rope.h"

#include "TestModel.h"
#include "Tolerance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

using namespace kvc;

namespace {

/// A small random model, generated once per test binary.
const std::string &modelDir() {
  static std::string dir =
      kvc::test::generateTestModel("llama-model-test", 7, 3);
  return dir;
}

std::vector<int32_t> tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out(n);
  for (int32_t &t : out)
    t = int32_t(rng() % 512);
  return out;
}

using test::kOneBf16Step;
using test::relativeMaxError;

// Two prefills of one prompt chunked differently agree to about 1e-6 in fp32
// (attention's GEMMs are shaped by the chunking), and K and V are rounded to
// bf16, where such a difference can land on neighbouring values: one bf16
// step of the largest value (kOneBf16Step). A misplaced or missing context
// token moves values by far more.

// A compiler names a bundle's model without loading it: the fingerprint
// read from the files is the loaded model's; a directory without weights has
// none.
TEST(LlamaModel, FingerprintWithoutLoading) {
  StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::load(modelDir());
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  StatusOr<std::string> fingerprint = modelFingerprint(modelDir());
  ASSERT_TRUE(fingerprint.isOk()) << fingerprint.status().toString();
  EXPECT_EQ(*fingerprint, (*model)->fingerprint());
  const std::string other = kvc::test::generateTestModel("llama-model-other", 8, 3);
  EXPECT_NE(*modelFingerprint(other), *fingerprint);
  EXPECT_EQ(modelFingerprint("/nonexistent").status().code(),
            StatusCode::NotFound);
}

TEST(LlamaModel, LoadsGeneratedModel) {
  StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::load(modelDir());
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  EXPECT_EQ((*model)->config().numLayers, 3);
  EXPECT_EQ((*model)->kvDim(), 64);
  EXPECT_EQ((*model)->fingerprint().size(), 64u);
}

TEST(LlamaModel, FingerprintDependsOnWeights) {
  // Same shape, other weights.
  std::string other = kvc::test::generateTestModel("llama-model-other", 8, 3);
  auto a = LlamaModel::load(modelDir());
  auto b = LlamaModel::load(other);
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_NE((*a)->fingerprint(), (*b)->fingerprint());
  auto again = LlamaModel::load(modelDir());
  EXPECT_EQ((*a)->fingerprint(), (*again)->fingerprint());
}

TEST(LlamaModel, ComputeThreadsDoNotChangeTheCache) {
  // kvc-run computes on one core by default and a server may choose more:
  // the restored cache must not depend on it beyond rounding. Which GEMM
  // kernel OpenBLAS runs, and so its order of summation, depends on the CPU
  // and on how the work is split between threads: on some CPUs the caches
  // agree bit for bit, on others (AMD EPYC with AVX-512) they differ in the
  // last bf16 bit, which is all kvc guarantees.
  auto model = std::move(*LlamaModel::load(modelDir()));
  std::vector<int32_t> t = tokens(300, 5);
  std::vector<LlamaModel::Cache> caches;
  for (int threads : {1, 2}) {
    setComputeThreads(threads);
    caches.push_back(model->newCache());
    ASSERT_TRUE(model->prefill(caches.back(), t.data(), 300).isOk());
  }
  setComputeThreads(1);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_LE(relativeMaxError(caches[0].k[l], caches[1].k[l]), kOneBf16Step)
        << l;
    EXPECT_LE(relativeMaxError(caches[0].v[l], caches[1].v[l]), kOneBf16Step)
        << l;
  }
}

TEST(LlamaModel, ChunkedPrefillMatchesOneShot) {
  auto model = std::move(*LlamaModel::load(modelDir()));
  // Short, and long enough that chunks straddle attention's query and key
  // blocks.
  for (auto [total, chunk] : {std::pair<int64_t, int64_t>{96, 32},
                              {1100, 300}}) {
    std::vector<int32_t> t = tokens(total, 1);
    LlamaModel::Cache whole = model->newCache();
    ASSERT_TRUE(model->prefill(whole, t.data(), total).isOk());
    LlamaModel::Cache chunked = model->newCache();
    for (int64_t i = 0; i < total; i += chunk)
      ASSERT_TRUE(model
                      ->prefill(chunked, t.data() + i,
                                std::min(chunk, total - i))
                      .isOk());
    for (int64_t l = 0; l < 3; ++l) {
      EXPECT_LE(relativeMaxError(chunked.k[l], whole.k[l]), kOneBf16Step)
          << total;
      EXPECT_LE(relativeMaxError(chunked.v[l], whole.v[l]), kOneBf16Step)
          << total;
    }
  }
}

TEST(LlamaModel, ShallowPrefillMatchesTheFirstLayersAndStopsDeeperOnes) {
  auto model = std::move(*LlamaModel::load(modelDir()));
  std::vector<int32_t> t = tokens(64, 2);
  LlamaModel::Cache whole = model->newCache();
  ASSERT_TRUE(model->prefill(whole, t.data(), 64).isOk());
  LlamaModel::Cache shallow = model->newCache();
  ASSERT_TRUE(model->prefill(shallow, t.data(), 32).isOk());
  ASSERT_TRUE(model->prefill(shallow, t.data() + 32, 32, {}, 2).isOk());
  EXPECT_EQ(shallow.tokens, 64);
  for (int64_t l = 0; l < 2; ++l)
    EXPECT_LE(relativeMaxError(shallow.k[l], whole.k[l]), kOneBf16Step);
  EXPECT_EQ(int64_t(shallow.k[2].size()), 32 * model->kvDim());
  // Layer 2 fell behind: prefilling it further would misplace its KV.
  Status deeper = model->prefill(shallow, t.data(), 8);
  EXPECT_EQ(deeper.code(), StatusCode::FailedPrecondition);
  EXPECT_EQ(model->prefill(shallow, t.data(), 8, {}, 9).code(),
            StatusCode::InvalidArgument);
}

TEST(LlamaModel, ProjectingHiddenStatesReproducesKV) {
  auto model = std::move(*LlamaModel::load(modelDir()));
  std::vector<int32_t> t = tokens(64, 2);
  LlamaModel::Cache cache = model->newCache();
  const int64_t h = model->config().hiddenSize, kv = model->kvDim();
  std::vector<std::vector<float>> hidden(3);
  ASSERT_TRUE(model
                  ->prefill(cache, t.data(), 64,
                            [&](const LayerSnapshot &s) {
                              hidden[s.layer].assign(s.hidden,
                                                     s.hidden + s.tokens * h);
                            })
                  .isOk());
  for (int64_t l = 0; l < 3; ++l) {
    // Stored as bf16, as the save path stores them.
    for (float &x : hidden[l])
      x = bf16ToFloat(floatToBf16(x));
    std::vector<float> k(64 * kv), v(64 * kv);
    model->project(l, hidden[l].data(), 64, 0, k.data(), v.data());
    // Within bf16 rounding of the exact K and V.
    EXPECT_LT(relativeMaxError(k, cache.k[l]), 1.0 / 128) << "layer " << l;
    EXPECT_LT(relativeMaxError(v, cache.v[l]), 1.0 / 128) << "layer " << l;
  }
}

TEST(LlamaModel, RejectsTokensOutsideVocabAndContext) {
  auto model = std::move(*LlamaModel::load(modelDir()));
  LlamaModel::Cache cache = model->newCache();
  int32_t bad = 512;
  Status s = model->prefill(cache, &bad, 1);
  EXPECT_EQ(s.code(), StatusCode::InvalidArgument);
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos);
}

TEST(LlamaModel, ReportsMissingAndMisshapenTensors) {
  std::string dir = test::tempPath("llama-model-broken");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(modelDir() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  TensorMap tensors = *loadSafetensors(modelDir());
  tensors.erase("model.layers.1.mlp.up_proj.weight");
  ASSERT_TRUE(
      writeSafetensors(dir + "/model.safetensors", tensors, DType::BF16).isOk());
  auto missing = LlamaModel::load(dir);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("model.layers.1.mlp.up_proj"),
            std::string::npos);
  tensors["model.layers.1.mlp.up_proj.weight"] = Tensor{{3, 3}, std::vector<float>(9)};
  ASSERT_TRUE(
      writeSafetensors(dir + "/model.safetensors", tensors, DType::BF16).isOk());
  auto misshapen = LlamaModel::load(dir);
  ASSERT_FALSE(misshapen.isOk());
  EXPECT_NE(misshapen.status().message().find("has shape [3, 3]"),
            std::string::npos);
}

/// `modelDir()`'s model as a Qwen2 (its config's model_type changed) with
/// `tensors`: biases of zero are a Llama's projections.
StatusOr<std::unique_ptr<LlamaModel>> asQwen2(const TensorMap &tensors) {
  std::string dir = test::tempPath("llama-model-qwen2");
  std::filesystem::create_directories(dir);
  std::ifstream in(modelDir() + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const std::string from = "\"model_type\": \"llama\"";
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << text;
  text.replace(at, from.size(), "\"model_type\": \"qwen2\"");
  std::ofstream(dir + "/config.json") << text;
  KVC_RETURN_IF_ERROR(
      writeSafetensors(dir + "/model.safetensors", tensors, DType::F32));
  return LlamaModel::load(dir);
}

// Qwen2's q, k and v projections are biased: its checkpoint must hold the
// biases, a zero bias computes the Llama's KV, and K moves with k's bias
// (transformers checks the values: python/tests/test_transformers.py).
TEST(LlamaModel, Qwen2ReadsAndAddsItsBiases) {
  auto llama = std::move(*LlamaModel::load(modelDir()));
  TensorMap tensors = *loadSafetensors(modelDir());
  const int64_t q = llama->config().hiddenSize, kv = llama->kvDim();
  for (int64_t l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    tensors[p + "q_proj.bias"] = Tensor{{q}, std::vector<float>(q)};
    tensors[p + "k_proj.bias"] = Tensor{{kv}, std::vector<float>(kv)};
    tensors[p + "v_proj.bias"] = Tensor{{kv}, std::vector<float>(kv)};
  }
  auto zero = asQwen2(tensors);
  ASSERT_TRUE(zero.isOk()) << zero.status().toString();
  EXPECT_TRUE((*zero)->config().qkvBias);
  EXPECT_NE((*zero)->fingerprint(), llama->fingerprint());
  std::vector<int32_t> t = tokens(40, 5);
  LlamaModel::Cache expected = llama->newCache(), cache = (*zero)->newCache();
  ASSERT_TRUE(llama->prefill(expected, t.data(), 40).isOk());
  ASSERT_TRUE((*zero)->prefill(cache, t.data(), 40).isOk());
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(cache.k[l], expected.k[l]) << "layer " << l;
    EXPECT_EQ(cache.v[l], expected.v[l]) << "layer " << l;
  }

  // V's bias is added to every token's V as it is.
  std::vector<float> bias(kv);
  for (int64_t i = 0; i < kv; ++i)
    bias[i] = float(i % 7) - 3.0f;
  tensors["model.layers.0.self_attn.v_proj.bias"] = Tensor{{kv}, bias};
  auto biased = asQwen2(tensors);
  ASSERT_TRUE(biased.isOk()) << biased.status().toString();
  LlamaModel::Cache moved = (*biased)->newCache();
  ASSERT_TRUE((*biased)->prefill(moved, t.data(), 40).isOk());
  for (int64_t i = 0; i < 40 * kv; i += 13)
    EXPECT_NEAR(moved.v[0][i], expected.v[0][i] + bias[i % kv],
                kOneBf16Step * 8)
        << "element " << i;

  tensors.erase("model.layers.2.self_attn.k_proj.bias");
  auto missing = asQwen2(tensors);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("layers.2.self_attn.k_proj.bias"),
            std::string::npos)
      << missing.status().toString();
}

// A model loaded without its fp32 host weights names itself as the loaded
// model does and views its checkpoint as stored (what a GPU copies); its
// first host-side compute makes the weights and computes what the eagerly
// loaded model does.
TEST(LlamaModel, HostWeightsAreMadeOnFirstUse) {
  auto eager = LlamaModel::load(modelDir());
  LlamaModel::LoadOptions options;
  options.hostWeights = false;
  auto lazy = LlamaModel::load(modelDir(), options);
  ASSERT_TRUE(eager.isOk() && lazy.isOk());
  const LlamaModel &model = **lazy;
  EXPECT_TRUE((*eager)->hasHostWeights());
  EXPECT_FALSE(model.hasHostWeights());
  EXPECT_EQ(model.fingerprint(), (*eager)->fingerprint());

  const ModelConfig &c = model.config();
  const TensorView &q = model.storedLayer(1).q;
  EXPECT_EQ(q.shape,
            (std::vector<int64_t>{c.numHeads * c.headDim, c.hiddenSize}));
  std::vector<float> stored(size_t(q.numel()));
  q.toFloats(0, q.numel(), stored.data());
  EXPECT_FALSE(model.hasHostWeights()); // Viewing made nothing.
  EXPECT_EQ(stored, (*eager)->layer(1).q);

  const std::vector<int32_t> prompt = tokens(40, 5);
  std::vector<float> expected(size_t(c.vocabSize)), got(expected.size());
  LlamaModel::Cache a = (*eager)->newCache(), b = model.newCache();
  ASSERT_TRUE((*eager)
                  ->nextLogits(a, 0, prompt.data(), int64_t(prompt.size()),
                               expected.data())
                  .isOk());
  ASSERT_TRUE(
      model.nextLogits(b, 0, prompt.data(), int64_t(prompt.size()), got.data())
          .isOk());
  EXPECT_TRUE(model.hasHostWeights());
  EXPECT_EQ(got, expected);
}

// A checkpoint's tensors viewed in place are what loadSafetensors converts,
// under the same digest; a tensor in two shards is refused.
TEST(Safetensors, ViewsInPlaceAreTheLoadedTensors) {
  std::string digest;
  StatusOr<TensorMap> loaded = loadSafetensors(modelDir(), &digest);
  StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
      Checkpoint::open(modelDir());
  ASSERT_TRUE(loaded.isOk() && checkpoint.isOk());
  EXPECT_EQ((*checkpoint)->digest(), digest);
  EXPECT_EQ(*safetensorsDigest(modelDir()), digest);
  ASSERT_EQ((*checkpoint)->tensors().size(), loaded->size());
  for (const auto &[name, tensor] : *loaded) {
    StatusOr<TensorView> view = (*checkpoint)->tensor(name);
    ASSERT_TRUE(view.isOk()) << name;
    EXPECT_EQ(view->shape, tensor.shape) << name;
    std::vector<float> values(size_t(view->numel()));
    view->toFloats(0, view->numel(), values.data());
    EXPECT_EQ(values, tensor.data) << name;
  }
  EXPECT_EQ((*checkpoint)->tensor("no.such.weight").status().code(),
            StatusCode::InvalidArgument);

  std::string dir = test::tempPath("safetensors-twice");
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir + "/model.safetensors");
  TensorMap one{{"w", Tensor{{2}, {1.0f, 2.0f}}}};
  ASSERT_TRUE(
      writeSafetensors(dir + "/a.safetensors", one, DType::BF16).isOk());
  ASSERT_TRUE(
      writeSafetensors(dir + "/b.safetensors", one, DType::BF16).isOk());
  {
    std::ofstream index(dir + "/model.safetensors.index.json");
    index << R"({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}})";
  }
  StatusOr<std::unique_ptr<Checkpoint>> twice = Checkpoint::open(dir);
  ASSERT_FALSE(twice.isOk());
  EXPECT_EQ(twice.status().code(), StatusCode::DataLoss);
  EXPECT_NE(twice.status().message().find("tensor w is in another file"),
            std::string::npos)
      << twice.status().message();
}

TEST(Safetensors, RejectsTruncatedFiles) {
  std::string dir = test::tempPath("safetensors-truncated");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(modelDir() + "/model.safetensors",
                             dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  auto size = std::filesystem::file_size(dir + "/model.safetensors");
  std::filesystem::resize_file(dir + "/model.safetensors", size - 100);
  auto loaded = loadSafetensors(dir);
  ASSERT_FALSE(loaded.isOk());
  EXPECT_EQ(loaded.status().code(), StatusCode::DataLoss);
}

// YaRN (Qwen2.5's and Qwen3's long-context scaling) as transformers 5.19's
// _compute_yarn_parameters computes it for this config: its inverse
// frequencies and the factor its cosines and sines are scaled by.
TEST(Rope, YarnIsTransformers) {
  StatusOr<ModelConfig> config = parseModelConfig(
      R"({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "vocab_size": 256,
          "max_position_embeddings": 1024, "dtype": "float32",
          "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 256, "rope_theta": 10000.0}})",
      "m");
  ASSERT_TRUE(config.isOk()) << config.status().toString();
  const std::vector<double> expected = {1,
                                        0.25693506,
                                        0.0625,
                                        0.0138349654,
                                        0.00249999994,
                                        0.000790569466,
                                        0.000250000012,
                                        7.90569466e-05};
  std::vector<float> inv = ropeFrequencies(*config);
  ASSERT_EQ(inv.size(), expected.size());
  for (size_t i = 0; i < inv.size(); ++i)
    EXPECT_NEAR(inv[i], expected[i], 1e-6 * expected[i]) << "frequency " << i;
  EXPECT_NEAR(ropeAttentionScale(*config), 1.138629436111989, 1e-6);
  std::vector<float> row(16);
  ropeCosSin(inv, 3, 1, row.data(), ropeAttentionScale(*config));
  EXPECT_NEAR(row[0], std::cos(3.0) * 1.138629436111989, 1e-6);
  EXPECT_NEAR(row[8], std::sin(3.0) * 1.138629436111989, 1e-6);
}

TEST(Half, RoundTripsAndRounds) {
  for (float x : {0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-3f}) {
    EXPECT_NEAR(bf16ToFloat(floatToBf16(x)), x, std::fabs(x) / 128 + 1e-30);
    EXPECT_NEAR(f16ToFloat(floatToF16(x)), x, std::fabs(x) / 1024 + 1e-7);
  }
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToF16(1.0f), 0x3C00);
}

// RMSNorm's one summation order (RmsNorm.h): the lanes it sums over, a
// result within f32 rounding of the exact norm for widths that do and do not
// fill whole pieces and lanes, in place or not, and the pairwise order it
// promises (a row whose order-dependent sum shows which order ran).
TEST(RmsNormTest, SumsInItsOrder) {
  EXPECT_EQ(rmsNormLanes(4096), 32);
  EXPECT_EQ(rmsNormLanes(64), 8);
  EXPECT_EQ(rmsNormLanes(40), 4);
  EXPECT_EQ(rmsNormLanes(3), 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int64_t h : {3, 40, 64, 4096, 2880}) {
    std::vector<float> x(2 * h), weight(h), out(2 * h);
    for (float &v : x)
      v = normal(rng);
    for (float &w : weight)
      w = 1 + 0.1f * normal(rng);
    rmsNorm(x.data(), 2, h, 1e-5f, weight.data(), out.data());
    for (int64_t i = 0; i < 2; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < h; ++j)
        sum += double(x[i * h + j]) * x[i * h + j];
      const double scale = 1 / std::sqrt(sum / h + 1e-5);
      std::vector<float> exact(h);
      for (int64_t j = 0; j < h; ++j)
        exact[j] = float(x[i * h + j] * scale * weight[j]);
      EXPECT_LE(relativeMaxError(out.data() + i * h, exact.data(), size_t(h)),
                1e-5)
          << "h " << h << " row " << i;
    }
    std::vector<float> inPlace = x;
    rmsNorm(inPlace.data(), 2, h, 1e-5f, weight.data(), inPlace.data());
    EXPECT_EQ(inPlace, out) << "h " << h;
  }
  // 16 values, 2 lanes: lane 0 sums piece 0 (2^24, 4096 squared), lane 1
  // piece 1 (eight 1s). Lanes first: 2^24 + 8, exact. In the values' order
  // each 2^24 + 1 would round back to 2^24.
  std::vector<float> row(16, 1.0f), one(16, 1.0f), normed(16);
  row[0] = 4096.0f;
  std::fill(row.begin() + 1, row.begin() + 8, 0.0f);
  rmsNorm(row.data(), 1, 16, 0.0f, one.data(), normed.data());
  const float lanesFirst =
      4096.0f * (1.0f / std::sqrt((16777216.0f + 8.0f) / 16.0f + 0.0f));
  ASSERT_NE(lanesFirst, 4.0f); // What the values' order would give.
  EXPECT_EQ(normed[0], lanesFirst);
}

} // namespace
