//===- KernelDevice.h - Where a generated kernel's check runs ---*- C++ -*-===//
//
// The check of a bundle's kernel (KernelCase.h) on whatever runs its PTX:
// the CUDA driver on a GPU (kvc-kernel-bench) or the PTX interpreter on the
// host (PtxDevice; PtxInterpreter.h). A KernelDevice allocates, copies and
// runs the loaded kernel; CaseOnDevice holds a case's buffers on one and
// the kernel's parameters over them; checkKernel() poisons what the kernel
// must write, runs it and compares the result with the runtime's.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TESTING_KERNELDEVICE_H
#define KVC_TESTING_KERNELDEVICE_H

#include "kvc/Runtime/Device/KernelAbi.h"
#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Testing/KernelCase.h"
#include "kvc/Testing/PtxInterpreter.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace kvc::testing {

/// Memory, copies and launches of one kernel.
class KernelDevice {
public:
  virtual ~KernelDevice() = default;
  /// `bytes` (at least 16) of device memory, 256-byte aligned.
  virtual StatusOr<uint64_t> allocate(size_t bytes) = 0;
  virtual void release(uint64_t address) = 0;
  virtual Status copyIn(uint64_t to, const void *from, size_t bytes) = 0;
  virtual Status copyOut(void *to, uint64_t from, size_t bytes) = 0;
  /// Runs the device's kernel over `chunks` records of its chunk table
  /// (the grid's y dimension times `chunks`) and waits for it.
  virtual Status run(int64_t chunks, void **params) = 0;
};

/// A device allocation, released with the object.
class DeviceMemory {
public:
  static StatusOr<DeviceMemory> make(KernelDevice &device, size_t bytes);
  DeviceMemory(DeviceMemory &&other) noexcept;
  DeviceMemory &operator=(DeviceMemory &&) = delete;
  ~DeviceMemory();
  uint64_t address() const { return address_; }
  size_t bytes() const { return bytes_; }
  Status upload(const void *from) const;
  Status download(void *to) const;

private:
  DeviceMemory(KernelDevice &device, uint64_t address, size_t bytes)
      : device_(&device), address_(address), bytes_(bytes) {}
  KernelDevice *device_;
  uint64_t address_;
  size_t bytes_;
};

/// The case kvc-kernel-bench checks `kernel` on: a chunk from token 5 and
/// layer 1 (a restore's `chunks` > 1 chunks in one launch; KernelCase.h).
StatusOr<KernelCase> caseFor(const BundleKernel &kernel, int64_t chunks = 1);

/// A case's buffers on a device and the kernel's parameters over them.
class CaseOnDevice {
public:
  static StatusOr<std::unique_ptr<CaseOnDevice>>
  make(KernelDevice &device, const BundleKernel &kernel, const KernelCase &c);
  /// Uploads the case's chunk table with every chunk moved to token
  /// `fromToken` (a block-aligned start, for timing), or as drawn.
  Status moveChunks(std::optional<int64_t> fromToken);
  /// The kernel's parameters, as cuLaunchKernel takes them.
  StatusOr<std::vector<void *>> pointers() { return params_.pointers(kernel_); }

  /// Poisons what the kernel writes (a save kernel's payload; otherwise the
  /// caches, and an rms_norm kernel's output) and fills what it reads, runs
  /// it over the case's chunks and compares its output with the runtime's.
  StatusOr<CacheErrors> check();

  const KernelCase &kernelCase() const { return case_; }

private:
  CaseOnDevice(KernelDevice &device, const BundleKernel &kernel,
               const KernelCase &c, std::vector<DeviceMemory> buffers);
  enum Buffer { Payload, Table, Chunks, Keys, Values, Rope, Weights, Normed };
  const DeviceMemory &buffer(Buffer b) const { return buffers_[b]; }

  KernelDevice &device_;
  const BundleKernel &kernel_;
  const KernelCase &case_;
  std::vector<DeviceMemory> buffers_;
  KernelParams params_;
};

/// The PTX interpreter as a device: host memory, and `kernel`'s PTX run by
/// PtxModule over the allocations made so far.
class PtxDevice : public KernelDevice {
public:
  static StatusOr<std::unique_ptr<PtxDevice>> make(const BundleKernel &kernel);
  ~PtxDevice() override;
  StatusOr<uint64_t> allocate(size_t bytes) override;
  void release(uint64_t address) override;
  Status copyIn(uint64_t to, const void *from, size_t bytes) override;
  Status copyOut(void *to, uint64_t from, size_t bytes) override;
  Status run(int64_t chunks, void **params) override;
  /// What the last run executed.
  const PtxStats &stats() const { return module_.stats(); }

private:
  PtxDevice(const BundleKernel &kernel, PtxModule module)
      : kernel_(kernel), module_(std::move(module)) {}
  const BundleKernel &kernel_;
  PtxModule module_;
  std::vector<PtxRegion> allocations_;
};

} // namespace kvc::testing

#endif // KVC_TESTING_KERNELDEVICE_H
