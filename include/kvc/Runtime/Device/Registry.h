//===- Registry.h - Devices by their backend's name ------------*- C++ -*-===//
//
// Drivers side by side, found by name as IREE finds its HAL drivers: "cpu"
// is always there; a driver linked into the program registers itself
// ("cuda": lib/Runtime/Cuda/Register.cpp, whose object file every program
// that links KVCCudaBackend gets). Tools, bindings and servers open a
// device by the backend name a user gave and never name a driver's
// factory, so a new backend is its folder and its registration, not an
// #ifdef in each caller.
//
// A driver opens its device once per process, on first use, and keeps it
// for the process's life (restores share it); later opens return it.
// Thread-safe.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_REGISTRY_H
#define KVC_RUNTIME_DEVICE_REGISTRY_H

#include "kvc/Runtime/Device/Device.h"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvc {

/// What a driver may be asked for when it opens its device.
struct DeviceOptions {
  /// The device's index among the driver's devices.
  int device = 0;
  /// The precision of its model runners' GEMMs: "" (the driver's choice),
  /// "f32" or "bf16"; a driver that cannot honour it refuses.
  std::string gemm;
};

/// A driver's entry: its device, opened on the first call and kept (the
/// driver owns it); every call checks `options` against it.
using DriverFactory = std::function<StatusOr<Device *>(const DeviceOptions &)>;

/// Makes backend `name` open through `factory` (a driver's static
/// registration). Registering a name twice keeps the first.
void registerDriver(std::string name, DriverFactory factory);

/// The device of backend `name` ("cpu", "cuda", ...). Unavailable when the
/// driver finds no device; InvalidArgument naming the registered backends
/// when none has that name.
StatusOr<Device *> openDevice(std::string_view name,
                              const DeviceOptions &options = {});

/// The registered backends' names, sorted.
std::vector<std::string> backendNames();

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_REGISTRY_H
