//===- CudaLaunch.cpp - Generated kernels on the CUDA backend -------------===//
//
// A plan bundle's kernels on the device: PTX loaded with the driver API on
// first launch (one module per distinct PTX text, in the runtime API's
// primary context, kept while the device lives), checked against the
// cache and model they would write, and launched on the call's lane.
//
//===----------------------------------------------------------------------===//

#include "CudaDeviceImpl.h"

namespace kvc::cuda {

Status CudaDevice::loads(const BundleKernel &kernel) {
  if (kernel.format != "ptx")
    return failedPrecondition("kernel \"" + kernel.name + "\" is " +
                              kernel.format + "; the cuda backend loads ptx");
  return Status::ok();
}

Status CudaDevice::canLaunch(const BundleKernel &kernel,
                             const PagedKVCache &cache) const {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  KVC_RETURN_IF_ERROR(loads(kernel));
  return kernelArgsFor(kernel, cache).status();
}

Status CudaDevice::canLaunchSave(const BundleKernel &kernel,
                                 const PagedKVCache &cache) const {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  KVC_RETURN_IF_ERROR(loads(kernel));
  if (kernel.kind != BundleKernel::Kind::Save)
    return failedPrecondition("kernel \"" + kernel.name +
                              "\" is no save kernel");
  return kernelArgsFor(kernel, cache).status();
}

Status CudaDevice::launchSave(const BundleKernel &kernel,
                              const PagedKVCache &cache,
                              const BlockTable &table,
                              const std::vector<ChunkBox> &boxes,
                              std::vector<std::string> &payloads) {
  KVC_RETURN_IF_ERROR(canLaunchSave(kernel, cache));
  for (const ChunkBox &box : boxes)
    if (kernel.tokens != box.tokens() || kernel.layers != box.layers())
      return internalError("launchSave: kernel \"" + kernel.name +
                           "\" does not encode this chunk");
  KVC_ASSIGN_OR_RETURN(lease, acquire());
  Lane &lane = *lease;
  Span span(*this, lane, "generated save");
  KVC_RETURN_IF_ERROR(afterWrites(cache, lane));
  KVC_ASSIGN_OR_RETURN(function, functionOf(kernel));
  Scratch scratch(lane);
  // The payloads back to back, each 16-byte aligned.
  const int64_t n = int64_t(boxes.size());
  const int64_t stride = (kernel.payloadBytes + 15) / 16 * 16;
  KVC_ASSIGN_OR_RETURN(out, scratch.take<char>(n * stride));
  std::vector<Placed> placed;
  for (int64_t i = 0; i < n; ++i)
    placed.push_back({out + i * stride, boxes[i]});
  KVC_ASSIGN_OR_RETURN(params,
                       cacheParams(kernel, placed, cache, table, scratch));
  KVC_RETURN_IF_ERROR(launch(kernel, function, params, lane, n));
  std::string all(size_t(n * stride), '\0');
  KVC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(all.data(), out, all.size(),
                                           cudaMemcpyDeviceToHost, lane.stream),
                           "device-to-host copy");
  KVC_RETURN_IF_ERROR(lane.sync("generated save kernel"));
  payloads.clear();
  for (int64_t i = 0; i < n; ++i)
    payloads.push_back(
        all.substr(size_t(i * stride), size_t(kernel.payloadBytes)));
  return Status::ok();
}

Status CudaDevice::canLaunchProject(const BundleKernel &prologue,
                                    const BundleKernel &epilogue,
                                    const ModelConfig &c, bool bf16Gemms,
                                    const PagedKVCache &cache) const {
  KVC_RETURN_IF_ERROR(CudaModel::supports(c));
  KVC_RETURN_IF_ERROR(canLaunch(epilogue, cache));
  KVC_RETURN_IF_ERROR(loads(prologue));
  if (!bf16Gemms)
    return failedPrecondition(
        "the model's GEMMs take fp32 inputs; the prologue writes "
        "bf16");
  if (prologue.hidden != c.hiddenSize || prologue.layers != epilogue.layers ||
      prologue.tokens != epilogue.tokens)
    return failedPrecondition("prologue \"" + prologue.name +
                              "\" normalizes another shape than the model's "
                              "hidden states or its epilogue's chunk");
  return Status::ok();
}

StatusOr<double> CudaDevice::launchProject(
    const BundleKernel &prologue, const BundleKernel &epilogue,
    const ModelCompute &model, const CudaModel &gpu, const DeviceBuffer &hidden,
    DType dtype, const ChunkBox &box, PagedKVCache &cache,
    const BlockTable &table) {
  KVC_RETURN_IF_ERROR(
      canLaunchProject(prologue, epilogue, model.config(), gpu.bf16(), cache));
  const ModelConfig &c = model.config();
  const int64_t tokens = box.tokens(), layers = box.layers(), h = c.hiddenSize,
                kvDim = model.kvDim();
  const CudaBuffer &in = bufferOf(hidden);
  if (epilogue.tokens != tokens || epilogue.layers != layers ||
      2 * in.words != layers * tokens * h * dtypeBytes(dtype) ||
      epilogue.payloadBytes != layers * 2 * tokens * kvDim * 4)
    return internalError("launchProject: kernels \"" + prologue.name +
                         "\" and \"" + epilogue.name +
                         "\" do not project this chunk");
  KVC_ASSIGN_OR_RETURN(rope, gpu.fullRopeTable());
  KVC_ASSIGN_OR_RETURN(lease, acquire());
  Lane &lane = *lease;
  Span span(*this, lane, "generated projection");
  KVC_RETURN_IF_ERROR(in.readOn(lane.stream));
  KVC_ASSIGN_OR_RETURN(normFunction, functionOf(prologue));
  KVC_ASSIGN_OR_RETURN(ropeFunction, functionOf(epilogue));
  Scratch scratch(lane);
  KVC_ASSIGN_OR_RETURN(normed, scratch.take<uint16_t>(layers * tokens * h));
  KVC_ASSIGN_OR_RETURN(projected,
                       scratch.take<float>(layers * 2 * tokens * kvDim));
  KVC_ASSIGN_OR_RETURN(scatter, cacheParams(epilogue, {{projected, box}}, cache,
                                            table, scratch));
  KernelParams norm;
  norm.buffer("hidden", in.memory.get<char>(), 2 * in.words);
  norm.buffer("norm_weights", gpu.attnNorms(),
              c.numLayers * h * int64_t(sizeof(float)));
  norm.buffer("normed", normed, layers * tokens * h * 2);
  norm.scalar("first_layer", box.layerBegin);
  KVC_RETURN_IF_ERROR(launch(prologue, normFunction, norm, lane));
  for (int64_t l = 0; l < layers; ++l) {
    float *k = projected + 2 * l * tokens * kvDim;
    KVC_RETURN_IF_ERROR(gpu.projectKV(lane, box.layerBegin + l,
                                      normed + l * tokens * h, tokens, k,
                                      k + tokens * kvDim));
  }
  scatter.buffer("rope_table", rope,
                 c.maxPositions * c.headDim * int64_t(sizeof(float)));
  KVC_RETURN_IF_ERROR(launch(epilogue, ropeFunction, scatter, lane));
  KVC_RETURN_IF_ERROR(in.readBy(lane.stream));
  KVC_RETURN_IF_ERROR(wrote(cache, lane, "generated projection"));
  return model.projectFlops(tokens, layers);
}

Status CudaDevice::launchRestore(const BundleKernel &kernel,
                                 const std::vector<RestoreChunk> &chunks,
                                 PagedKVCache &cache, const BlockTable &table) {
  KVC_RETURN_IF_ERROR(needDevice(cache));
  std::vector<Placed> placed;
  for (const RestoreChunk &chunk : chunks) {
    const CudaBuffer &in = bufferOf(*chunk.payload);
    if (kernel.tokens != chunk.box.tokens() ||
        kernel.layers != chunk.box.layers() ||
        2 * in.words < kernel.payloadBytes)
      return internalError("launchRestore: kernel \"" + kernel.name +
                           "\" does not decode this chunk's payload");
    placed.push_back({in.memory.get<char>(), chunk.box});
  }
  KVC_ASSIGN_OR_RETURN(lease, acquire()); // The device's context current.
  Lane &lane = *lease;
  Span span(*this, lane, "generated restore");
  KVC_ASSIGN_OR_RETURN(function, functionOf(kernel));
  Scratch scratch(lane);
  KVC_ASSIGN_OR_RETURN(params,
                       cacheParams(kernel, placed, cache, table, scratch));
  for (const RestoreChunk &chunk : chunks)
    KVC_RETURN_IF_ERROR(bufferOf(*chunk.payload).readOn(lane.stream));
  KVC_RETURN_IF_ERROR(
      launch(kernel, function, params, lane, int64_t(placed.size())));
  for (const RestoreChunk &chunk : chunks)
    KVC_RETURN_IF_ERROR(bufferOf(*chunk.payload).readBy(lane.stream));
  return wrote(cache, lane, "generated restore kernel");
}

StatusOr<KernelParams> CudaDevice::cacheParams(
    const BundleKernel &kernel, const std::vector<Placed> &chunks,
    const PagedKVCache &cache, const BlockTable &table, Scratch &scratch) {
  KVC_ASSIGN_OR_RETURN(args, kernelArgsFor(kernel, cache));
  std::vector<ChunkAt> at;
  for (const Placed &chunk : chunks) {
    const ChunkBox &box = chunk.box;
    KVC_RETURN_IF_ERROR(cache.checkRange(table, box.layerBegin, box.layerEnd,
                                         box.tokenBegin, box.tokens()));
    at.push_back({chunk.payload, box.tokenBegin, box.layerBegin});
  }
  KVC_ASSIGN_OR_RETURN(chunkTable, kvc::chunkTable(kernel, at));
  KVC_ASSIGN_OR_RETURN(blocks, args.blocks(table));
  // [block table, padded to 8 bytes][chunk records]
  const int64_t blockWords = (int64_t(blocks.size()) + 1) / 2;
  std::vector<int64_t> tables(
      size_t(blockWords + 3 * int64_t(chunkTable.records.size())));
  std::memcpy(tables.data(), blocks.data(), blocks.size() * sizeof(int32_t));
  std::memcpy(tables.data() + blockWords, chunkTable.records.data(),
              chunkTable.records.size() * sizeof(KernelChunk));
  KVC_ASSIGN_OR_RETURN(device,
                       scratch.copy(tables.data(), int64_t(tables.size())));
  KernelParams params;
  params.buffer("payload", chunkTable.base, chunkTable.bytes);
  params.buffer("key_cache", args.keys, args.bytes);
  params.buffer("value_cache", args.values, args.bytes);
  params.buffer("block_table", device, int64_t(blocks.size()));
  params.buffer("chunks", device + blockWords,
                3 * int64_t(chunkTable.records.size()));
  params.scalar("layer_rows", args.layerRows);
  return params;
}

Status CudaDevice::launch(const BundleKernel &kernel, CUfunction function,
                          KernelParams &params, Lane &lane, int64_t chunks) {
  KVC_ASSIGN_OR_RETURN(pointers, params.pointers(kernel));
  return driver_->check(
      driver_->cuLaunchKernel(
          function, unsigned(kernel.grid[0]), unsigned(kernel.grid[1] * chunks),
          unsigned(kernel.grid[2]), unsigned(kernel.block[0]),
          unsigned(kernel.block[1]), unsigned(kernel.block[2]), 0,
          reinterpret_cast<CUstream>(lane.stream), pointers.data(), nullptr),
      ("launching generated kernel " + kernel.name).c_str());
}

StatusOr<CUfunction> CudaDevice::functionOf(const BundleKernel &kernel) {
  std::lock_guard<std::mutex> lock(functionsMutex_);
  std::vector<LoadedKernel> &loaded = functions_[kernel.name];
  for (const LoadedKernel &candidate : loaded)
    if (candidate.ptx == kernel.binary)
      return candidate.function;
  LoadedKernel fresh{kernel.binary};
  KVC_RETURN_IF_ERROR(driver_->check(
      driver_->cuModuleLoadData(&fresh.module, kernel.binary.c_str()),
      "loading a generated kernel's PTX"));
  Status found =
      driver_->check(driver_->cuModuleGetFunction(&fresh.function, fresh.module,
                                                  kernel.function.c_str()),
                     "finding a generated kernel's entry");
  if (!found.isOk()) {
    driver_->cuModuleUnload(fresh.module);
    return found;
  }
  loaded.push_back(fresh);
  return fresh.function;
}

} // namespace kvc::cuda
