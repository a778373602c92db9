//===- KernelAbi.cpp - A generated kernel's view of the paged cache -------===//

#include "kvc/Runtime/Device/KernelAbi.h"

#include <algorithm>
#include <limits>

namespace kvc {

namespace {

Status unaddressable(const std::string &why) {
  return failedPrecondition("a generated kernel cannot address this cache: " +
                            why);
}

/// Elements from `from` to `to` (either order).
int64_t distance(const uint16_t *from, const uint16_t *to) {
  return (int64_t(reinterpret_cast<uintptr_t>(to)) -
          int64_t(reinterpret_cast<uintptr_t>(from))) /
         int64_t(sizeof(uint16_t));
}

} // namespace

void KernelParams::buffer(const std::string &name, const void *address,
                          int64_t elements) {
  buffers_[name] = {address, address, 0, elements, 1};
}

void KernelParams::scalar(const std::string &name, int64_t value) {
  scalars_[name] = value;
}

StatusOr<std::vector<void *>>
KernelParams::pointers(const BundleKernel &kernel) {
  std::vector<void *> out;
  for (const std::string &arg : kernel.args) {
    if (auto buffer = buffers_.find(arg); buffer != buffers_.end()) {
      Memref &m = buffer->second;
      for (void *field :
           {static_cast<void *>(&m.allocated), static_cast<void *>(&m.aligned),
            static_cast<void *>(&m.offset), static_cast<void *>(&m.size),
            static_cast<void *>(&m.stride)})
        out.push_back(field);
    } else if (auto scalar = scalars_.find(arg); scalar != scalars_.end()) {
      out.push_back(&scalar->second);
    } else {
      return invalidArgument("kernel \"" + kernel.name +
                             "\": no value for "
                             "its argument \"" +
                             arg + "\"");
    }
  }
  return out;
}

StatusOr<ChunkTable> chunkTable(const BundleKernel &kernel,
                                const std::vector<ChunkAt> &chunks) {
  if (chunks.empty())
    return invalidArgument("kernel \"" + kernel.name +
                           "\": a launch over no chunk");
  // Device addresses of separate allocations: compared and subtracted as
  // integers.
  auto address = [](const void *p) { return reinterpret_cast<uintptr_t>(p); };
  uintptr_t low = std::numeric_limits<uintptr_t>::max(), high = 0;
  for (const ChunkAt &chunk : chunks) {
    if (address(chunk.payload) % 16)
      return invalidArgument("kernel \"" + kernel.name +
                             "\": a payload that is not 16-byte aligned");
    low = std::min(low, address(chunk.payload));
    high =
        std::max(high, address(chunk.payload) + uintptr_t(kernel.payloadBytes));
  }
  ChunkTable table;
  table.base = reinterpret_cast<const char *>(low);
  table.bytes = int64_t(high - low);
  for (const ChunkAt &chunk : chunks)
    table.records.push_back({int64_t(address(chunk.payload) - low),
                             chunk.firstToken, chunk.firstLayer});
  return table;
}

StatusOr<std::vector<int32_t>>
KernelCacheArgs::blocks(const BlockTable &table) const {
  std::vector<int32_t> out(table.blocks.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int64_t scaled = int64_t(table.blocks[i]) * blockScale;
    if (scaled > std::numeric_limits<int32_t>::max())
      return failedPrecondition(
          "block " + std::to_string(table.blocks[i]) +
          " lies beyond a generated kernel's int32 block table");
    out[i] = int32_t(scaled);
  }
  return out;
}

StatusOr<KernelCacheArgs> kernelCacheArgs(const PagedKVCache &cache) {
  const PagedCacheConfig &config = cache.config();
  const int64_t width = cache.kvDim();
  const int64_t blockElements = config.blockSize * width;
  if (config.layers < 1 || blockElements < 1)
    return unaddressable("it holds no layer");
  if (config.dtype != DType::BF16)
    return unaddressable(std::string("it holds ") + dtypeName(config.dtype) +
                         ", the kernels write bf16");
  if (cache.blockStride() % blockElements)
    return unaddressable("blocks " + std::to_string(cache.blockStride()) +
                         " elements apart are not a whole number of blocks");
  KernelCacheArgs args;
  args.keys = cache.keyCache(0);
  args.values = cache.valueCache(0);
  args.blockScale = cache.blockStride() / blockElements;
  const int64_t span = config.numBlocks * cache.blockStride();
  int64_t layerElements = span;
  if (config.layers > 1)
    layerElements = distance(cache.keyCache(0), cache.keyCache(1));
  if (layerElements < span || layerElements % width)
    return unaddressable("layer 1 does not start a whole number of rows "
                         "after layer 0's end");
  for (int64_t l = 1; l < config.layers; ++l)
    if (distance(cache.keyCache(0), cache.keyCache(l)) != l * layerElements ||
        distance(cache.valueCache(0), cache.valueCache(l)) != l * layerElements)
      return unaddressable("layer " + std::to_string(l) +
                           "'s caches are not as far after layer " +
                           std::to_string(l - 1) + "'s as layer 1's after 0's");
  args.layerRows = layerElements / width;
  args.bytes =
      ((config.layers - 1) * layerElements + span) * int64_t(sizeof(uint16_t));
  return args;
}

StatusOr<KernelCacheArgs> kernelArgsFor(const BundleKernel &kernel,
                                        const PagedKVCache &cache) {
  const PagedCacheConfig &config = cache.config();
  if (kernel.kind == BundleKernel::Kind::RmsNorm)
    return failedPrecondition("kernel \"" + kernel.name + "\" is a " +
                              bundleKernelKindName(kernel.kind) +
                              " kernel, which addresses no cache");
  if (kernel.kvHeads != config.numKvHeads || kernel.headDim != config.headDim ||
      kernel.blockSize != config.blockSize)
    return failedPrecondition(
        "kernel \"" + kernel.name + "\" writes " +
        std::to_string(kernel.kvHeads) + " KV heads of " +
        std::to_string(kernel.headDim) + " in blocks of " +
        std::to_string(kernel.blockSize) + "; the cache holds " +
        std::to_string(config.numKvHeads) + " of " +
        std::to_string(config.headDim) + " in blocks of " +
        std::to_string(config.blockSize));
  return kernelCacheArgs(cache);
}

} // namespace kvc
