//===- PagedKVCacheTest.cpp - The vLLM-layout restore target --------------===//

#include "kvc/Runtime/Device/PagedKVCache.h"

#include "kvc/Runtime/Model/ModelRunner.h"

#include "kvc/Runtime/Base/Half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

using namespace kvc;

namespace {

PagedCacheConfig smallConfig() {
  PagedCacheConfig config;
  config.layers = 2;
  config.numKvHeads = 2;
  config.headDim = 4;
  config.blockSize = 4;
  config.numBlocks = 8;
  return config;
}

/// Distinct values per (token, channel), exact in bf16 for small tags.
std::vector<float> pattern(int64_t first, int64_t n, int64_t dim, float tag) {
  std::vector<float> out(n * dim);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i)
      out[t * dim + i] = tag + float(first + t) + float(i) / 8;
  return out;
}

TEST(PagedKVCacheTest, WritesThroughTheBlockTableInVllmLayout) {
  auto cache = PagedKVCache::create(smallConfig());
  ASSERT_TRUE(cache) << cache.status().toString();
  PagedKVCache &c = **cache;
  EXPECT_EQ(c.bytes(), 2 * 2 * 8 * 4 * 8 * 2);
  StatusOr<BlockTable> table = c.allocate(10); // 3 blocks.
  ASSERT_TRUE(table);
  ASSERT_EQ(table->blocks.size(), 3u);
  EXPECT_EQ(c.freeBlocks(), 5);
  // Scatter the table over the cache to test the indirection.
  table->blocks = {5, 1, 6};

  const int64_t dim = c.kvDim();
  // Two chunks written separately, as two restore tasks would.
  std::vector<float> k0 = pattern(0, 6, dim, 0), v0 = pattern(0, 6, dim, 16);
  std::vector<float> k1 = pattern(6, 4, dim, 0), v1 = pattern(6, 4, dim, 16);
  ASSERT_TRUE(c.write(*table, 1, 0, 6, k0.data(), v0.data()).isOk());
  ASSERT_TRUE(c.write(*table, 1, 6, 4, k1.data(), v1.data()).isOk());

  // Token 9 lives in logical block 2 = physical block 6, row 1; head 1,
  // channel 2 is element [6][1][1][2] of [num_blocks, block_size, heads, dim].
  int64_t index = ((6 * 4 + 1) * 2 + 1) * 4 + 2;
  EXPECT_EQ(bf16ToFloat(c.keyCache(1)[index]), 9 + float(1 * 4 + 2) / 8);
  EXPECT_EQ(bf16ToFloat(c.valueCache(1)[index]), 25 + float(1 * 4 + 2) / 8);
  // Layer 0 is untouched.
  EXPECT_EQ(c.keyCache(0)[index], 0);

  std::vector<float> k(10 * dim), v(10 * dim);
  ASSERT_TRUE(c.read(*table, 1, 0, 10, k.data(), v.data()).isOk());
  std::vector<float> kAll = pattern(0, 10, dim, 0);
  std::vector<float> vAll = pattern(0, 10, dim, 16);
  EXPECT_EQ(k, kAll);
  EXPECT_EQ(v, vAll);
}

TEST(PagedKVCacheTest, ViewsCallerMemoryWithInterleavedBlocks) {
  // [num_blocks, 2, block_size, heads, dim]: K of block b, then its V.
  PagedCacheConfig config = smallConfig();
  const int64_t block = config.blockSize * config.numKvHeads * config.headDim;
  config.blockStride = 2 * block;
  std::vector<std::vector<uint16_t>> memory(
      config.layers, std::vector<uint16_t>(config.numBlocks * 2 * block));
  std::vector<PagedLayerMemory> layers;
  for (std::vector<uint16_t> &layer : memory)
    layers.push_back({layer.data(), layer.data() + block});
  auto cache = PagedKVCache::view(config, layers);
  ASSERT_TRUE(cache) << cache.status().toString();
  PagedKVCache &c = **cache;
  EXPECT_EQ(c.blockStride(), 2 * block);
  EXPECT_EQ(c.keyCache(1), memory[1].data());

  BlockTable table;
  table.blocks = {5, 1, 6}; // A caller's block manager's choice.
  const int64_t dim = c.kvDim();
  std::vector<float> k = pattern(0, 10, dim, 0), v = pattern(0, 10, dim, 16);
  ASSERT_TRUE(c.write(table, 1, 0, 10, k.data(), v.data()).isOk());
  // Token 9: physical block 6, row 1; head 1, channel 2.
  int64_t row = 6 * 2 * block + (1 * 2 + 1) * 4 + 2;
  EXPECT_EQ(bf16ToFloat(memory[1][row]), 9 + float(1 * 4 + 2) / 8);
  EXPECT_EQ(bf16ToFloat(memory[1][row + block]), 25 + float(1 * 4 + 2) / 8);
  // Blocks the table does not name are untouched.
  EXPECT_EQ(memory[1][0], 0);
  EXPECT_EQ(memory[0][row], 0);
  std::vector<float> kBack(10 * dim), vBack(10 * dim);
  ASSERT_TRUE(c.read(table, 1, 0, 10, kBack.data(), vBack.data()).isOk());
  EXPECT_EQ(kBack, k);
  EXPECT_EQ(vBack, v);
}

TEST(PagedKVCacheTest, RejectsViewsThatCannotHoldTheCache) {
  PagedCacheConfig config = smallConfig();
  std::vector<uint16_t> memory(4096);
  std::vector<PagedLayerMemory> layers(2, {memory.data(), memory.data()});
  config.blockStride = 8;
  auto shortStride = PagedKVCache::view(config, layers);
  ASSERT_FALSE(shortStride);
  EXPECT_EQ(shortStride.status().message(),
            "paged cache: a block stride of 8 elements is shorter than a "
            "block's 32");
  config.blockStride = 0;
  auto oneLayer = PagedKVCache::view(config, {layers[0]});
  ASSERT_FALSE(oneLayer);
  EXPECT_EQ(oneLayer.status().message(),
            "paged cache: 1 layers of memory for a 2-layer cache");
  layers[1].values = nullptr;
  auto missing = PagedKVCache::view(config, layers);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().message(),
            "paged cache: layer 1 has no key or value memory");
}

// A view of device memory is reached through its backend only: the host
// accesses refuse it instead of dereferencing device addresses, and so does
// the CPU backend, which would.
TEST(PagedKVCacheTest, DeviceCachesRefuseHostAccess) {
  PagedCacheConfig config = smallConfig();
  const int64_t perLayer =
      config.numBlocks * config.blockSize * config.numKvHeads * config.headDim;
  std::vector<uint16_t> memory(2 * config.layers * perLayer);
  std::vector<PagedLayerMemory> layers;
  for (int64_t l = 0; l < config.layers; ++l)
    layers.push_back({memory.data() + 2 * l * perLayer,
                      memory.data() + (2 * l + 1) * perLayer});
  auto cache = PagedKVCache::view(config, layers, CacheMemory::Device);
  ASSERT_TRUE(cache) << cache.status().toString();
  EXPECT_EQ((*cache)->memory(), CacheMemory::Device);
  BlockTable table = *(*cache)->allocate(4);
  std::vector<float> k = pattern(0, 4, 8, 1), v = pattern(0, 4, 8, 2);
  EXPECT_EQ((*cache)->write(table, 0, 0, 4, k.data(), v.data()).code(),
            StatusCode::FailedPrecondition);
  EXPECT_EQ((*cache)->read(table, 0, 0, 4, k.data(), v.data()).code(),
            StatusCode::FailedPrecondition);
  EXPECT_EQ(
      cpuDevice().readBack(**cache, table, 0, 0, 4, k.data(), v.data()).code(),
      StatusCode::FailedPrecondition);
}

TEST(PagedKVCacheTest, RoundsToBf16) {
  auto cache = PagedKVCache::create(smallConfig());
  ASSERT_TRUE(cache);
  BlockTable table = *(*cache)->allocate(1);
  std::vector<float> k(8, 1.0f + 1.0f / 1024), v(8, -3.14159f), outK(8), outV(8);
  ASSERT_TRUE((*cache)->write(table, 0, 0, 1, k.data(), v.data()).isOk());
  ASSERT_TRUE((*cache)->read(table, 0, 0, 1, outK.data(), outV.data()).isOk());
  EXPECT_EQ(outK[0], bf16ToFloat(floatToBf16(k[0])));
  EXPECT_NE(outK[0], k[0]);
  EXPECT_EQ(outV[3], bf16ToFloat(floatToBf16(v[3])));
}

TEST(PagedKVCacheTest, AnF16CacheRoundsToF16AndRefusesWhatItCannotHold) {
  PagedCacheConfig config = smallConfig();
  config.dtype = DType::F16;
  auto cache = PagedKVCache::create(config);
  ASSERT_TRUE(cache);
  BlockTable table = *(*cache)->allocate(2);
  // 1 + 2^-10 is f16's next value after 1 (bf16 would round it to 1).
  std::vector<float> k(8, 1.0f + 1.0f / 1024), v(8, -3.14159f), outK(8), outV(8);
  ASSERT_TRUE((*cache)->write(table, 0, 0, 1, k.data(), v.data()).isOk());
  ASSERT_TRUE((*cache)->read(table, 0, 0, 1, outK.data(), outV.data()).isOk());
  EXPECT_EQ(outK[0], k[0]);
  EXPECT_EQ(outV[3], f16ToFloat(floatToF16(v[3])));
  EXPECT_EQ((*cache)->keyCache(0)[0], floatToF16(k[0]));
  // bf16 values are converted.
  std::vector<uint16_t> bk(8, floatToBf16(2.5f)), bv(8, floatToBf16(-0.75f));
  ASSERT_TRUE((*cache)->write(table, 1, 1, 1, bk.data(), bv.data()).isOk());
  ASSERT_TRUE((*cache)->read(table, 1, 1, 1, outK.data(), outV.data()).isOk());
  EXPECT_EQ(outK[5], 2.5f);
  EXPECT_EQ(outV[0], -0.75f);
  // Beyond 65504, an error rather than an infinity passed off as a value;
  // an infinity written stays one.
  std::vector<float> big(8, 70000.0f), inf(8, INFINITY);
  EXPECT_EQ((*cache)->write(table, 0, 0, 1, big.data(), v.data()).code(),
            StatusCode::DataLoss);
  EXPECT_TRUE((*cache)->write(table, 0, 0, 1, inf.data(), v.data()).isOk());
  std::vector<uint16_t> bigBf16(8, floatToBf16(1e6f));
  EXPECT_EQ((*cache)->write(table, 0, 0, 1, bigBf16.data(), bv.data()).code(),
            StatusCode::DataLoss);
  config.dtype = DType::F32;
  EXPECT_EQ(PagedKVCache::create(config).status().code(),
            StatusCode::InvalidArgument);
}

TEST(PagedKVCacheTest, RejectsOutOfRangeAccess) {
  auto cache = PagedKVCache::create(smallConfig());
  ASSERT_TRUE(cache);
  PagedKVCache &c = **cache;
  BlockTable table = *c.allocate(5); // 2 blocks: 8 tokens.
  std::vector<float> k(16 * c.kvDim()), v(16 * c.kvDim());
  EXPECT_EQ(c.write(table, 2, 0, 1, k.data(), v.data()).message(),
            "paged cache: layer 2 out of range");
  EXPECT_EQ(c.write(table, 0, 6, 3, k.data(), v.data()).message(),
            "paged cache: tokens 6 to 9 exceed the block table's 8 tokens");
  table.blocks[1] = 99;
  EXPECT_EQ(c.read(table, 0, 0, 1, k.data(), v.data()).message(),
            "paged cache: block 99 does not exist");
  EXPECT_FALSE(PagedKVCache::create(PagedCacheConfig{}));
}

TEST(PagedKVCacheTest, AllocationIsAllOrNothingAndThreadSafe) {
  auto cache = PagedKVCache::create(smallConfig());
  ASSERT_TRUE(cache);
  PagedKVCache &c = **cache;
  StatusOr<BlockTable> tooBig = c.allocate(33);
  ASSERT_FALSE(tooBig);
  EXPECT_EQ(tooBig.status().code(), StatusCode::Unavailable);
  EXPECT_EQ(c.freeBlocks(), 8);

  // Eight threads each take and return one block many times: no block is
  // ever held twice.
  std::vector<std::thread> threads;
  std::vector<int> holders(8, 0);
  std::mutex m;
  bool doubleHeld = false;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      for (int round = 0; round < 1000; ++round) {
        StatusOr<BlockTable> table = c.allocate(1);
        if (!table)
          continue;
        int32_t block = table->blocks[0];
        {
          std::lock_guard<std::mutex> lock(m);
          doubleHeld |= holders[block]++ > 0;
        }
        {
          std::lock_guard<std::mutex> lock(m);
          --holders[block];
        }
        c.release(*table);
      }
    });
  for (std::thread &t : threads)
    t.join();
  EXPECT_FALSE(doubleHeld);
  EXPECT_EQ(c.freeBlocks(), 8);
}

} // namespace
