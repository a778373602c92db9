//===- KernelDevice.cpp - Where a generated kernel's check runs -----------===//

#include "kvc/Testing/KernelDevice.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kvc::testing {

StatusOr<DeviceMemory> DeviceMemory::make(KernelDevice &device, size_t bytes) {
  KVC_ASSIGN_OR_RETURN(address, device.allocate(std::max<size_t>(bytes, 16)));
  return DeviceMemory(device, address, bytes);
}

DeviceMemory::DeviceMemory(DeviceMemory &&other) noexcept
    : device_(other.device_), address_(other.address_), bytes_(other.bytes_) {
  other.address_ = 0;
}

DeviceMemory::~DeviceMemory() {
  if (address_)
    device_->release(address_);
}

Status DeviceMemory::upload(const void *from) const {
  return bytes_ ? device_->copyIn(address_, from, bytes_) : Status::ok();
}

Status DeviceMemory::download(void *to) const {
  return bytes_ ? device_->copyOut(to, address_, bytes_) : Status::ok();
}

StatusOr<KernelCase> caseFor(const BundleKernel &k, int64_t chunks) {
  KernelShape shape;
  shape.tokens = k.tokens;
  shape.layers = k.layers;
  shape.kvHeads = k.kvHeads;
  shape.headDim = k.headDim;
  shape.blockSize = k.blockSize;
  shape.codec = k.codec;
  shape.storage = k.storage == "f32"   ? DType::F32
                  : k.storage == "f16" ? DType::F16
                                       : DType::BF16;
  shape.hidden = k.hidden;
  shape.eps = float(k.eps);
  const uint32_t seed = uint32_t(k.tokens * 131 + k.layers);
  StatusOr<KernelCase> made = KernelCase::forKind(
      k.kind, shape, /*firstToken=*/5, /*firstLayer=*/1, seed, chunks);
  if (!made)
    return made.status().withContext("case of " + k.name);
  if (chunks == 1 && int64_t(made->payload().size()) != k.payloadBytes)
    return failedPrecondition(k.name + ": the case's payload is " +
                              std::to_string(made->payload().size()) +
                              " bytes, the kernel's " +
                              std::to_string(k.payloadBytes));
  return made;
}

CaseOnDevice::CaseOnDevice(KernelDevice &device, const BundleKernel &kernel,
                           const KernelCase &c,
                           std::vector<DeviceMemory> buffers)
    : device_(device), kernel_(kernel), case_(c), buffers_(std::move(buffers)) {
  auto at = [&](Buffer b) {
    return reinterpret_cast<const void *>(buffer(b).address());
  };
  const int64_t bytes = int64_t(c.payload().size());
  params_.buffer("payload", at(Payload), bytes);
  params_.buffer("hidden", at(Payload), bytes);
  params_.buffer("key_cache", at(Keys), c.cacheValues() * 2);
  params_.buffer("value_cache", at(Values), c.cacheValues() * 2);
  params_.buffer("block_table", at(Table), int64_t(c.blockTable().size()));
  params_.buffer("chunks", at(Chunks), 3 * int64_t(c.chunks().size()));
  params_.buffer("rope_table", at(Rope), int64_t(c.ropeTable().size() * 4));
  params_.buffer("norm_weights", at(Weights),
                 int64_t(c.normWeights().size() * 4));
  params_.buffer("normed", at(Normed), c.normedValues() * 2);
  params_.scalar("first_layer", c.firstLayer());
  params_.scalar("layer_rows", c.layerRows());
}

StatusOr<std::unique_ptr<CaseOnDevice>>
CaseOnDevice::make(KernelDevice &device, const BundleKernel &kernel,
                   const KernelCase &c) {
  const size_t sizes[] = {c.payload().size(),
                          c.blockTable().size() * 4,
                          c.chunks().size() * sizeof(KernelChunk),
                          size_t(c.cacheValues()) * 2,
                          size_t(c.cacheValues()) * 2,
                          c.ropeTable().size() * 4,
                          c.normWeights().size() * 4,
                          size_t(c.normedValues()) * 2};
  std::vector<DeviceMemory> buffers;
  for (size_t bytes : sizes) {
    KVC_ASSIGN_OR_RETURN(memory, DeviceMemory::make(device, bytes));
    buffers.push_back(std::move(memory));
  }
  std::unique_ptr<CaseOnDevice> on(
      new CaseOnDevice(device, kernel, c, std::move(buffers)));
  KVC_RETURN_IF_ERROR(on->buffer(Rope).upload(c.ropeTable().data()));
  KVC_RETURN_IF_ERROR(on->buffer(Weights).upload(c.normWeights().data()));
  KVC_RETURN_IF_ERROR(on->buffer(Table).upload(c.blockTable().data()));
  KVC_RETURN_IF_ERROR(on->moveChunks(std::nullopt));
  return on;
}

Status CaseOnDevice::moveChunks(std::optional<int64_t> fromToken) {
  std::vector<KernelChunk> moved = case_.chunks();
  if (fromToken)
    for (KernelChunk &chunk : moved)
      chunk.firstToken = *fromToken;
  return buffer(Chunks).upload(moved.data());
}

StatusOr<CacheErrors> CaseOnDevice::check() {
  const KernelCase &c = case_;
  const bool norm = kernel_.kind == BundleKernel::Kind::RmsNorm;
  const int64_t n = c.cacheValues();
  std::vector<uint16_t> keys(n, KernelCase::kPoison),
      values(n, KernelCase::kPoison);
  std::string payload = c.payload();
  if (c.saves()) {
    c.fillCache(keys.data(), values.data());
    std::fill(payload.begin(), payload.end(), char(0xA5));
  }
  KVC_RETURN_IF_ERROR(buffer(Keys).upload(keys.data()));
  KVC_RETURN_IF_ERROR(buffer(Values).upload(values.data()));
  KVC_RETURN_IF_ERROR(buffer(Payload).upload(payload.data()));
  std::vector<uint16_t> normed(c.normedValues(), KernelCase::kPoison);
  KVC_RETURN_IF_ERROR(buffer(Normed).upload(normed.data()));

  KVC_ASSIGN_OR_RETURN(params, pointers());
  KVC_RETURN_IF_ERROR(device_.run(int64_t(c.chunks().size()), params.data()));

  if (norm) {
    KVC_RETURN_IF_ERROR(buffer(Normed).download(normed.data()));
    return c.checkNormed(normed.data());
  }
  KVC_RETURN_IF_ERROR(buffer(Keys).download(keys.data()));
  KVC_RETURN_IF_ERROR(buffer(Values).download(values.data()));
  KVC_RETURN_IF_ERROR(buffer(Payload).download(payload.data()));
  return c.check(keys.data(), values.data(),
                 reinterpret_cast<const uint8_t *>(payload.data()));
}

StatusOr<std::unique_ptr<PtxDevice>>
PtxDevice::make(const BundleKernel &kernel) {
  KVC_ASSIGN_OR_RETURN(module, PtxModule::parse(kernel.binary));
  return std::unique_ptr<PtxDevice>(new PtxDevice(kernel, std::move(module)));
}

PtxDevice::~PtxDevice() {
  for (const PtxRegion &region : allocations_)
    std::free(reinterpret_cast<void *>(region.base));
}

StatusOr<uint64_t> PtxDevice::allocate(size_t bytes) {
  void *memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!memory)
    return unavailable("out of host memory for " + std::to_string(bytes) +
                       " bytes");
  allocations_.push_back({reinterpret_cast<uint64_t>(memory), bytes});
  return allocations_.back().base;
}

void PtxDevice::release(uint64_t address) {
  auto it = std::find_if(
      allocations_.begin(), allocations_.end(),
      [&](const PtxRegion &region) { return region.base == address; });
  if (it == allocations_.end())
    return;
  std::free(reinterpret_cast<void *>(address));
  allocations_.erase(it);
}

Status PtxDevice::copyIn(uint64_t to, const void *from, size_t bytes) {
  std::memcpy(reinterpret_cast<void *>(to), from, bytes);
  return Status::ok();
}

Status PtxDevice::copyOut(void *to, uint64_t from, size_t bytes) {
  std::memcpy(to, reinterpret_cast<const void *>(from), bytes);
  return Status::ok();
}

Status PtxDevice::run(int64_t chunks, void **params) {
  const BundleKernel &k = kernel_;
  return module_.launch(
      k.function,
      {uint32_t(k.grid[0]), uint32_t(k.grid[1] * chunks), uint32_t(k.grid[2])},
      {uint32_t(k.block[0]), uint32_t(k.block[1]), uint32_t(k.block[2])},
      params, allocations_);
}

} // namespace kvc::testing
