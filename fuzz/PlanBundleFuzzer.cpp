//===- PlanBundleFuzzer.cpp - Fuzzing the plan bundle reader --------------===//
//
// Feeds arbitrary text to parsePlanBundle, the reader every bundle a server
// loads goes through (plans, tasks, the kernel table). Any input must give
// an error or a bundle, never a crash or hang; and a bundle it accepts must
// pass validatePlanBundle again, the checks a bundle built in memory gets.
//
// With clang (-DKVC_LIBFUZZER=ON) this is a libFuzzer target:
//   build-fuzz/fuzz/kvc-bundle-fuzzer -max_total_time=60 SEED_DIR
// Otherwise a driver mutates seed bundles (a ctest, over the bundles the
// build compiles from fuzz/seeds/plans.mlir and fuzz/seeds/saves.mlir):
//   build/fuzz/kvc-bundle-fuzz ITERATIONS SEED.json [SEED.json ...]
// Most mutations edit the parsed JSON (a number made negative, huge or
// off by one; a string swapped for another of the bundle's; a key or an
// element dropped or repeated; a value of another type), so that they reach
// the checks behind the JSON syntax; the rest flip, cut or append bytes.
//
//===----------------------------------------------------------------------===//

#include "Mutations.h"

#include "kvc/Runtime/Exec/PlanBundle.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace kvc;

namespace {

/// Whether the reader accepted the input.
bool fuzzOne(const uint8_t *data, size_t size) {
  std::string_view json(reinterpret_cast<const char *>(data), size);
  StatusOr<PlanBundle> bundle = parsePlanBundle(json);
  if (!bundle)
    return false;
  Status again = validatePlanBundle(*bundle);
  if (!again.isOk()) {
    std::fprintf(stderr,
                 "kvc-bundle-fuzz: parsePlanBundle accepted a bundle that "
                 "validatePlanBundle refuses: %s\n",
                 again.toString().c_str());
    std::abort();
  }
  return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzzOne(data, size);
  return 0;
}

#ifndef KVC_LIBFUZZER
namespace {

using Json = nlohmann::json;

/// Every node of `root`, parents before children.
void collect(Json &node, std::vector<Json *> &nodes) {
  nodes.push_back(&node);
  if (node.is_structured())
    for (Json &child : node)
      collect(child, nodes);
}

/// One structural edit of `root`.
void mutate(Json &root, std::mt19937_64 &rng) {
  std::vector<Json *> nodes;
  collect(root, nodes);
  std::vector<std::string> strings;
  for (Json *node : nodes)
    if (node->is_string() && node->get_ref<std::string &>().size() < 256)
      strings.push_back(node->get<std::string>());
  Json &node = *nodes[rng() % nodes.size()];
  if (node.is_number()) {
    // Wrapping arithmetic: a value may already be huge.
    const uint64_t value =
        node.is_number_float()
            ? uint64_t(int64_t(std::clamp(node.get<double>(), -1e18, 1e18)))
            : node.get<uint64_t>();
    const uint64_t choices[] = {
        0,         ~uint64_t(0), value + 1,         value - 1,
        0 - value, value * 1024, uint64_t(1) << 62, rng() % 100000};
    node = int64_t(choices[rng() % std::size(choices)]);
  } else if (node.is_string()) {
    node = strings.empty() || rng() % 4 == 0 ? std::string()
                                             : strings[rng() % strings.size()];
  } else if (node.is_array() && !node.empty()) {
    const size_t at = rng() % node.size();
    if (rng() % 2)
      node.erase(at);
    else
      node.push_back(node[at]);
  } else if (node.is_object() && !node.empty()) {
    auto it = node.begin();
    std::advance(it, rng() % node.size());
    if (rng() % 2)
      node.erase(it);
    else
      it.value() = Json::array();
  } else {
    const Json replacements[] = {Json(),    Json(true),    Json(7),
                                 Json("x"), Json::array(), Json::object()};
    node = replacements[rng() % std::size(replacements)];
  }
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: kvc-bundle-fuzz ITERATIONS SEED.json [SEED.json ...]\n");
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  std::vector<Json> seeds;
  for (int i = 2; i < argc; ++i) {
    // A seed the reader refuses fuzzes nothing behind the syntax.
    StatusOr<PlanBundle> bundle = readPlanBundle(argv[i]);
    if (!bundle) {
      std::fprintf(stderr, "kvc-bundle-fuzz: seed: %s\n",
                   bundle.status().toString().c_str());
      return 1;
    }
    seeds.push_back(Json::parse(std::ifstream(argv[i])));
  }
  std::mt19937_64 rng(fuzz::mutationSeed(20261123));
  long accepted = 0;
  for (long i = 0; i < iterations; ++i) {
    Json tree = seeds[rng() % seeds.size()];
    for (int m = 0, n = 1 + int(rng() % 3); m < n; ++m)
      mutate(tree, rng);
    std::string input = tree.dump();
    if (rng() % 8 == 0)
      fuzz::damage(input, rng);
    accepted +=
        fuzzOne(reinterpret_cast<const uint8_t *>(input.data()), input.size());
  }
  std::printf("%ld bundles read without a crash (%ld of them accepted)\n",
              iterations, accepted);
  return 0;
}
#endif
