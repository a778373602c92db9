//===- PtxInterpreter.cpp - Generated kernels without a GPU ---------------===//
//
// launch() runs an entry PtxParser.cpp decoded (PtxProgram.h) per warp,
// checking every global access (bounds, alignment, races). Registers hold
// raw bits in 64-bit words: an operation reads the low bits its type
// names and writes its result zero-extended, as PTX's typed registers
// behave. See PtxInterpreter.h for the model.
//
//===----------------------------------------------------------------------===//

#include "PtxProgram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

namespace kvc::testing {
namespace {

using namespace ptx;

/// A launch's view of global memory: the regions, each with the thread
/// that last wrote each byte (racecheck).
class Memory {
public:
  explicit Memory(const std::vector<PtxRegion> &regions) {
    for (const PtxRegion &r : regions)
      regions_[r.base] = {r.bytes, std::vector<uint32_t>(r.bytes, kNobody)};
  }

  /// Checks an access of `bytes` at `address` by thread `thread`; an error
  /// message, or empty.
  std::string access(uint64_t address, uint32_t bytes, bool write,
                     uint32_t thread) {
    if (address % bytes)
      return "misaligned " + what(write, bytes, address);
    auto it = regions_.upper_bound(address);
    if (it == regions_.begin())
      return "out-of-bounds " + what(write, bytes, address);
    --it;
    auto &[size, writers] = it->second;
    uint64_t at = address - it->first;
    if (at + bytes > size)
      return "out-of-bounds " + what(write, bytes, address) + " (a region of " +
             std::to_string(size) + " bytes starts " + std::to_string(at) +
             " bytes before)";
    for (uint32_t i = 0; i < bytes; ++i) {
      uint32_t &writer = writers[at + i];
      if (writer != kNobody && writer != thread)
        return std::string(write ? "write-write" : "read-after-write") +
               " race: " + what(write, bytes, address) +
               " touches a byte thread " + std::to_string(writer) +
               " of the launch wrote";
      if (write)
        writer = thread;
    }
    return {};
  }

private:
  static constexpr uint32_t kNobody = ~uint32_t(0);
  static std::string what(bool write, uint32_t bytes, uint64_t address) {
    std::ostringstream s;
    s << (write ? "store" : "load") << " of " << bytes << " bytes at 0x"
      << std::hex << address;
    return s.str();
  }
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint32_t>>> regions_;
};

/// One thread's state.
struct Thread {
  std::vector<uint64_t> r;
  uint64_t executed = 0;
  uint32_t pc = 0;
  bool exited = false;
  uint32_t tid[3] = {0, 0, 0};
  uint32_t lane = 0, global = 0;
};

} // namespace

namespace {

/// Instructions a thread may run before it is taken for a hang.
constexpr uint64_t kMaxInstructions = uint64_t(1) << 26;

/// Runs one warp of an entry to its end.
class WarpRunner {
public:
  WarpRunner(const Entry &e, Memory &memory, const std::vector<uint8_t> &params,
             PtxModule::Dim3 grid, PtxModule::Dim3 block,
             const uint32_t ctaid[3], PtxStats &stats,
             std::vector<uint64_t> &executedAt)
      : e(e), memory(memory), params(params), grid(grid), block(block),
        ctaid(ctaid), stats(stats), executedAt(executedAt) {}

  /// Runs `lanes` (consecutive threads of the block); an error or empty.
  std::string run(std::vector<Thread> &lanes) {
    for (;;) {
      for (Thread &t : lanes)
        if (!t.exited && !atShuffle(t)) {
          std::string error = step(t);
          if (!error.empty())
            return error;
        }
      // Every lane has exited or waits at a shuffle.
      const Thread *waiting = nullptr;
      for (const Thread &t : lanes)
        if (!t.exited)
          waiting = &t;
      if (!waiting)
        return {};
      std::string error = shuffle(lanes, *waiting);
      if (!error.empty())
        return error;
    }
  }

private:
  bool atShuffle(const Thread &t) const { return e.code[t.pc].op == Op::Shfl; }

  uint64_t value(const Thread &t, const Operand &o) const {
    switch (o.kind) {
    case Operand::Reg:
      return t.r[o.reg];
    case Operand::Imm:
      return o.value;
    case Operand::Sreg: {
      const uint64_t axis = o.value % 3;
      switch (Special(o.value / 3)) {
      case Special::Tid:
        return t.tid[axis];
      case Special::Ntid:
        return block[axis];
      case Special::Ctaid:
        return ctaid[axis];
      case Special::Nctaid:
        return grid[axis];
      case Special::LaneId:
        return t.lane;
      }
      return 0;
    }
    default:
      return 0;
    }
  }

  static std::string fault(const Thread &t, const Instr &in,
                           const std::string &what) {
    return "thread " + std::to_string(t.tid[0]) + " (" +
           std::to_string(t.tid[1]) + ", " + std::to_string(t.tid[2]) +
           "), line " + std::to_string(in.line) + " `" + in.text + "`: " + what;
  }

  /// Runs `t` until it exits or reaches a shuffle; an error or empty.
  std::string step(Thread &t) {
    while (!t.exited && !atShuffle(t)) {
      const Instr &in = e.code[t.pc];
      ++stats.instructions;
      ++executedAt[t.pc];
      if (++t.executed > kMaxInstructions)
        return fault(t, in,
                     "still running after " + std::to_string(kMaxInstructions) +
                         " instructions");
      if (in.guard >= 0 && (t.r[in.guard] != 0) == in.guardNegated) {
        ++t.pc;
        continue;
      }
      std::string error = execute(t, in);
      if (!error.empty())
        return fault(t, in, error);
      if (t.pc >= e.code.size())
        return fault(t, in, "runs past the entry's end");
    }
    return {};
  }

  std::string execute(Thread &t, const Instr &in) {
    const int w = bitsOf(in.type);
    const uint64_t mask = maskOf(w);
    auto src = [&](size_t i) { return value(t, in.ops[i]); };
    auto f = [&](size_t i) { return asFloat(src(i)); };
    auto set = [&](uint64_t v) { t.r[in.ops[0].reg] = v & mask; };
    auto sgn = [&](size_t i) { return signExtend(src(i), w); };
    const bool fp = in.type == Ty::F32;
    switch (in.op) {
    case Op::Add:
      set(fp ? fromFloat(f(1) + f(2)) : src(1) + src(2));
      break;
    case Op::Sub:
      set(fp ? fromFloat(f(1) - f(2)) : src(1) - src(2));
      break;
    case Op::Mul:
      set(fp ? fromFloat(f(1) * f(2)) : src(1) * src(2));
      break;
    case Op::MulHi: { // The high half of the double-width product.
      using u128 = unsigned __int128;
      using s128 = __int128;
      const u128 product = isSigned(in.type)
                               ? u128(s128(sgn(1)) * s128(sgn(2)))
                               : u128(src(1) & mask) * u128(src(2) & mask);
      set(uint64_t(product >> w));
      break;
    }
    case Op::MulWide:
      t.r[in.ops[0].reg] =
          (isSigned(in.type) ? uint64_t(sgn(1) * sgn(2))
                             : (src(1) & mask) * (src(2) & mask)) &
          maskOf(2 * w);
      break;
    case Op::Fma:
      set(fromFloat(std::fma(f(1), f(2), f(3))));
      break;
    case Op::Div:
      set(fromFloat(f(1) / f(2)));
      break;
    case Op::Rcp:
      set(fromFloat(1.0f / f(1)));
      break;
    case Op::Sqrt:
      set(fromFloat(std::sqrt(f(1))));
      break;
    case Op::Min:
    case Op::Max: {
      const bool min = in.op == Op::Min;
      if (fp) {
        float a = f(1), b = f(2);
        if (std::isnan(a) || std::isnan(b)) {
          set(std::isnan(a) && std::isnan(b)
                  ? 0x7FFFFFFF
                  : fromFloat(std::isnan(a) ? b : a));
        } else if (a == b) { // -0 below +0.
          set(fromFloat(min == bool(std::signbit(a)) ? a : b));
        } else {
          set(fromFloat(min == (a < b) ? a : b));
        }
      } else if (isSigned(in.type)) {
        set(uint64_t(min ? std::min(sgn(1), sgn(2))
                         : std::max(sgn(1), sgn(2))));
      } else {
        uint64_t a = src(1) & mask, b = src(2) & mask;
        set(min ? std::min(a, b) : std::max(a, b));
      }
      break;
    }
    case Op::Neg:
      set(fp ? src(1) ^ 0x80000000u : uint64_t(-sgn(1)));
      break;
    case Op::And:
      set(src(1) & src(2));
      break;
    case Op::Or:
      set(src(1) | src(2));
      break;
    case Op::Xor:
      set(src(1) ^ src(2));
      break;
    case Op::Not:
      set(in.type == Ty::Pred ? !src(1) : ~src(1));
      break;
    case Op::Shl: {
      uint64_t n = src(2) & 0xFFFFFFFF;
      set(n >= uint64_t(w) ? 0 : src(1) << n);
      break;
    }
    case Op::Shr: {
      uint64_t n = std::min<uint64_t>(src(2) & 0xFFFFFFFF, uint64_t(w));
      if (isSigned(in.type))
        set(uint64_t(n >= uint64_t(w) ? (sgn(1) < 0 ? -1 : 0) : sgn(1) >> n));
      else
        set(n >= uint64_t(w) ? 0 : (src(1) & mask) >> n);
      break;
    }
    case Op::Bfe: {
      // PTX's definition: bits pos .. pos + len - 1 of a, sign-filled for
      // the signed types from the field's top bit (or a's).
      const int msb = w - 1;
      const uint64_t a = src(1), pos = src(2) & 0xFF, len = src(3) & 0xFF;
      uint64_t sbit = 0;
      if (isSigned(in.type) && len)
        sbit = (a >> std::min<uint64_t>(pos + len - 1, msb)) & 1;
      uint64_t d = 0;
      for (int i = 0; i <= msb; ++i) {
        uint64_t bit = (uint64_t(i) < len && pos + i <= uint64_t(msb))
                           ? (a >> (pos + i)) & 1
                           : sbit;
        d |= bit << i;
      }
      set(d);
      break;
    }
    case Op::Bfi: {
      // bfi d, f, b, pos, len: b with bits pos .. pos + len - 1 from f.
      const uint64_t field = src(1), pos = src(3) & 0xFF, len = src(4) & 0xFF;
      uint64_t d = src(2);
      for (uint64_t i = 0; i < len && pos + i < uint64_t(w); ++i)
        d = (d & ~(uint64_t(1) << (pos + i))) |
            (((field >> i) & 1) << (pos + i));
      set(d);
      break;
    }
    case Op::Selp:
      set(src(3) ? src(1) : src(2));
      break;
    case Op::Setp: {
      auto floats = [&](float a, float b) {
        return std::isnan(a) || std::isnan(b) ? in.unordered
                                              : compare(in.cmp, a, b);
      };
      if (in.type == Ty::F16x2) { // p|q: the low halves, the high halves.
        for (int half = 0; half < 2; ++half)
          t.r[in.ops[0].regs[half]] =
              floats(f16ToFloat(uint16_t(src(1) >> (16 * half))),
                     f16ToFloat(uint16_t(src(2) >> (16 * half))));
        break;
      }
      t.r[in.ops[0].reg] =
          isFloat(in.type)
              ? floats(floatOf(src(1), in.type), floatOf(src(2), in.type))
          : isSigned(in.type) ? compare(in.cmp, sgn(1), sgn(2))
                              : compare(in.cmp, src(1) & mask, src(2) & mask);
      break;
    }
    case Op::Mov: {
      const Operand &d = in.ops[0], &s = in.ops[1];
      if (d.kind == Operand::Vec) { // Unpack, the first element lowest.
        const int part = w / int(d.regs.size());
        for (size_t i = 0; i < d.regs.size(); ++i)
          t.r[d.regs[i]] = (t.r[s.reg] >> (i * part)) & maskOf(part);
      } else if (s.kind == Operand::Vec) { // Pack.
        const int part = w / int(s.regs.size());
        uint64_t v = 0;
        for (size_t i = 0; i < s.regs.size(); ++i)
          v |= (t.r[s.regs[i]] & maskOf(part)) << (i * part);
        set(v);
      } else {
        set(src(1));
      }
      break;
    }
    case Op::Cvt: {
      const uint64_t a = src(1);
      if (in.type == Ty::F32) {
        set(fromFloat(floatOf(a, in.from)));
      } else if (in.type == Ty::F16 || in.type == Ty::BF16) {
        float x = asFloat(a);
        set(std::isnan(x)        ? 0x7FFF
            : in.type == Ty::F16 ? floatToF16(x)
                                 : floatToBf16(x));
      } else {
        const int fw = bitsOf(in.from);
        set(isSigned(in.from) ? uint64_t(signExtend(a, fw)) : a & maskOf(fw));
      }
      break;
    }
    case Op::Cvta:
      set(src(1));
      break;
    case Op::LdParam: {
      const uint64_t at = in.ops[1].value;
      const uint32_t bytes = uint32_t(w / 8);
      if (at + bytes > params.size())
        return "reads past the parameters";
      uint64_t v = 0;
      std::memcpy(&v, params.data() + at, bytes);
      set(isSigned(in.type) ? uint64_t(signExtend(v, w)) : v);
      break;
    }
    case Op::LdGlobal:
    case Op::StGlobal: {
      const bool store = in.op == Op::StGlobal;
      const Operand &addr = in.ops[store ? 0 : 1],
                    &data = in.ops[store ? 1 : 0];
      // The data registers: one, or a vector's, without an allocation.
      const bool vector = data.kind == Operand::Vec;
      const uint32_t *regs = vector ? data.regs.data() : &data.reg;
      const size_t count = vector ? data.regs.size() : 1;
      const uint32_t bytes = uint32_t(w / 8);
      const uint64_t address = t.r[addr.reg] + addr.value;
      const uint32_t total = bytes * uint32_t(count);
      std::string error = memory.access(address, total, store, t.global);
      ++(store ? stats.stores : stats.loads);
      (store ? stats.storeBytes : stats.loadBytes) += total;
      if (!error.empty())
        return error;
      auto *at = reinterpret_cast<uint8_t *>(address);
      for (size_t i = 0; i < count; ++i) {
        uint64_t v = 0;
        if (store) {
          v = t.r[regs[i]];
          std::memcpy(at + i * bytes, &v, bytes);
        } else {
          std::memcpy(&v, at + i * bytes, bytes);
          t.r[regs[i]] =
              isSigned(in.type) ? uint64_t(signExtend(v, w)) : v & mask;
        }
      }
      break;
    }
    case Op::Bra:
      t.pc = in.target;
      return {};
    case Op::Ret:
      t.exited = true;
      return {};
    case Op::Shfl:
      return "a shuffle outside the warp's exchange";
    }
    ++t.pc;
    return {};
  }

  /// The shuffle `leader` waits at, for every lane of `lanes`.
  std::string shuffle(std::vector<Thread> &lanes, const Thread &leader) {
    const Instr &in = e.code[leader.pc];
    stats.instructions += lanes.size();
    stats.shuffles += lanes.size();
    executedAt[leader.pc] += lanes.size();
    // shfl.sync.bfly.b32 d, a, b, c, membermask (PTX ISA's definition).
    const uint64_t members = value(leader, in.ops[4]) & 0xFFFFFFFF;
    for (const Thread &t : lanes) {
      const bool named = (members >> t.lane) & 1;
      if (!named)
        continue;
      if (t.exited)
        return fault(leader, in,
                     "lane " + std::to_string(t.lane) +
                         " exited before this shuffle, which names it");
      if (t.pc != leader.pc)
        return fault(t, in,
                     "lanes of one warp wait at different shuffles (lines " +
                         std::to_string(e.code[t.pc].line) + " and " +
                         std::to_string(in.line) + ")");
    }
    if (members != maskOf(int(lanes.size())))
      return fault(leader, in,
                   "the member mask does not name the warp's " +
                       std::to_string(lanes.size()) + " lanes, exactly");
    std::array<uint64_t, 32> sources{};
    for (size_t i = 0; i < lanes.size(); ++i)
      sources[i] = value(lanes[i], in.ops[1]) & 0xFFFFFFFF;
    for (Thread &t : lanes) {
      const uint32_t b = uint32_t(value(t, in.ops[2])) & 0x1F;
      const uint32_t c = uint32_t(value(t, in.ops[3]));
      const uint32_t segmask = (c >> 8) & 0x1F, clamp = c & 0x1F;
      const uint32_t maxLane = (t.lane & segmask) | (clamp & ~segmask);
      uint32_t j = t.lane ^ b;
      if (j > maxLane)
        j = t.lane;
      t.r[in.ops[0].reg] = sources[j];
      ++t.pc;
    }
    return {};
  }

  const Entry &e;
  Memory &memory;
  const std::vector<uint8_t> &params;
  PtxModule::Dim3 grid, block;
  const uint32_t *ctaid;
  PtxStats &stats;
  std::vector<uint64_t> &executedAt; // Per instruction of the entry.
};

/// `executedAt`'s counts summed by opcode, most first.
std::vector<std::pair<std::string, uint64_t>>
instructionMix(const Entry &e, const std::vector<uint64_t> &executedAt) {
  std::map<std::string_view, uint64_t> byOpcode;
  for (size_t pc = 0; pc < e.code.size(); ++pc)
    if (executedAt[pc])
      byOpcode[e.code[pc].opcode] += executedAt[pc];
  std::vector<std::pair<std::string, uint64_t>> mix;
  for (const auto &[op, count] : byOpcode)
    mix.emplace_back(std::string(op), count);
  std::stable_sort(mix.begin(), mix.end(), [](const auto &a, const auto &b) {
    return a.second > b.second;
  });
  return mix;
}

} // namespace

Status PtxModule::launch(std::string_view name, Dim3 grid, Dim3 block,
                         void *const *params,
                         const std::vector<PtxRegion> &memory) const {
  auto entry = std::find_if(impl_->entries.begin(), impl_->entries.end(),
                            [&](const Entry &e) { return e.name == name; });
  if (entry == impl_->entries.end())
    return notFound("the PTX has no entry " + std::string(name));
  const Entry &e = *entry;
  for (uint32_t d : grid)
    if (!d)
      return invalidArgument("an empty grid");
  const uint64_t threads = uint64_t(block[0]) * block[1] * block[2];
  if (!threads || threads > 1024)
    return invalidArgument("a block of " + std::to_string(threads) +
                           " threads");
  std::vector<uint8_t> buffer(e.paramBytes);
  for (size_t i = 0; i < e.params.size(); ++i)
    std::memcpy(buffer.data() + e.params[i].first, params[i],
                e.params[i].second);

  Memory global(memory);
  impl_->stats = {};
  std::vector<uint64_t> executedAt(e.code.size());
  uint32_t ctaid[3];
  uint32_t blockIndex = 0;
  for (ctaid[2] = 0; ctaid[2] < grid[2]; ++ctaid[2])
    for (ctaid[1] = 0; ctaid[1] < grid[1]; ++ctaid[1])
      for (ctaid[0] = 0; ctaid[0] < grid[0]; ++ctaid[0], ++blockIndex) {
        WarpRunner runner(e, global, buffer, grid, block, ctaid, impl_->stats,
                          executedAt);
        for (uint64_t first = 0; first < threads; first += 32) {
          std::vector<Thread> lanes(std::min<uint64_t>(32, threads - first));
          for (size_t i = 0; i < lanes.size(); ++i) {
            Thread &t = lanes[i];
            const uint64_t linear = first + i;
            t.r.assign(e.registers, 0);
            t.tid[0] = uint32_t(linear % block[0]);
            t.tid[1] = uint32_t(linear / block[0] % block[1]);
            t.tid[2] = uint32_t(linear / block[0] / block[1]);
            t.lane = uint32_t(i);
            t.global = uint32_t(blockIndex * threads + linear);
          }
          std::string error = runner.run(lanes);
          if (!error.empty())
            return failedPrecondition(e.name + ": block (" +
                                      std::to_string(ctaid[0]) + ", " +
                                      std::to_string(ctaid[1]) + ", " +
                                      std::to_string(ctaid[2]) + "), " + error);
        }
      }
  impl_->stats.mix = instructionMix(e, executedAt);
  return Status::ok();
}

} // namespace kvc::testing
