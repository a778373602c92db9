//===- module.cpp - kvc's Python bindings ---------------------------------===//
//
// The extension module `kvc._kvc`: the host library's Connector, the model
// it computes with, and plan compilation, for Python servers. The Python
// package (python/kvc) wraps it in typed classes; nothing here is meant to
// be called directly.
//
// Tensors cross without copies through DLPack (nanobind's ndarray): numpy
// arrays, PyTorch CPU and CUDA tensors. A cache tensor's memory is the
// server's; the Python Connector keeps the tensors alive while registered.
// Every call releases the GIL while it runs (decide may compile, the waits
// block), and a kvc error is raised as kvc.Error with kvc's text and its
// status code's name.
//
//===----------------------------------------------------------------------===//

#include "kvc/Host/Connector.h"
#include "kvc/Host/ConnectorSpec.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Runtime/Model/Blas.h"
#include "kvc/Runtime/Model/LlamaModel.h"

#ifdef KVC_PYTHON_WITH_COMPILER
#include "kvc/Host/CompilerHook.h"
#endif
#include "kvc/Runtime/Device/Registry.h"

#include "ServerRunner.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>

namespace nb = nanobind;
using namespace nb::literals;
using namespace kvc;

namespace {

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

/// A kvc Status on its way to Python (translated to kvc.Error).
struct StatusError {
  Status status;
};

void check(Status status) {
  if (!status.isOk())
    throw StatusError{std::move(status)};
}

template <typename T> T take(StatusOr<T> result) {
  if (!result.isOk())
    throw StatusError{result.status()};
  return std::move(*result);
}

using Release = nb::call_guard<nb::gil_scoped_release>;

//===----------------------------------------------------------------------===//
// Models and targets
//===----------------------------------------------------------------------===//

/// A model kvc computes with: config.json and safetensors weights.
struct PyModel {
  std::shared_ptr<LlamaModel> model;
};

PyModel loadModel(const std::string &dir) {
  return PyModel{std::shared_ptr<LlamaModel>(take(LlamaModel::load(dir)))};
}

TargetDesc targetFrom(const std::string &json) {
  return take(parseTargetDesc(json));
}

Device &backendNamed(const std::string &name) {
  return *take(openDevice(name));
}

//===----------------------------------------------------------------------===//
// Cache tensors
//===----------------------------------------------------------------------===//

using AnyArray = nb::ndarray<nb::c_contig>;

host::CacheLayout layoutNamed(const std::string &name) {
  if (name == "separate")
    return host::CacheLayout::Separate;
  if (name == "keys_first")
    return host::CacheLayout::KeysFirst;
  if (name == "blocks_first")
    return host::CacheLayout::BlocksFirst;
  throw StatusError{invalidArgument(
      "layout expects separate, keys_first or blocks_first, got " + name)};
}

/// The server caches `keys` (and `values`) describe, checked for one dtype,
/// device and shape: [blocks, block_size, heads, head_dim] per tensor
/// (separate), [2, blocks, ...] (keys_first), [blocks, 2, ...]
/// (blocks_first).
host::ServerCaches serverCaches(const std::vector<AnyArray> &keys,
                                const std::vector<AnyArray> &values,
                                const std::string &layoutName) {
  host::ServerCaches caches;
  caches.layout = layoutNamed(layoutName);
  const bool separate = caches.layout == host::CacheLayout::Separate;
  if (keys.empty())
    throw StatusError{invalidArgument("no cache tensors")};
  if (separate != !values.empty() ||
      (separate && values.size() != keys.size()))
    throw StatusError{invalidArgument(
        separate ? "layout separate takes a K and a V tensor per layer"
                 : "layout " + layoutName + " takes one tensor per layer and "
                                            "no values")};
  const AnyArray &first = keys.front();
  const std::size_t rank = separate ? 4 : 5;
  auto describe = [&](const AnyArray &a) {
    std::string shape = "[";
    for (std::size_t i = 0; i < a.ndim(); ++i)
      shape += (i ? ", " : "") + std::to_string(a.shape(i));
    return shape + "]";
  };
  if (first.ndim() != rank)
    throw StatusError{invalidArgument(
        "a cache tensor of layout " + layoutName + " has " +
        std::to_string(rank) + " dimensions, got " + describe(first))};
  const nb::dlpack::dtype dtype = first.dtype();
  if (dtype == nb::dtype<uint16_t>() || dtype.bits != 16 ||
      (dtype.code != uint8_t(nb::dlpack::dtype_code::Bfloat) &&
       dtype.code != uint8_t(nb::dlpack::dtype_code::Float)))
    throw StatusError{
        unimplemented("cache tensors must be bfloat16 or float16")};
  caches.dtype = dtype.code == uint8_t(nb::dlpack::dtype_code::Bfloat)
                     ? DType::BF16
                     : DType::F16;
  const int deviceType = first.device_type();
  if (deviceType == nb::device::cuda::value)
    caches.memory = CacheMemory::Device;
  else if (deviceType != nb::device::cpu::value)
    throw StatusError{
        unimplemented("cache tensors must be in CPU or CUDA memory")};
  const std::size_t at = separate ? 0 : 1;
  if (caches.layout == host::CacheLayout::KeysFirst && first.shape(0) != 2)
    throw StatusError{invalidArgument(
        "layout keys_first is [2, blocks, block_size, heads, head_dim], got " +
        describe(first))};
  if (caches.layout == host::CacheLayout::BlocksFirst && first.shape(1) != 2)
    throw StatusError{invalidArgument(
        "layout blocks_first is [blocks, 2, block_size, heads, head_dim], "
        "got " + describe(first))};
  const std::size_t blocksAt =
      caches.layout == host::CacheLayout::KeysFirst ? 1 : 0;
  caches.numBlocks = int64_t(first.shape(blocksAt));
  caches.blockSize = int64_t(first.shape(at + 1));
  caches.numKvHeads = int64_t(first.shape(at + 2));
  caches.headDim = int64_t(first.shape(at + 3));
  auto add = [&](const AnyArray &a, std::vector<void *> &to) {
    bool same = a.ndim() == rank && a.dtype() == dtype &&
                a.device_type() == deviceType &&
                a.device_id() == first.device_id();
    for (std::size_t i = 0; same && i < rank; ++i)
      same = a.shape(i) == first.shape(i);
    if (!same)
      throw StatusError{invalidArgument(
          "every cache tensor must have the first's shape " + describe(first) +
          ", dtype and device; got " + describe(a))};
    to.push_back(a.data());
  };
  for (const AnyArray &k : keys)
    add(k, caches.keys);
  for (const AnyArray &v : values)
    add(v, caches.values);
  return caches;
}

//===----------------------------------------------------------------------===//
// The Connector
//===----------------------------------------------------------------------===//

/// Strategy names ("all": every one the stores allow) as the planner's.
std::vector<planning::Strategy>
strategiesNamed(const std::vector<std::string> &names) {
  std::vector<planning::Strategy> out;
  for (const std::string &name : names) {
    std::vector<planning::Strategy> each = take(planning::parseStrategies(name));
    if (each.empty()) // "all"
      return {};
    out.insert(out.end(), each.begin(), each.end());
  }
  return out;
}

host::PlanHook plannerNamed(const std::vector<std::string> &bundles) {
  if (!bundles.empty()) {
    std::vector<PlanBundle> read;
    for (const std::string &path : bundles)
      read.push_back(take(readPlanBundle(path)));
    return host::bundleHook(std::move(read));
  }
#ifdef KVC_PYTHON_WITH_COMPILER
  return host::compilerPlanHook();
#else
  throw StatusError{Status(
      StatusCode::Unavailable,
      "this kvc was built without the compiler: pass plan bundles")};
#endif
}

/// A Connector and what it must outlive: its model and its runner (the
/// server's prefill, when set: Connector.prefill_with).
struct PyConnector {
  std::shared_ptr<LlamaModel> model;
  std::unique_ptr<python::ServerRunner> runner;
  std::unique_ptr<host::Connector> connector;

  ~PyConnector() {
    // Its loads may be calling back into Python (the server's prefill):
    // they end without the GIL held here.
    if (connector && PyGILState_Check()) {
      nb::gil_scoped_release release;
      connector.reset();
    }
  }

  host::Connector &get() {
    if (!connector)
      throw StatusError{failedPrecondition("the connector is closed")};
    return *connector;
  }
};

/// A Connector of `model` on the device named `device`, priced for the
/// target `targetJson` holds, planned by the compiler or over `bundles`,
/// with the options `spec` names (connectorOptions parses them, as for
/// kvc-run).
std::shared_ptr<PyConnector>
createConnector(const PyModel &model, const host::ConnectorSpec &spec,
                const std::string &targetJson,
                const std::vector<std::string> &bundles,
                const std::string &device) {
  if (!model.model)
    throw StatusError{invalidArgument("no model")};
  auto created = std::make_shared<PyConnector>();
  created->model = model.model;
  Device &backend = backendNamed(device);
  host::ConnectorOptions options = take(
      host::connectorOptions(spec, *model.model, backend,
                             targetFrom(targetJson), plannerNamed(bundles)));
  created->runner =
      std::make_unique<python::ServerRunner>(backend, *options.model);
  options.runner = created->runner.get();
  created->connector = take(host::Connector::create(std::move(options)));
  return created;
}

nb::dict restoreMetrics(const RestoreMetrics &m) {
  nb::dict d;
  d["seconds"] = m.makespanSeconds;
  d["predicted_seconds"] = m.predictedSeconds;
  d["busy_seconds"] = m.busySeconds;
  d["bytes_read"] = m.bytesRead;
  d["flops"] = m.flops;
  d["layer_ready_seconds"] = m.layerReadySeconds;
  d["fallbacks"] = m.fallbacks;
  std::vector<std::pair<int64_t, int64_t>> fallbackTokens;
  for (const BundleRange &r : m.fallbackTokens)
    fallbackTokens.emplace_back(r.begin, r.end);
  d["fallback_tokens"] = fallbackTokens;
  d["staging_bytes"] = m.stagingBytes;
  d["kernel_chunks"] = m.kernelChunks;
  d["kernel_launches"] = m.kernelLaunches;
  d["kernels_not_launched"] = m.kernelsNotLaunched;
  return d;
}

nb::dict saveMetrics(const SaveMetrics &m) {
  nb::dict d;
  d["seconds"] = m.makespanSeconds;
  d["written"] = m.written;
  d["skipped"] = m.skipped;
  d["bytes_written"] = m.bytesWritten;
  d["busy_seconds"] = m.busySeconds;
  return d;
}

std::optional<std::chrono::milliseconds>
timeoutOf(std::optional<double> seconds) {
  if (!seconds)
    return std::nullopt;
  if (*seconds < 0)
    throw StatusError{invalidArgument("timeout must not be negative")};
  return std::chrono::milliseconds(int64_t(*seconds * 1e3));
}

//===----------------------------------------------------------------------===//
// Plans compiled ahead
//===----------------------------------------------------------------------===//

#ifdef KVC_PYTHON_WITH_COMPILER
/// Compiles the restore of `tokens` from what `storeUrl` holds, for
/// `targetJson`, one plan per strategy; each plan's name and predicted
/// seconds (None where the compiler made no estimate).
std::vector<std::pair<std::string, std::optional<double>>>
compileRestorePlans(const PyModel &model, const std::string &storeUrl,
                    const std::string &tenant,
                    const std::vector<int32_t> &tokens,
                    const std::string &targetJson,
                    const std::vector<std::string> &strategies) {
  host::StoreOptions storeOptions;
  storeOptions.url = storeUrl;
  storeOptions.tenant = tenant;
  storeOptions.layout.chunkTokens = 0; // As the store records it.
  std::unique_ptr<ChunkStore> store =
      take(host::openStore(storeOptions, *model.model));
  TargetDesc target = targetFrom(targetJson);
  TierDesc *tier = take(host::storeTier(target, store->tier()));
  host::PlanOptions options;
  options.strategies = strategiesNamed(strategies);
  options.gpuChip = "none";
  PlanBundle bundle =
      take(host::planRestore(host::compilerPlanHook(), *model.model, *store,
                             tokens, target, tier->name, options));
  std::vector<std::pair<std::string, std::optional<double>>> plans;
  for (const BundlePlan &plan : bundle.plans) {
    std::optional<double> seconds;
    if (plan.predictedUs)
      seconds = double(*plan.predictedUs) * 1e-6;
    plans.emplace_back(plan.name, seconds);
  }
  return plans;
}
#endif

} // namespace

NB_MODULE(_kvc, m) {
  m.doc() = "kvc's C++ host library (use the kvc package, not this module)";

  static nb::object errorType;
  errorType = nb::module_::import_("kvc._errors").attr("Error");
  nb::register_exception_translator([](const std::exception_ptr &p, void *) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError &e) {
      nb::object error =
          errorType(e.status.message(), statusCodeName(e.status.code()));
      PyErr_SetObject(errorType.ptr(), error.ptr());
    }
  });

  m.attr("has_compiler") =
#ifdef KVC_PYTHON_WITH_COMPILER
      true;
#else
      false;
#endif
  const std::vector<std::string> backends = backendNames();
  m.attr("has_cuda") =
      std::find(backends.begin(), backends.end(), "cuda") != backends.end();

  m.def("set_compute_threads", &setComputeThreads, "threads"_a);

  nb::class_<PyModel>(m, "Model")
      .def_static("load", &loadModel, "dir"_a, Release())
      .def_prop_ro("fingerprint",
                   [](const PyModel &p) { return p.model->fingerprint(); })
      .def_prop_ro("layers",
                   [](const PyModel &p) { return p.model->config().numLayers; })
      .def_prop_ro("kv_heads",
                   [](const PyModel &p) { return p.model->config().numKvHeads; })
      .def_prop_ro("head_dim",
                   [](const PyModel &p) { return p.model->config().headDim; })
      .def_prop_ro("hidden_size",
                   [](const PyModel &p) { return p.model->config().hiddenSize; })
      .def_prop_ro("vocab_size",
                   [](const PyModel &p) { return p.model->config().vocabSize; })
      .def_prop_ro("max_positions", [](const PyModel &p) {
        return p.model->config().maxPositions;
      });

  nb::class_<host::Lookup::Held>(m, "Held")
      .def_prop_ro("store", [](const host::Lookup::Held &h) { return h.store; })
      .def_prop_ro("chunk_tokens",
                   [](const host::Lookup::Held &h) { return h.layout.chunkTokens; })
      .def_prop_ro("layer_group",
                   [](const host::Lookup::Held &h) { return h.layout.layerGroup; })
      .def_prop_ro("form",
                   [](const host::Lookup::Held &h) {
                     return std::string(name(h.match.form));
                   })
      .def_prop_ro("codec",
                   [](const host::Lookup::Held &h) { return h.match.codec.str(); })
      .def_prop_ro("tokens",
                   [](const host::Lookup::Held &h) { return h.match.tokens; });

  nb::class_<host::Lookup>(m, "Lookup")
      .def_ro("held", &host::Lookup::held)
      .def_ro("tokens", &host::Lookup::tokens)
      .def_ro("from_index", &host::Lookup::fromIndex);

  nb::class_<host::Decision>(m, "Decision")
      .def_ro("load_tokens", &host::Decision::loadTokens)
      .def_ro("strategy", &host::Decision::strategy)
      .def_ro("predicted_seconds", &host::Decision::predictedSeconds)
      .def_ro("recompute_seconds", &host::Decision::recomputeSeconds)
      .def_ro("why", &host::Decision::why)
      .def_ro("store", &host::Decision::store)
      .def_prop_ro("chunk_tokens",
                   [](const host::Decision &d) { return d.layout.chunkTokens; })
      .def_prop_ro("layer_group",
                   [](const host::Decision &d) { return d.layout.layerGroup; })
      .def_prop_ro("loads", &host::Decision::loads);

  using host::ConnectorSpec;
  nb::class_<ConnectorSpec>(m, "ConnectorSpec")
      .def(nb::init<>())
      .def_prop_rw(
          "stores",
          [](const ConnectorSpec &s) {
            std::vector<std::string> urls;
            for (const host::StoreSpec &store : s.stores)
              urls.push_back(store.url);
            return urls;
          },
          [](ConnectorSpec &s, const std::vector<std::string> &urls) {
            s.stores.clear();
            for (const std::string &url : urls)
              s.stores.push_back({url, ""});
          })
      .def_rw("tenant", &ConnectorSpec::tenant)
      .def_rw("chunk_tokens", &ConnectorSpec::chunkTokens)
      .def_rw("layer_group", &ConnectorSpec::layerGroup)
      .def_rw("codec", &ConnectorSpec::codec)
      .def_rw("strategies", &ConnectorSpec::strategies)
      .def_rw("policy", &ConnectorSpec::policy)
      .def_rw("recompute_failures", &ConnectorSpec::recomputeFailures)
      .def_rw("staging_mib", &ConnectorSpec::stagingMiB)
      .def_rw("codec_profile", &ConnectorSpec::codecProfile)
      .def_rw("gpu_chip", &ConnectorSpec::gpuChip)
      .def_rw("max_kl", &ConnectorSpec::maxKl)
      .def_rw("plan_cache_entries", &ConnectorSpec::planCacheEntries);

  nb::class_<PyConnector>(m, "Connector")
      .def_static("create", &createConnector, "model"_a, "spec"_a,
                  "target_json"_a, "bundles"_a, "device"_a, Release())
      .def(
          "register_caches",
          [](PyConnector &c, const std::vector<AnyArray> &keys,
             const std::vector<AnyArray> &values, const std::string &layout) {
            host::ServerCaches caches = serverCaches(keys, values, layout);
            nb::gil_scoped_release release;
            check(c.get().registerCaches(take(
                host::viewServerCaches(caches, c.model->config()))));
          },
          // No conversion: a copy of a strided or other-dtype tensor would
          // take the loads that belong in the server's memory.
          "keys"_a.noconvert(), "values"_a.noconvert(), "layout"_a)
      .def(
          "lookup",
          [](PyConnector &c, const std::vector<int32_t> &tokens) {
            return take(c.get().lookup(tokens));
          },
          "tokens"_a, Release())
      .def(
          "decide",
          [](PyConnector &c, const std::string &id,
             const std::vector<int32_t> &tokens, int64_t onDevice,
             std::optional<double> recomputeSeconds) {
            return take(c.get().decide(id, tokens, onDevice, recomputeSeconds));
          },
          "id"_a, "tokens"_a, "tokens_on_device"_a,
          "recompute_seconds"_a = nb::none(), Release())
      .def(
          "decide_as",
          [](PyConnector &c, const std::string &id,
             const std::vector<int32_t> &tokens, int64_t onDevice,
             int64_t loadTokens, const std::string &strategy, int store,
             int64_t chunkTokens, int64_t layerGroup) {
            host::Decided decided;
            decided.loadTokens = loadTokens;
            decided.strategy = strategy;
            decided.store = store;
            decided.layout = {chunkTokens, layerGroup};
            return take(c.get().decide(id, tokens, onDevice, decided));
          },
          "id"_a, "tokens"_a, "tokens_on_device"_a, "load_tokens"_a,
          "strategy"_a, "store"_a, "chunk_tokens"_a, "layer_group"_a, Release())
      .def(
          "start_load",
          [](PyConnector &c, const std::string &id,
             const std::vector<int32_t> &blocks) {
            check(c.get().startLoad(id, blocks));
          },
          "id"_a, "block_ids"_a, Release())
      .def(
          "wait_layer",
          [](PyConnector &c, const std::string &id, int64_t layer,
             std::optional<double> timeout) {
            check(c.get().waitLayer(id, layer, timeoutOf(timeout)));
          },
          "id"_a, "layer"_a, "timeout"_a.none(), Release())
      .def(
          "wait_layer_on",
          [](PyConnector &c, const std::string &id, int64_t layer,
             uintptr_t stream) {
            check(c.get().waitLayerOn(id, layer,
                                      reinterpret_cast<void *>(stream)));
          },
          "id"_a, "layer"_a, "stream"_a, Release())
      .def(
          "wait_load",
          [](PyConnector &c, const std::string &id) {
            RestoreMetrics metrics;
            {
              nb::gil_scoped_release release;
              metrics = take(c.get().waitLoad(id));
            }
            return restoreMetrics(metrics);
          },
          "id"_a)
      .def(
          "failed_blocks",
          [](PyConnector &c, const std::string &id) {
            return take(c.get().failedBlocks(id));
          },
          "id"_a, Release())
      .def(
          "save_layer",
          [](PyConnector &c, const std::string &id,
             const std::vector<int32_t> &tokens, int64_t layer,
             const std::vector<int32_t> &blocks) {
            check(c.get().saveLayer(id, tokens, layer, blocks));
          },
          "id"_a, "tokens"_a, "layer"_a, "block_ids"_a, Release())
      .def(
          "wait_save",
          [](PyConnector &c, const std::string &id) {
            SaveMetrics metrics;
            {
              nb::gil_scoped_release release;
              metrics = take(c.get().waitSave(id));
            }
            return saveMetrics(metrics);
          },
          "id"_a)
      .def(
          "cancel",
          [](PyConnector &c, const std::string &id) {
            check(c.get().cancel(id));
          },
          "id"_a, Release())
      .def(
          "finished",
          [](PyConnector &c) {
            host::Finished f = c.get().finished();
            return std::make_pair(f.loads, f.saves);
          },
          Release())
      .def(
          "set_prefill",
          [](PyConnector &c, nb::object fn) {
            c.runner->setPrefill(std::move(fn));
          },
          "fn"_a.none())
      .def_prop_ro("prefills_served",
                   [](PyConnector &c) { return c.runner->served(); })
      .def_prop_ro("plans_compiled",
                   [](PyConnector &c) { return c.get().plansCompiled(); })
      .def_prop_ro("plan_cache_hits",
                   [](PyConnector &c) { return c.get().planCacheHits(); })
      .def(
          "close",
          [](PyConnector &c) {
            // Waits for what runs; the caches may be freed afterwards.
            c.connector.reset();
          },
          Release());

#ifdef KVC_PYTHON_WITH_COMPILER
  m.def("compile_restore", &compileRestorePlans, "model"_a, "store"_a,
        "tenant"_a, "tokens"_a, "target_json"_a, "strategies"_a, Release());
#endif
}
