//===- Llama2cTest.cpp - Importing llama2.c checkpoints and tokenizers ----===//

#include "kvc/Runtime/Model/Llama2c.h"
#include "kvc/Host/Tools/DecodeQuality.h"
#include "kvc/Host/Tools/Generate.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/Tokenizer.h"

#include "TestModel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace kvc;

namespace {

const std::string kStories = std::string(KVC_MODELS_DIR) + "/stories260K";

/// A directory of this process's own: ctest runs the suite's cases, and the
/// whole suite under each OpenBLAS kernel family, side by side.
std::string scratch(const std::string &name) {
  std::string dir = test::tempPath("llama2c-" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

class Stories260K : public ::testing::Test {
protected:
  void SetUp() override {
    if (!std::filesystem::exists(kStories + "/stories260K.bin"))
      GTEST_SKIP() << "no " << kStories << " (set KVC_MODELS_DIR)";
  }
};

TEST_F(Stories260K, ImportsAModelThatTellsItsStory) {
  std::string dir = scratch("import");
  StatusOr<ModelConfig> config = importLlama2c(kStories + "/stories260K.bin",
                                               kStories + "/tok512.bin", dir);
  ASSERT_TRUE(config.isOk()) << config.status().toString();
  EXPECT_EQ(config->numLayers, 5);
  EXPECT_EQ(config->numKvHeads, 4);
  EXPECT_TRUE(config->tieWordEmbeddings);
  StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::load(dir);
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::load(tokenizerPath(dir), 512);
  ASSERT_TRUE(tokenizer.isOk()) << tokenizer.status().toString();

  // Greedy from BOS: the opening the model card describes. A wrong RoPE
  // layout, GQA mapping or norm drifts into gibberish within a dozen tokens.
  host::GenerateOptions options;
  options.steps = 20;
  StatusOr<std::vector<int32_t>> ids =
      host::generateAfterPrefill(**model, {Tokenizer::kBos}, options);
  ASSERT_TRUE(ids.isOk()) << ids.status().toString();
  EXPECT_EQ((*tokenizer)->decode(*ids).substr(0, 53),
            "Once upon a time, there was a little girl named Lily.");
}

TEST_F(Stories260K, LossierCodecsChangeTheNextTokenMore) {
  std::string dir = scratch("decode-quality");
  ASSERT_TRUE(importLlama2c(kStories + "/stories260K.bin",
                            kStories + "/tok512.bin", dir)
                  .isOk());
  StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::load(dir);
  ASSERT_TRUE(model.isOk()) << model.status().toString();
  StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::load(tokenizerPath(dir), 512);
  ASSERT_TRUE(tokenizer.isOk());
  const std::vector<int32_t> prompt =
      (*tokenizer)
          ->encode("Once upon a time, there was a little girl named Lily. She "
                   "loved to "
                   "play outside in the park.");
  StatusOr<host::DecodeQualityProbe> probe =
      host::DecodeQualityProbe::create(**model, prompt, 4, 6);
  ASSERT_TRUE(probe.isOk()) << probe.status().toString();
  auto measure = [&](const char *codec) {
    StatusOr<host::DecodeQuality> q = probe->measure(*parseCodecSpec(codec));
    EXPECT_TRUE(q.isOk()) << codec << ": " << q.status().toString();
    EXPECT_EQ(q->steps, 24);
    return q.isOk() ? *q : host::DecodeQuality{};
  };
  // A lossless round trip decodes exactly what the exact cache does.
  host::DecodeQuality zstd = measure("zstd");
  EXPECT_EQ(zstd.kl, 0.0);
  EXPECT_EQ(zstd.agreement, 1.0);
  // Quantization perturbs the distribution, more at fewer bits (by orders
  // of magnitude on this model: no kernel's rounding decides it).
  host::DecodeQuality int8 = measure("int8"), int2 = measure("int2");
  EXPECT_GT(int8.kl, 0.0);
  EXPECT_GT(int2.kl, 100 * int8.kl);
  EXPECT_LE(int2.agreement, int8.agreement);
  // A cut that does not fit the model's positions is refused up front.
  EXPECT_FALSE(
      host::DecodeQualityProbe::create(**model, prompt, 4, 1000).isOk());
}

TEST_F(Stories260K, TokenizerRoundTripsText) {
  StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::load(kStories + "/tok512.bin", 512);
  ASSERT_TRUE(tokenizer.isOk()) << tokenizer.status().toString();
  const Tokenizer &t = **tokenizer;
  for (std::string text : {"Once upon a time, there was a little girl.",
                           "Tom said: \"Zzz!\" 42 — naïve café", ""}) {
    std::vector<int32_t> ids = t.encode(text);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), Tokenizer::kBos);
    EXPECT_EQ(t.decode(std::vector<int32_t>(ids.begin() + 1, ids.end())),
              text.empty() ? "" : text)
        << text;
  }
  // Merges make common words one token: fewer tokens than characters.
  EXPECT_LT(t.encode("Once upon a time").size(), 8u);
}

TEST_F(Stories260K, BadCheckpointsAreClearErrors) {
  std::string dir = scratch("bad");
  std::filesystem::create_directories(dir);
  std::string good = readFile(kStories + "/stories260K.bin");

  std::string truncated = dir + "/truncated.bin";
  writeFile(truncated, good.substr(0, good.size() - 100));
  StatusOr<ModelConfig> r = importLlama2c(truncated, "", dir + "/out");
  EXPECT_EQ(r.status().code(), StatusCode::DataLoss);
  EXPECT_NE(r.status().message().find("bytes, the header's dimensions need"),
            std::string::npos)
      << r.status().message();

  std::string negative = dir + "/negative.bin";
  std::string bytes = good;
  int32_t layers = -5;
  std::memcpy(bytes.data() + 8, &layers, 4);
  writeFile(negative, bytes);
  r = importLlama2c(negative, "", dir + "/out");
  EXPECT_EQ(r.status().code(), StatusCode::InvalidArgument);
  EXPECT_NE(r.status().message().find("n_layers is -5"), std::string::npos)
      << r.status().message();

  writeFile(dir + "/short.bin", "abc");
  EXPECT_EQ(importLlama2c(dir + "/short.bin", "", dir + "/out").status().code(),
            StatusCode::DataLoss);
  EXPECT_EQ(
      importLlama2c(dir + "/missing.bin", "", dir + "/out").status().code(),
      StatusCode::NotFound);

  // A tokenizer of another vocabulary is refused before anything is written.
  std::string tok = readFile(kStories + "/tok512.bin");
  writeFile(dir + "/tok-short.bin", tok.substr(0, tok.size() - 7));
  r = importLlama2c(kStories + "/stories260K.bin", dir + "/tok-short.bin",
                    dir + "/out2");
  EXPECT_FALSE(r.isOk());
  EXPECT_FALSE(std::filesystem::exists(dir + "/out2/config.json"));
}

} // namespace
