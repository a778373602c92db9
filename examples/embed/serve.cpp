//===- serve.cpp - kvc embedded in a server, in miniature -----------------===//
//
// Plays an LLM server that keeps KV caches of finished requests in a store
// and restores them when a request with the same prefix comes back:
//
//   1. the server owns its paged KV cache (one allocation, vLLM's flash
//      layout per layer) and a block manager handing out blocks;
//   2. request A is prefilled into it (here with kvc's reference model, the
//      server's own model in a real one) and its KV saved to a store;
//   3. request B has A's prompt: the server asks the store how much of it
//      is held, plans a layer-wise restore through the planning hook (the
//      compiler, in-process), and restores into blocks of its own cache;
//   4. it consumes each layer as soon as that layer is resident, while
//      later layers still load, and checks it equals what A computed;
//   5. it prints the restore's metrics.
//
// Usage: kvc-embed-example TARGET_JSON [MODEL_DIR]
// (a small model is generated when no model is given). Exits non-zero on
// any error or on a restored value that differs from the saved one.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Session.h"
#include "kvc/Runtime/Base/Clock.h"
#include "kvc/Runtime/Model/GenModel.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Transforms/CompileRestore.h"

#include <cstdio>
#include <string>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

using namespace kvc;

namespace {

/// The server's KV memory: per layer, K and V of every block, in vLLM's
/// flash layout [num_blocks][block_size][num_kv_heads][head_dim].
struct ServerCache {
  PagedCacheConfig config;
  std::vector<uint16_t> memory;
  std::vector<int32_t> freeBlocks;

  StatusOr<BlockTable> allocate(int64_t tokens) {
    BlockTable table;
    for (int64_t t = 0; t < tokens; t += config.blockSize) {
      if (freeBlocks.empty())
        return Status(StatusCode::FailedPrecondition, "out of KV blocks");
      table.blocks.push_back(freeBlocks.back());
      freeBlocks.pop_back();
    }
    return table;
  }
};

Status fail(const std::string &message) {
  return Status(StatusCode::Internal, message);
}

Status serve(const std::string &targetPath, std::string modelDir) {
  // Without a model, a generated one: written to a directory of this
  // process's, loaded, and removed.
  std::string generated;
  if (modelDir.empty()) {
    generated = modelDir = (std::filesystem::temp_directory_path() /
                            ("kvc-embed-model-" + std::to_string(::getpid())))
                               .string();
    GenModelOptions options;
    options.seed = 3;
    KVC_RETURN_IF_ERROR(generateModel(modelDir, options));
  }
  StatusOr<std::unique_ptr<LlamaModel>> loaded = LlamaModel::load(modelDir);
  if (!generated.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(generated, ignored);
  }
  KVC_ASSIGN_OR_RETURN(model, std::move(loaded));
  KVC_ASSIGN_OR_RETURN(target, loadTargetDesc(targetPath));
  const ModelConfig &config = model->config();
  Backend &backend = cpuBackend();

  // 1. The server's cache: room for two 1024-token requests.
  ServerCache server;
  server.config.layers = config.numLayers;
  server.config.numKvHeads = config.numKvHeads;
  server.config.headDim = config.headDim;
  server.config.numBlocks = 2 * 1024 / server.config.blockSize;
  const int64_t perLayer = server.config.numBlocks * server.config.blockSize *
                           config.numKvHeads * config.headDim;
  server.memory.resize(2 * config.numLayers * perLayer);
  std::vector<PagedLayerMemory> layers;
  for (int64_t l = 0; l < config.numLayers; ++l)
    layers.push_back({server.memory.data() + 2 * l * perLayer,
                      server.memory.data() + (2 * l + 1) * perLayer});
  for (int32_t b = int32_t(server.config.numBlocks) - 1; b >= 0; --b)
    server.freeBlocks.push_back(b);
  KVC_ASSIGN_OR_RETURN(cache, PagedKVCache::view(server.config, layers));

  // 2. Request A, prefilled and saved, one object per layer and chunk.
  std::vector<int32_t> prompt(1024);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = int32_t((i * 131 + 17) % config.vocabSize);
  const int64_t n = int64_t(prompt.size());
  KVC_ASSIGN_OR_RETURN(tableA, server.allocate(n));
  KVC_RETURN_IF_ERROR(backend.prefill(*model, prompt, *cache, tableA)
                          ->compute({0, n, 0, config.numLayers}));
  host::StoreOptions storeOptions;
  storeOptions.url = "mem://";
  storeOptions.layout = {256, 1};
  storeOptions.access = TierAccess::Create;
  KVC_ASSIGN_OR_RETURN(store, host::openStore(storeOptions, *model));
  KVC_ASSIGN_OR_RETURN(saved, host::saveFromCache(backend, *cache, tableA,
                                                  *store, prompt, CodecSpec()));
  std::printf("request A: prefilled %lld tokens, saved %lld objects in %.2f "
              "ms\n",
              (long long)n, (long long)saved.written,
              saved.makespanSeconds * 1e3);

  // 3. Request B: the same prompt. What does the store hold?
  KVC_ASSIGN_OR_RETURN(matches, host::matchPrefix(*store, prompt));
  for (const host::PrefixMatch &match : matches)
    std::printf("request B: the store holds %s for %lld of %lld tokens\n",
                name(match.form), (long long)match.tokens, (long long)n);
  host::PlanHook hook = [](const ModelCompute &m, const TargetDesc &t,
                           const planning::Request &request,
                           int64_t chunkTokens,
                           const host::PlanOptions &options) {
    CompileRestoreOptions compile;
    compile.strategies = options.strategies;
    compile.chunkTokens = chunkTokens;
    compile.stagingMiB = options.stagingMiB;
    compile.layerWise = options.layerWise;
    compile.gpuChip = options.gpuChip;
    return compileRestore(m.config(), m.fingerprint(), t, request, compile);
  };
  KVC_ASSIGN_OR_RETURN(tier, host::storeTier(target, store->tier()));
  host::PlanOptions planOptions;
  planOptions.strategies = {"kv"};
  // The server consumes the restore layer by layer: plan for that.
  planOptions.layerWise = true;
  KVC_ASSIGN_OR_RETURN(bundle,
                       host::planRestore(hook, *model, *store, prompt, target,
                                         tier->name, planOptions));
  const BundlePlan &plan = bundle.plans.front();

  // 4. Restore into blocks of the server's own cache, layer by layer.
  KVC_ASSIGN_OR_RETURN(tableB, server.allocate(n));
  RestoreTarget into;
  into.backend = &backend;
  into.model = model.get();
  into.stores[tier->name] = store.get();
  into.tokens = &prompt;
  into.cache = cache.get();
  into.table = &tableB;
  KVC_ASSIGN_OR_RETURN(pools, backend.createPools(planResources(plan)));
  Clock::time_point start = Clock::now();
  KVC_ASSIGN_OR_RETURN(restoring,
                       host::RestoreHandle::start(*pools, plan, into));
  const int64_t kv = model->kvDim();
  std::vector<float> kA(n * kv), vA(n * kv), kB(n * kv), vB(n * kv);
  for (int64_t l = 0; l < config.numLayers; ++l) {
    KVC_RETURN_IF_ERROR(restoring->waitLayer(l));
    const double at = secondsSince(start);
    int64_t later = 0;
    for (int64_t m = l + 1; m < config.numLayers; ++m)
      later += !restoring->layerReady(m);
    // The server's attention for layer l would run here; this one checks
    // the layer against request A's.
    KVC_RETURN_IF_ERROR(
        backend.readBack(*cache, tableA, l, 0, n, kA.data(), vA.data()));
    KVC_RETURN_IF_ERROR(
        backend.readBack(*cache, tableB, l, 0, n, kB.data(), vB.data()));
    if (kA != kB || vA != vB)
      return fail("layer " + std::to_string(l) +
                  " differs from the KV request A saved");
    std::printf("request B: layer %lld resident at %.2f ms (%lld later "
                "layers still loading), equal to request A's\n",
                (long long)l, at * 1e3, (long long)later);
  }
  KVC_ASSIGN_OR_RETURN(metrics, restoring->wait());

  // 5. Metrics.
  // (The process's first restore: it pays for its pools' threads and the
  // first touch of its buffers, so no prediction is held against it.)
  std::printf("request B: restored with plan %s in %.2f ms\n",
              plan.name.c_str(), metrics.makespanSeconds * 1e3);
  for (const auto &[tier, bytes] : metrics.bytesRead)
    std::printf("  read %-8s %.2f MB\n", tier.c_str(), double(bytes) * 1e-6);
  for (const auto &[resource, seconds] : metrics.busySeconds)
    std::printf("  busy %-8s %.2f ms\n", resource.c_str(), seconds * 1e3);
  return Status::ok();
}

} // namespace

int main(int argc, char **argv) {
  const std::string first = argc > 1 ? argv[1] : "";
  const bool help = first == "--help" || first == "-h";
  if (help || argc < 2 || argc > 3 || first.rfind("-", 0) == 0) {
    std::fprintf(help ? stdout : stderr,
                 "usage: %s TARGET_JSON [MODEL_DIR]\n"
                 "  a server in miniature: saves a request's KV, plans and "
                 "runs its restore\n  through kvc's library for the target "
                 "TARGET_JSON, on a generated model or\n  MODEL_DIR's\n",
                 argv[0]);
    return help ? 0 : 2;
  }
  setComputeThreads(1);
  Status status = serve(argv[1], argc == 3 ? argv[2] : "");
  if (!status.isOk()) {
    std::fprintf(stderr, "kvc-embed-example: %s\n", status.toString().c_str());
    return 1;
  }
  return 0;
}
