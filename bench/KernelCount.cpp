//===- KernelCount.cpp - What a generated kernel executes, without a GPU --===//
//
// kvc-kernel-count --bundle kernels.json [--only REGEX] [--mix]
//
// Runs every kernel of a bundle's kernel table (or those whose names REGEX
// matches) in the PTX interpreter on the case kvc-kernel-bench checks it
// on (KernelDevice.h), checks it bit for bit against the runtime, and
// prints what its threads executed per value it writes or reads (a K or V
// value of the cache; RMSNorm's: a value of the normalized rows), summed
// over all threads, the lanes that do no work included: PTX instructions,
// shuffles, and bytes of global loads and stores. Where ptx-stats.py counts
// one thread's longest path through a restore kernel, this counts every
// thread of any kernel kind, loops included: a proxy for issue slots and
// for the memory traffic a scan that reads its input twice costs
// (docs/kernels.md, "Cost per value"). --mix adds each kernel's
// instruction mix: the opcodes it executed, per value, most first.
//
// Exits 1 on a kernel that differs from the runtime or faults.
//
//===----------------------------------------------------------------------===//

#include "kvc/Testing/KernelDevice.h"

#include <cstdio>
#include <regex>
#include <string>

using namespace kvc::testing;

namespace {

/// Counts and checks `kernel`; false when it differs from the runtime.
bool count(const kvc::BundleKernel &kernel, bool mix) {
  auto fail = [&](const kvc::Status &status) {
    std::printf("%-52s FAIL %s\n", kernel.name.c_str(),
                status.message().c_str());
    return false;
  };
  kvc::StatusOr<std::unique_ptr<PtxDevice>> device = PtxDevice::make(kernel);
  if (!device)
    return fail(device.status());
  kvc::StatusOr<KernelCase> c = caseFor(kernel);
  if (!c)
    return fail(c.status());
  auto onDevice = CaseOnDevice::make(**device, kernel, *c);
  if (!onDevice)
    return fail(onDevice.status());
  kvc::StatusOr<CacheErrors> errors = (*onDevice)->check();
  if (!errors)
    return fail(errors.status());
  const bool norm = kernel.kind == kvc::BundleKernel::Kind::RmsNorm;
  const double values =
      norm ? double(c->normedValues())
           : 2.0 * double(kernel.layers * kernel.tokens * c->shape().width());
  const PtxStats &s = (*device)->stats();
  std::printf("%-52s %9.0f %8.2f %8.2f %8.2f %8.2f  %s\n", kernel.name.c_str(),
              values, double(s.instructions) / values,
              double(s.shuffles) / values, double(s.loadBytes) / values,
              double(s.storeBytes) / values,
              errors->ok() ? "bit-exact" : ("FAIL " + errors->str()).c_str());
  if (mix)
    for (const auto &[opcode, executed] : s.mix)
      std::printf("    %-48s %8.2f\n", opcode.c_str(),
                  double(executed) / values);
  return errors->ok();
}

} // namespace

int main(int argc, char **argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string bundlePath, only;
  bool mix = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--bundle" && i + 1 < argc) {
      bundlePath = argv[++i];
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--mix") {
      mix = true;
    } else {
      std::fprintf(
          stderr,
          "usage: kvc-kernel-count --bundle F [--only REGEX] [--mix]\n");
      return 2;
    }
  }
  kvc::StatusOr<kvc::PlanBundle> bundle = kvc::readPlanBundle(bundlePath);
  if (!bundle) {
    std::fprintf(stderr, "kvc-kernel-count: %s\n",
                 bundle.status().message().c_str());
    return 1;
  }
  std::regex selected;
  try {
    selected = std::regex(only);
  } catch (const std::regex_error &e) {
    std::fprintf(stderr, "kvc-kernel-count: --only %s: %s\n", only.c_str(),
                 e.what());
    return 2;
  }
  std::printf("%-52s %9s %8s %8s %8s %8s  %s\n", "kernel", "values", "instr/v",
              "shfl/v", "ld B/v", "st B/v", "check");
  int kernels = 0, failures = 0;
  for (const kvc::BundleKernel &kernel : bundle->kernels)
    if (std::regex_search(kernel.name, selected)) {
      ++kernels;
      failures += !count(kernel, mix);
    }
  if (!kernels) {
    std::fprintf(stderr, "kvc-kernel-count: no kernel of %s matches \"%s\"\n",
                 bundlePath.c_str(), only.c_str());
    return 1;
  }
  std::printf("%d kernels, %d failed\n", kernels, failures);
  return failures ? 1 : 0;
}
