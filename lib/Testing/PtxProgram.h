//===- PtxProgram.h - The PTX interpreter's decoded program ------*- C++ -*-===//
//
// What PtxParser.cpp decodes a module's entries into and PtxInterpreter.cpp
// runs: PTX's types and the bits registers hold of them, opcodes, operands
// (register numbers, immediates, special registers, parameter offsets) and
// each entry's instructions. Private to lib/Testing.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_TESTING_PTXPROGRAM_H
#define KVC_LIB_TESTING_PTXPROGRAM_H

#include "kvc/Testing/PtxInterpreter.h"

#include "kvc/Runtime/Base/Half.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvc::testing::ptx {


enum class Ty : uint8_t {
  Pred,
  B8,
  U8,
  S8,
  B16,
  U16,
  S16,
  B32,
  U32,
  S32,
  B64,
  U64,
  S64,
  F16,
  BF16,
  F32,
  F16x2 // Two f16 values in a 32-bit register, the first in the low half.
};

inline int bitsOf(Ty t) {
  switch (t) {
  case Ty::Pred:
    return 1;
  case Ty::B8:
  case Ty::U8:
  case Ty::S8:
    return 8;
  case Ty::B16:
  case Ty::U16:
  case Ty::S16:
  case Ty::F16:
  case Ty::BF16:
    return 16;
  case Ty::B32:
  case Ty::U32:
  case Ty::S32:
  case Ty::F32:
  case Ty::F16x2:
    return 32;
  case Ty::B64:
  case Ty::U64:
  case Ty::S64:
    return 64;
  }
  return 0;
}
inline bool isSigned(Ty t) {
  return t == Ty::S8 || t == Ty::S16 || t == Ty::S32 || t == Ty::S64;
}
inline bool isFloat(Ty t) {
  return t == Ty::F16 || t == Ty::BF16 || t == Ty::F32 || t == Ty::F16x2;
}

inline bool parseType(std::string_view s, Ty &t) {
  static const std::pair<const char *, Ty> names[] = {
      {"pred", Ty::Pred}, {"b8", Ty::B8},      {"u8", Ty::U8},
      {"s8", Ty::S8},     {"b16", Ty::B16},    {"u16", Ty::U16},
      {"s16", Ty::S16},   {"b32", Ty::B32},    {"u32", Ty::U32},
      {"s32", Ty::S32},   {"b64", Ty::B64},    {"u64", Ty::U64},
      {"s64", Ty::S64},   {"f16", Ty::F16},    {"bf16", Ty::BF16},
      {"f32", Ty::F32},   {"f16x2", Ty::F16x2}};
  for (const auto &[name, type] : names)
    if (s == name) {
      t = type;
      return true;
    }
  return false;
}

inline uint64_t maskOf(int bits) {
  return bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
}
/// `v`'s low `bits` bits as a signed value.
inline int64_t signExtend(uint64_t v, int bits) {
  if (bits >= 64)
    return int64_t(v);
  uint64_t sign = uint64_t(1) << (bits - 1);
  v &= maskOf(bits);
  return int64_t((v ^ sign) - sign);
}

inline float asFloat(uint64_t bits) {
  uint32_t word = uint32_t(bits);
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}
/// An f32 result: NaN is the canonical 0x7FFFFFFF, as NVIDIA GPUs write it.
inline uint64_t fromFloat(float f) {
  if (std::isnan(f))
    return 0x7FFFFFFF;
  uint32_t word;
  std::memcpy(&word, &f, 4);
  return word;
}
/// A float operand of type `t` (f32, f16 or bf16 bits).
inline float floatOf(uint64_t bits, Ty t) {
  return t == Ty::F32   ? asFloat(bits)
         : t == Ty::F16 ? f16ToFloat(uint16_t(bits))
                        : bf16ToFloat(uint16_t(bits));
}

enum class Op : uint8_t {
  Add,
  Sub,
  Mul,
  MulHi,
  MulWide,
  Fma,
  Div,
  Rcp,
  Sqrt,
  Min,
  Max,
  Neg,
  And,
  Or,
  Xor,
  Not,
  Shl,
  Shr,
  Bfe,
  Bfi,
  Selp,
  Setp,
  Mov,
  Cvt,
  Cvta,
  LdParam,
  LdGlobal,
  StGlobal,
  Shfl,
  Bra,
  Ret
};
enum class Cmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };

template <typename T> bool compare(Cmp cmp, T a, T b) {
  switch (cmp) {
  case Cmp::Eq:
    return a == b;
  case Cmp::Ne:
    return a != b;
  case Cmp::Lt:
    return a < b;
  case Cmp::Le:
    return a <= b;
  case Cmp::Gt:
    return a > b;
  case Cmp::Ge:
    return a >= b;
  }
  return false;
}
/// A special register: which, and its axis (x, y, z) where it has one;
/// an operand holds 3 * which + axis.
enum class Special : uint8_t { Tid, Ntid, Ctaid, Nctaid, LaneId };

struct Operand {
  enum Kind : uint8_t { Reg, Imm, Sreg, Vec, Addr } kind = Imm;
  /// Reg: the register; Addr: the base register, or kParamBase for a
  /// parameter's name.
  uint32_t reg = 0;
  /// Imm: the bits; Addr: the byte offset; Sreg: the Special.
  uint64_t value = 0;
  /// Vec: the registers in braces.
  std::vector<uint32_t> regs;
};
constexpr uint32_t kParamBase = ~uint32_t(0);

struct Instr {
  Op op = Op::Ret;
  Ty type = Ty::B32, from = Ty::B32; // from: cvt's source type.
  Cmp cmp = Cmp::Eq;
  bool unordered = false; // setp's ...u comparisons.
  int guard = -1;         // Predicate register, or -1.
  bool guardNegated = false;
  std::vector<Operand> ops;
  uint32_t target = 0; // bra: the instruction index.
  int line = 0;
  std::string text;
  std::string opcode; // With its modifiers and type: fma.rn.f32.
};

struct Entry {
  std::string name;
  std::vector<Instr> code;
  /// Parameters: byte offset and size in the parameter buffer.
  std::vector<std::pair<uint32_t, uint32_t>> params;
  std::unordered_map<std::string, uint32_t> paramOffsets;
  uint32_t paramBytes = 0, registers = 0;
};

} // namespace kvc::testing::ptx

namespace kvc::testing {

struct PtxModule::Impl {
  std::vector<ptx::Entry> entries;
  mutable PtxStats stats;
};

} // namespace kvc::testing

#endif // KVC_LIB_TESTING_PTXPROGRAM_H
