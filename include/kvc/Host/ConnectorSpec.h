//===- ConnectorSpec.h - A Connector's options by name ----------*- C++ -*-===//
//
// What a tool's flags or a binding's arguments say of a Connector: stores by
// URL, strategies, policy and save codec by name, budgets as numbers.
// connectorOptions parses them, in this one place, into the ConnectorOptions
// Connector::create takes, with the objects the caller holds (the model, the
// device, the target, the planner); kvc-run serve and restore and the Python
// package's Connector build theirs so.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_HOST_CONNECTORSPEC_H
#define KVC_HOST_CONNECTORSPEC_H

#include "kvc/Host/Connector.h"

#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace kvc::host {

struct ConnectorSpec {
  /// Store URLs (and the target tier each is priced as; empty: the tier of
  /// its scheme), first the one saves write.
  std::vector<StoreSpec> stores;
  /// Whether the first store may be created (ConnectorOptions::createStores).
  bool createStores = true;
  std::string tenant;
  /// Saves' objects: tokens and layers each, and the codec's name
  /// (parseCodecSpec: "raw", "int8/g32+zstd", ...).
  int64_t chunkTokens = 256;
  int64_t layerGroup = 1;
  std::string codec = "raw";
  /// The strategies decide chooses among, comma-separated
  /// (planning::parseStrategies; "all": every one).
  std::string strategies = "joint";
  /// "cheapest", "always" or "never" (parseLoadPolicy).
  std::string policy = "cheapest";
  bool recomputeFailures = true;
  int64_t stagingMiB = 256;
  /// A measured codec profile's path; empty: the built-in estimate.
  std::string codecProfile;
  /// The GPU chip plans' kernels are generated for; empty: the target's,
  /// none on the CPU backend (which launches no kernels).
  std::string gpuChip;
  /// The quality budget, in next-token KL divergence (nats).
  double maxKl = std::numeric_limits<double>::infinity();
  int64_t planCacheEntries = 256;
};

/// The policy `name` names: "cheapest", "always" or "never"; InvalidArgument
/// otherwise.
StatusOr<LoadPolicy> parseLoadPolicy(std::string_view name);

/// `spec` as the options of a Connector of `model` on `device`, priced for
/// `target` and planned through `planner`: every name parsed and every
/// number checked, errors naming the field. The caller keeps `model` and
/// `device` alive as long as the Connector.
StatusOr<ConnectorOptions> connectorOptions(const ConnectorSpec &spec,
                                            const ModelCompute &model,
                                            Device &device, TargetDesc target,
                                            PlanHook planner);

} // namespace kvc::host

#endif // KVC_HOST_CONNECTORSPEC_H
