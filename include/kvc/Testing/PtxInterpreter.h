//===- PtxInterpreter.h - Generated kernels without a GPU -------*- C++ -*-===//
//
// An interpreter for the PTX that kvc's generated kernels are made of, so
// that their GPU form (lanes and shuffles, 16-byte accesses, the GPU's
// rounding) runs, bit for bit, where there is no GPU. It models what those
// kernels rely on and refuses the rest:
//
//  - a warp's 32 lanes each run until they reach a shfl.sync or exit; a
//    shuffle takes place once every lane its member mask names waits at
//    that same instruction (a lane that exited first, or lanes waiting at
//    different shuffles, is an error: on a GPU, a hang or undefined values);
//  - f32 arithmetic rounds to nearest even and keeps subnormals (no .ftz);
//    a NaN result is the canonical 0x7FFFFFFF, and min/max ignore a NaN
//    operand, as on NVIDIA GPUs; conversions to f16 and bf16 round to
//    nearest even;
//  - global memory is the host's, limited to the regions a launch names: an
//    access outside them or not aligned to its size is an error (what
//    compute-sanitizer's memcheck reports), and so is a byte that two
//    threads of one launch write, or that one reads after another wrote it
//    (racecheck; the kernels have no barriers, so either is a race).
//
// parse() refuses any instruction, type or directive outside that subset,
// naming its line, so a kernel the generator starts to emit differently is
// never run by guesswork. Threads run one block and one warp at a time, in
// order; the interpreter is for checking kernels, not for timing them.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TESTING_PTXINTERPRETER_H
#define KVC_TESTING_PTXINTERPRETER_H

#include "kvc/Runtime/Base/Status.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvc::testing {

/// Global memory a launch may touch: `bytes` at host address `base`.
struct PtxRegion {
  uint64_t base = 0, bytes = 0;
};

/// What a launch executed, summed over its threads. An instruction a guard
/// predicate turns off counts (a GPU issues it too).
struct PtxStats {
  uint64_t instructions = 0;
  uint64_t shuffles = 0;
  /// Global loads and stores (a vector access is one), and their bytes.
  uint64_t loads = 0, loadBytes = 0, stores = 0, storeBytes = 0;
  /// The instructions by opcode with its modifiers and type (`fma.rn.f32`,
  /// `ld.global.v4.u32`), most executed first: an instruction mix.
  std::vector<std::pair<std::string, uint64_t>> mix;
};

/// A parsed PTX module: its entries, ready to run.
class PtxModule {
public:
  using Dim3 = std::array<uint32_t, 3>;

  /// Parses `ptx`; InvalidArgument naming the line of anything outside the
  /// interpreter's subset.
  static StatusOr<PtxModule> parse(std::string_view ptx);

  /// Whether the module has an entry `name`.
  bool hasEntry(std::string_view name) const;

  /// Runs entry `name` over `grid` x `block` to completion. `params` holds
  /// a pointer to each parameter's value, in order, as cuLaunchKernel takes
  /// them; global accesses must fall in `memory`. FailedPrecondition (the
  /// block, thread, line and what went wrong) on a fault.
  Status launch(std::string_view name, Dim3 grid, Dim3 block,
                void *const *params,
                const std::vector<PtxRegion> &memory) const;

  /// What the last launch executed.
  const PtxStats &stats() const;

  PtxModule(PtxModule &&) noexcept;
  PtxModule &operator=(PtxModule &&) noexcept;
  ~PtxModule();

  struct Impl;

private:
  explicit PtxModule(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace kvc::testing

#endif // KVC_TESTING_PTXINTERPRETER_H
