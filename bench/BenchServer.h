//===- BenchServer.h - A server of the benchmarks' own ----------*- C++ -*-===//
//
// A server on the CPU backend as the Connector's benchmarks run one: a paged
// KV cache of host memory in vLLM's layout (K and V per layer), the model's
// forward pass over it, and the Connector calls a server makes around them.
// Header-only, for the bench/ programs.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_BENCH_BENCHSERVER_H
#define KVC_BENCH_BENCHSERVER_H

#include "kvc/Host/Connector.h"
#include "kvc/Runtime/Device/Device.h"
#include "kvc/Runtime/Model/LlamaModel.h"
#include "kvc/Runtime/Model/ModelRunner.h"

#include <numeric>
#include <vector>

namespace kvc::bench {

using host::Connector;
using host::ConnectorOptions;
using host::ServerCaches;

/// The server: one paged cache of host memory, K and V per layer.
struct Server {
  const LlamaModel &model;
  int64_t blocks;
  std::vector<uint16_t> memory;
  PagedKVCache *cache = nullptr; ///< The Connector's view of `memory`.
  /// The model's forward pass on the server's device.
  std::unique_ptr<ModelRunner> runner = cpuDevice().createRunner(model);

  ServerCaches caches() {
    const ModelConfig &c = model.config();
    ServerCaches out;
    out.numBlocks = blocks;
    out.numKvHeads = c.numKvHeads;
    out.headDim = c.headDim;
    const int64_t perLayer = blocks * out.blockSize * c.numKvHeads * c.headDim;
    if (memory.empty())
      memory.assign(2 * c.numLayers * perLayer, 0);
    for (int64_t l = 0; l < c.numLayers; ++l) {
      out.keys.push_back(memory.data() + 2 * l * perLayer);
      out.values.push_back(memory.data() + (2 * l + 1) * perLayer);
    }
    return out;
  }

  /// The server's chunked prefill of [from, n), attending over the cache.
  Status prefill(const std::vector<int32_t> &tokens, int64_t from,
                 const std::vector<int32_t> &ids, ModelRunner *on = nullptr) {
    BlockTable table{ids};
    return (on ? on : runner.get())->prefillInto(*cache, table, tokens.data() + from, from,
                               int64_t(tokens.size()) - from,
                               model.config().numLayers);
  }

  /// The server's forward pass over [from, n) to its first token, each
  /// layer after `attend` returns for it. On `on`, a runner of its own,
  /// from another thread.
  Status forward(const std::vector<int32_t> &tokens, int64_t from,
                 const std::vector<int32_t> &ids,
                 const ModelRunner::LayerGate &attend = {},
                 ModelRunner *on = nullptr) {
    BlockTable table{ids};
    std::vector<float> logits(std::size_t(model.config().vocabSize));
    return (on ? on : runner.get())
        ->decode(*cache, table, from, tokens.data() + from,
                 int64_t(tokens.size()) - from, logits.data(), attend);
  }
};

inline std::vector<int32_t> blockRange(int32_t first, int64_t tokens) {
  std::vector<int32_t> ids((tokens + 15) / 16);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

inline StatusOr<std::unique_ptr<Connector>> connect(ConnectorOptions options,
                                                    Server &server) {
  KVC_ASSIGN_OR_RETURN(connector, Connector::create(std::move(options)));
  KVC_ASSIGN_OR_RETURN(view,
                       viewServerCaches(server.caches(), server.model.config()));
  server.cache = view.get();
  KVC_RETURN_IF_ERROR(connector->registerCaches(std::move(view)));
  return connector;
}

/// Saves `tokens` (already in `ids`) through `connector`, layer by layer.
inline Status saveAll(Connector &connector, const std::string &id,
               const std::vector<int32_t> &tokens,
               const std::vector<int32_t> &ids, int64_t layers) {
  for (int64_t l = 0; l < layers; ++l)
    KVC_RETURN_IF_ERROR(connector.saveLayer(id, tokens, l, ids));
  return connector.waitSave(id).status();
}

} // namespace kvc::bench

#endif // KVC_BENCH_BENCHSERVER_H
