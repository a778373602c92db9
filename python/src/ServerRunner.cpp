//===- ServerRunner.cpp - A runner that prefills with the server's model --===//

#include "ServerRunner.h"

#include <nanobind/ndarray.h>

#include <string>
#include <vector>

namespace nb = nanobind;

namespace kvc::python {

namespace {

using Floats = std::vector<float>;
using FloatArray = nb::ndarray<nb::numpy, float, nb::ndim<3>, nb::c_contig>;
using AnyFloats = nb::ndarray<float, nb::c_contig, nb::device::cpu>;

/// `values` ([rows, heads, dim]) as a numpy array that owns them: the
/// callback may keep it as long as it likes.
nb::object ownedArray(Floats values, int64_t rows, int64_t heads,
                      int64_t dim) {
  auto *held = new Floats(std::move(values));
  nb::capsule owner(held, [](void *p) noexcept {
    delete static_cast<Floats *>(p);
  });
  return FloatArray(held->data(), {size_t(rows), size_t(heads), size_t(dim)},
                    owner)
      .cast();
}

/// One returned K or V as `count` floats, or why not.
Status copyOut(nb::handle array, int64_t count, const std::string &what,
               float *out) {
  AnyFloats floats;
  if (!nb::try_cast(array, floats, /*convert=*/true))
    return invalidArgument("the server's prefill returned a " + what +
                           " that is not an array of floats");
  if (int64_t(floats.size()) != count)
    return invalidArgument("the server's prefill returned a " + what + " of " +
                           std::to_string(floats.size()) +
                           " values; expected " + std::to_string(count) +
                           " (tokens x kv_heads x head_dim)");
  const float *data = floats.data();
  std::copy(data, data + count, out);
  return Status::ok();
}

} // namespace

ServerRunner::ServerRunner(Device &device, const ModelCompute &model)
    : ModelRunner(device, model), inner_(device.createRunner(model)) {}

ServerRunner::~ServerRunner() = default;

void ServerRunner::setPrefill(nb::object fn) { prefill_ = std::move(fn); }

int64_t ServerRunner::served() const { return served_; }

Status ServerRunner::prefillInto(PagedKVCache &cache, const BlockTable &table,
                                 const int32_t *tokens, int64_t position,
                                 int64_t n, int64_t layers,
                                 const LayerWritten &written) {
  bool set = false;
  if (cache.memory() == CacheMemory::Host) {
    nb::gil_scoped_acquire gil;
    set = prefill_.is_valid() && !prefill_.is_none();
  }
  if (!set)
    return inner_->prefillInto(cache, table, tokens, position, n, layers,
                               written);
  KVC_RETURN_IF_ERROR(serve(cache, table, tokens, position, n, layers));
  if (written)
    for (int64_t l = 0; l < layers; ++l)
      written(l);
  return Status::ok();
}

Status ServerRunner::serve(PagedKVCache &cache, const BlockTable &table,
                           const int32_t *tokens, int64_t position, int64_t n,
                           int64_t layers) {
  const ModelConfig &c = model().config();
  const int64_t heads = c.numKvHeads, dim = c.headDim, kv = heads * dim;
  if (layers < 0 || layers > c.numLayers)
    return invalidArgument("prefilling " + std::to_string(layers) +
                           " layers of a " + std::to_string(c.numLayers) +
                           "-layer model");
  // The context the cache holds of the layers computed, read before the
  // GIL is taken.
  std::vector<Floats> pastK(layers), pastV(layers);
  for (int64_t l = 0; l < layers; ++l) {
    pastK[l].resize(size_t(position * kv));
    pastV[l].resize(size_t(position * kv));
    KVC_RETURN_IF_ERROR(cache.read(table, l, 0, position, pastK[l].data(),
                                   pastV[l].data()));
  }
  std::vector<Floats> newK(layers, Floats(size_t(n * kv))),
      newV(layers, Floats(size_t(n * kv)));
  {
    nb::gil_scoped_acquire gil;
    if (!prefill_.is_valid() || prefill_.is_none())
      return failedPrecondition(
          "the server's prefill was removed during a restore");
    try {
      nb::list tokenList, past;
      for (int64_t i = 0; i < n; ++i)
        tokenList.append(tokens[i]);
      for (int64_t l = 0; l < layers; ++l)
        past.append(nb::make_tuple(
            ownedArray(std::move(pastK[l]), position, heads, dim),
            ownedArray(std::move(pastV[l]), position, heads, dim)));
      nb::object out = prefill_(tokenList, position, layers, past);
      if (!nb::isinstance<nb::sequence>(out) || nb::len(out) != size_t(layers))
        return invalidArgument("the server's prefill must return one (K, V) "
                               "pair per layer computed (" +
                               std::to_string(layers) + ")");
      for (int64_t l = 0; l < layers; ++l) {
        nb::object pair = out[l];
        if (!nb::isinstance<nb::sequence>(pair) || nb::len(pair) != 2)
          return invalidArgument("the server's prefill returned a layer that "
                                 "is not a (K, V) pair");
        const std::string layer = " of layer " + std::to_string(l);
        nb::object k = pair[0], v = pair[1];
        KVC_RETURN_IF_ERROR(copyOut(k, n * kv, "K" + layer, newK[l].data()));
        KVC_RETURN_IF_ERROR(copyOut(v, n * kv, "V" + layer, newV[l].data()));
      }
      ++served_;
    } catch (nb::python_error &error) {
      return internalError(std::string("the server's prefill raised: ") +
                           error.what());
    }
  }
  for (int64_t l = 0; l < layers; ++l)
    KVC_RETURN_IF_ERROR(
        cache.write(table, l, position, n, newK[l].data(), newV[l].data()));
  return Status::ok();
}

} // namespace kvc::python
