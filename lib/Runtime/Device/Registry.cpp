//===- Registry.cpp - Devices by their backend's name --------------------===//

#include "kvc/Runtime/Device/Registry.h"

#include <map>
#include <mutex>

namespace kvc {

namespace {

/// The drivers by name, constructed on first use (static registrations run
/// before main, in no set order) with the CPU's.
struct Drivers {
  std::mutex mutex;
  std::map<std::string, DriverFactory, std::less<>> byName;
};

Drivers &drivers() {
  // Never destroyed: devices outlive other statics.
  static Drivers *all = [] {
    auto *made = new Drivers;
    made->byName["cpu"] =
        [](const DeviceOptions &options) -> StatusOr<Device *> {
      if (!options.gemm.empty() && options.gemm != "f32")
        return invalidArgument("backend cpu: its GEMMs are fp32, not " +
                               options.gemm);
      return &cpuDevice();
    };
    return made;
  }();
  return *all;
}

} // namespace

void registerDriver(std::string name, DriverFactory factory) {
  Drivers &all = drivers();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.byName.emplace(std::move(name), std::move(factory));
}

StatusOr<Device *> openDevice(std::string_view name,
                              const DeviceOptions &options) {
  DriverFactory factory;
  {
    Drivers &all = drivers();
    std::lock_guard<std::mutex> lock(all.mutex);
    auto it = all.byName.find(name);
    if (it == all.byName.end()) {
      std::string have;
      for (const auto &[known, unused] : all.byName)
        have += (have.empty() ? "" : ", ") + known;
      return invalidArgument("no backend \"" + std::string(name) +
                             "\" in this build (it has " + have + ")");
    }
    factory = it->second;
  }
  return factory(options);
}

std::vector<std::string> backendNames() {
  Drivers &all = drivers();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::vector<std::string> names;
  for (const auto &[name, unused] : all.byName)
    names.push_back(name);
  return names;
}

} // namespace kvc
