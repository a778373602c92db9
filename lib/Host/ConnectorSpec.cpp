//===- ConnectorSpec.cpp - A Connector's options by name ------------------===//

#include "kvc/Host/ConnectorSpec.h"

#include "kvc/Runtime/Desc/CodecSpec.h"

namespace kvc::host {

StatusOr<LoadPolicy> parseLoadPolicy(std::string_view name) {
  if (name == "cheapest")
    return LoadPolicy::Cheapest;
  if (name == "always")
    return LoadPolicy::Always;
  if (name == "never")
    return LoadPolicy::Never;
  return invalidArgument("policy expects cheapest, always or never, got " +
                         std::string(name));
}

StatusOr<ConnectorOptions> connectorOptions(const ConnectorSpec &spec,
                                            const ModelCompute &model,
                                            Device &device, TargetDesc target,
                                            PlanHook planner) {
  auto positive = [](int64_t value, const char *field) -> Status {
    if (value > 0)
      return Status::ok();
    return invalidArgument(std::string(field) + " must be positive, got " +
                           std::to_string(value));
  };
  KVC_RETURN_IF_ERROR(positive(spec.chunkTokens, "chunk_tokens"));
  KVC_RETURN_IF_ERROR(positive(spec.layerGroup, "layer_group"));
  KVC_RETURN_IF_ERROR(positive(spec.stagingMiB, "staging_mib"));
  KVC_RETURN_IF_ERROR(positive(spec.planCacheEntries, "plan_cache_entries"));
  if (!(spec.maxKl >= 0))
    return invalidArgument("max_kl must be 0 or more, got " +
                           std::to_string(spec.maxKl));
  ConnectorOptions options;
  options.model = &model;
  options.stores = spec.stores;
  options.createStores = spec.createStores;
  options.tenant = spec.tenant;
  options.saveLayout = {spec.chunkTokens, spec.layerGroup};
  StatusOr<CodecSpec> codec = parseCodecSpec(spec.codec);
  if (!codec)
    return codec.status().withContext("codec");
  options.saveCodec = *codec;
  options.target = std::move(target);
  options.device = &device;
  options.planner = std::move(planner);
  StatusOr<std::vector<planning::Strategy>> strategies =
      planning::parseStrategies(spec.strategies);
  if (!strategies)
    return strategies.status().withContext("strategies");
  options.plans.strategies = std::move(*strategies);
  options.plans.stagingMiB = spec.stagingMiB;
  options.plans.codecProfile = spec.codecProfile;
  options.plans.maxKl = spec.maxKl;
  options.plans.gpuChip = spec.gpuChip;
  // The CPU backend launches no kernels: its plans need none unless asked.
  if (options.plans.gpuChip.empty() && std::string_view(device.name()) == "cpu")
    options.plans.gpuChip = "none";
  options.recomputeFailures = spec.recomputeFailures;
  KVC_ASSIGN_OR_RETURN(policy, parseLoadPolicy(spec.policy));
  options.policy = policy;
  options.planCacheEntries = std::size_t(spec.planCacheEntries);
  return options;
}

} // namespace kvc::host
