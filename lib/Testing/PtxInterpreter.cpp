//===- PtxInterpreter.cpp - Generated kernels without a GPU ---------------===//
//
// parse() turns each .entry into a vector of decoded instructions (operands
// resolved to register numbers, immediates, special registers, parameter
// offsets and branch targets); launch() runs them per warp. Registers hold
// raw bits in 64-bit words: an operation reads the low bits its type
// names and writes its result zero-extended, as PTX's typed registers
// behave. See PtxInterpreter.h for the model.
//
//===----------------------------------------------------------------------===//

#include "kvc/Testing/PtxInterpreter.h"

#include "kvc/Runtime/Base/Half.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <unordered_map>

namespace kvc::testing {
namespace {

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

int bitsOf(Ty t) {
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
bool isSigned(Ty t) {
  return t == Ty::S8 || t == Ty::S16 || t == Ty::S32 || t == Ty::S64;
}
bool isFloat(Ty t) {
  return t == Ty::F16 || t == Ty::BF16 || t == Ty::F32 || t == Ty::F16x2;
}

bool parseType(std::string_view s, Ty &t) {
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

uint64_t maskOf(int bits) {
  return bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
}
/// `v`'s low `bits` bits as a signed value.
int64_t signExtend(uint64_t v, int bits) {
  if (bits >= 64)
    return int64_t(v);
  uint64_t sign = uint64_t(1) << (bits - 1);
  v &= maskOf(bits);
  return int64_t((v ^ sign) - sign);
}

float asFloat(uint64_t bits) {
  uint32_t word = uint32_t(bits);
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}
/// An f32 result: NaN is the canonical 0x7FFFFFFF, as NVIDIA GPUs write it.
uint64_t fromFloat(float f) {
  if (std::isnan(f))
    return 0x7FFFFFFF;
  uint32_t word;
  std::memcpy(&word, &f, 4);
  return word;
}
/// A float operand of type `t` (f32, f16 or bf16 bits).
float floatOf(uint64_t bits, Ty t) {
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

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char by) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || (s[i] == by && depth == 0)) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    } else if (s[i] == '{' || s[i] == '[') {
      ++depth;
    } else if (s[i] == '}' || s[i] == ']') {
      --depth;
    }
  }
  return parts;
}

/// Parses one entry's body; `error` set on the first refusal.
class EntryParser {
public:
  EntryParser(Entry &entry, std::string &error) : e(entry), error(error) {}

  void param(std::string_view decl, int line) {
    // ".param .u64 NAME"
    std::vector<std::string> words;
    std::istringstream in{std::string(decl)};
    for (std::string w; in >> w;)
      words.push_back(w);
    Ty t;
    if (words.size() != 3 || words[0] != ".param" || words[1].size() < 2 ||
        !parseType(std::string_view(words[1]).substr(1), t) || t == Ty::Pred) {
      fail(line, decl, "unsupported parameter");
      return;
    }
    uint32_t size = uint32_t(bitsOf(t) / 8);
    e.paramBytes = (e.paramBytes + size - 1) / size * size;
    e.paramOffsets[words[2]] = e.paramBytes;
    e.params.push_back({e.paramBytes, size});
    e.paramBytes += size;
  }

  void statement(std::string_view s, int line) {
    if (s.front() == '{' && s.back() == '}') {
      block(s.substr(1, s.size() - 2), line);
      return;
    }
    if (s.back() == ':') {
      labels[std::string(s.substr(0, s.size() - 1))] = uint32_t(e.code.size());
      return;
    }
    if (s.front() == '.') {
      if (s.rfind(".reg", 0) == 0)
        return; // Registers are numbered as they are used.
      if (s.rfind(".maxntid", 0) == 0 || s.rfind(".reqntid", 0) == 0)
        return;
      fail(line, s, "unsupported directive");
      return;
    }
    if (s.back() != ';') {
      fail(line, s, "expected ';'");
      return;
    }
    s.remove_suffix(1);
    Instr in;
    in.line = line;
    in.text = std::string(trim(s));
    if (s.front() == '@') {
      size_t space = s.find_first_of(" \t");
      std::string_view guard = s.substr(1, space - 1);
      in.guardNegated = !guard.empty() && guard.front() == '!';
      if (in.guardNegated)
        guard.remove_prefix(1);
      in.guard = int(reg(guard));
      s = trim(s.substr(space));
    }
    size_t space = s.find_first_of(" \t");
    std::string_view opcode = s.substr(0, space);
    in.opcode = std::string(opcode);
    std::string_view rest =
        space == std::string_view::npos ? "" : trim(s.substr(space));
    if (!decode(in, opcode)) {
      fail(line, in.text, "unsupported instruction");
      return;
    }
    if (!rest.empty())
      for (std::string_view operand : split(rest, ','))
        in.ops.push_back(parseOperand(operand, line, in.text));
    if (!shapeOk(in))
      fail(line, in.text, "unsupported operands");
    e.code.push_back(std::move(in));
  }

  void finish() {
    for (Instr &in : e.code)
      if (in.op == Op::Bra) {
        auto it = labels.find(branchLabel(in));
        if (it == labels.end()) {
          fail(in.line, in.text, "unknown label");
          return;
        }
        in.target = it->second;
        in.ops.clear();
      }
    e.registers = uint32_t(registers.size());
  }

private:
  /// A scope on one line, as NVPTX writes to take half of a register:
  /// "{ .reg .b16 tmp; mov.b32 {tmp, %rs1}, %r2; }". Its registers are
  /// renamed apart from every other scope's.
  void block(std::string_view body, int line) {
    std::vector<std::pair<std::string, std::string>> locals;
    for (std::string_view part : split(body, ';')) {
      if (part.empty())
        continue;
      std::string text(part);
      if (text.rfind(".reg", 0) == 0) {
        std::istringstream words(text);
        std::string directive, type, name;
        words >> directive >> type;
        while (words >> name) {
          if (name.back() == ',')
            name.pop_back();
          locals.push_back(
              {name, "%scope" + std::to_string(scopes++) + "_" + name});
        }
        continue;
      }
      for (const auto &[name, renamed] : locals)
        text = std::regex_replace(
            text, std::regex("(^|[^%\\w.])" + name + "(?![\\w])"),
            "$1" + renamed);
      statement(text + ";", line);
    }
  }

  void fail(int line, std::string_view s, const char *what) {
    if (error.empty())
      error =
          "line " + std::to_string(line) + ": " + what + ": " + std::string(s);
  }

  uint32_t reg(std::string_view name) {
    auto [it, added] =
        registers.try_emplace(std::string(name), uint32_t(registers.size()));
    return it->second;
  }

  std::string branchLabel(const Instr &in) {
    std::string_view t = trim(in.text);
    return std::string(trim(t.substr(t.find_last_of(" \t") + 1)));
  }

  Operand parseOperand(std::string_view s, int line, const std::string &text) {
    Operand o;
    if (s.empty()) {
      fail(line, text, "empty operand");
      return o;
    }
    if (size_t bar = s.find('|'); bar != std::string_view::npos) {
      // setp's two outputs, for the two halves of an f16x2 comparison.
      o.kind = Operand::Vec;
      o.regs = {reg(trim(s.substr(0, bar))), reg(trim(s.substr(bar + 1)))};
      return o;
    }
    if (s.front() == '{') {
      o.kind = Operand::Vec;
      for (std::string_view r : split(s.substr(1, s.size() - 2), ','))
        o.regs.push_back(reg(r));
      return o;
    }
    if (s.front() == '[') {
      o.kind = Operand::Addr;
      std::string_view inside = trim(s.substr(1, s.size() - 2));
      size_t plus = inside.find('+');
      std::string_view base = trim(inside.substr(0, plus));
      if (plus != std::string_view::npos)
        o.value = uint64_t(std::strtoll(
            std::string(inside.substr(plus + 1)).c_str(), nullptr, 0));
      if (base.front() == '%') {
        o.reg = reg(base);
      } else {
        auto it = e.paramOffsets.find(std::string(base));
        if (it == e.paramOffsets.end())
          fail(line, text, "unknown parameter");
        else
          o.value += it->second;
        o.reg = kParamBase;
      }
      return o;
    }
    if (s.front() == '%') {
      static const char *const specials[] = {"%tid", "%ntid", "%ctaid",
                                             "%nctaid"};
      for (size_t which = 0; which < std::size(specials); ++which)
        for (size_t axis = 0; axis < 3; ++axis)
          if (s == std::string(specials[which]) + "." + "xyz"[axis]) {
            o.kind = Operand::Sreg;
            o.value = 3 * which + axis;
            return o;
          }
      if (s == "%laneid") {
        o.kind = Operand::Sreg;
        o.value = 3 * uint64_t(Special::LaneId);
        return o;
      }
      if (s.find('.') != std::string_view::npos)
        fail(line, text, "unsupported special register");
      o.kind = Operand::Reg;
      o.reg = reg(s);
      return o;
    }
    if (s.front() == '$' || std::isalpha(static_cast<unsigned char>(s[0])))
      return o; // A branch label, resolved by finish().
    o.kind = Operand::Imm;
    std::string text0(s);
    if (text0.size() == 10 && text0.rfind("0f", 0) == 0)
      o.value = std::strtoull(text0.c_str() + 2, nullptr, 16);
    else if (text0.front() == '-')
      o.value = uint64_t(std::strtoll(text0.c_str(), nullptr, 0));
    else if (text0.size() > 2 && text0.rfind("0d", 0) == 0)
      fail(line, text, "unsupported f64 immediate");
    else
      o.value = std::strtoull(text0.c_str(), nullptr, 0);
    return o;
  }

  /// Sets in.op and its types from the opcode; false when unsupported.
  static bool decode(Instr &in, std::string_view opcode) {
    std::vector<std::string_view> p = split(opcode, '.');
    std::string_view base = p[0];
    auto typeAt = [&](size_t i, Ty &t) {
      return i < p.size() && parseType(p[i], t);
    };
    auto last = [&](Ty &t) { return typeAt(p.size() - 1, t); };
    // Modifiers other than these change results: refused.
    auto only = [&](size_t from, size_t to,
                    std::initializer_list<std::string_view> allowed) {
      for (size_t i = from; i < to; ++i)
        if (std::find(allowed.begin(), allowed.end(), p[i]) == allowed.end())
          return false;
      return true;
    };
    const size_t n = p.size();
    if (base == "add" || base == "sub" || base == "min" || base == "max" ||
        base == "neg") {
      in.op = base == "add"   ? Op::Add
              : base == "sub" ? Op::Sub
              : base == "min" ? Op::Min
              : base == "max" ? Op::Max
                              : Op::Neg;
      return last(in.type) && in.type != Ty::Pred &&
             (in.type == Ty::F32 || !isFloat(in.type)) &&
             only(1, n - 1, {"rn"}) &&
             (in.type != Ty::F32 || in.op == Op::Min || in.op == Op::Max ||
              in.op == Op::Neg || n == 3);
    }
    if (base == "mul") {
      if (!last(in.type) || in.type == Ty::Pred)
        return false;
      if (in.type == Ty::F32) {
        in.op = Op::Mul;
        return n == 3 && p[1] == "rn";
      }
      if (n != 3 || isFloat(in.type))
        return false;
      in.op = p[1] == "wide" ? Op::MulWide : p[1] == "hi" ? Op::MulHi : Op::Mul;
      return p[1] == "lo" || p[1] == "hi" ||
             (p[1] == "wide" && bitsOf(in.type) <= 32);
    }
    if (base == "fma" || base == "div" || base == "rcp" || base == "sqrt") {
      in.op = base == "fma"   ? Op::Fma
              : base == "div" ? Op::Div
              : base == "rcp" ? Op::Rcp
                              : Op::Sqrt;
      return n == 3 && p[1] == "rn" && last(in.type) && in.type == Ty::F32;
    }
    if (base == "and" || base == "or" || base == "xor" || base == "not") {
      in.op = base == "and"   ? Op::And
              : base == "or"  ? Op::Or
              : base == "xor" ? Op::Xor
                              : Op::Not;
      return n == 2 && last(in.type) && !isFloat(in.type);
    }
    if (base == "shl" || base == "shr") {
      in.op = base == "shl" ? Op::Shl : Op::Shr;
      return n == 2 && last(in.type) && !isFloat(in.type) &&
             in.type != Ty::Pred;
    }
    if (base == "bfe" || base == "bfi") {
      in.op = base == "bfe" ? Op::Bfe : Op::Bfi;
      return n == 2 && last(in.type) && bitsOf(in.type) >= 32 &&
             !isFloat(in.type);
    }
    if (base == "selp" || base == "mov") {
      in.op = base == "selp" ? Op::Selp : Op::Mov;
      return n == 2 && last(in.type);
    }
    if (base == "setp") {
      static const std::pair<const char *, Cmp> cmps[] = {
          {"eq", Cmp::Eq}, {"ne", Cmp::Ne}, {"lt", Cmp::Lt},
          {"le", Cmp::Le}, {"gt", Cmp::Gt}, {"ge", Cmp::Ge}};
      if (n != 3 || !last(in.type) || in.type == Ty::Pred)
        return false;
      std::string_view c = p[1];
      in.unordered = c.size() == 3 && c.back() == 'u';
      if (in.unordered) {
        if (!isFloat(in.type))
          return false;
        c.remove_suffix(1);
      }
      in.op = Op::Setp;
      for (const auto &[name, cmp] : cmps)
        if (c == name) {
          in.cmp = cmp;
          // Bit types compare for equality only.
          bool bits =
              in.type == Ty::B16 || in.type == Ty::B32 || in.type == Ty::B64;
          return !bits || cmp == Cmp::Eq || cmp == Cmp::Ne;
        }
      return false;
    }
    if (base == "cvt") {
      in.op = Op::Cvt;
      if (!typeAt(n - 2, in.type) || !typeAt(n - 1, in.from))
        return false;
      bool toInt = !isFloat(in.type), fromInt = !isFloat(in.from);
      if (toInt && fromInt)
        return n == 3 && in.type != Ty::Pred && in.from != Ty::Pred;
      // f16/bf16 -> f32 (exact), f32 -> f16/bf16 (nearest even).
      if (in.type == Ty::F32 && (in.from == Ty::F16 || in.from == Ty::BF16))
        return n == 3;
      return in.from == Ty::F32 &&
             (in.type == Ty::F16 || in.type == Ty::BF16) && n == 4 &&
             p[1] == "rn";
    }
    if (base == "cvta") {
      in.op = Op::Cvta;
      return n == 4 && p[1] == "to" && p[2] == "global" && last(in.type) &&
             in.type == Ty::U64;
    }
    if (base == "ld" || base == "st") {
      if (n < 3 || !last(in.type) || in.type == Ty::Pred)
        return false;
      if (p[1] == "param") {
        in.op = Op::LdParam;
        return base == "ld" && n == 3;
      }
      in.op = base == "ld" ? Op::LdGlobal : Op::StGlobal;
      // .nc reads through the read-only cache: the same values here.
      if (p[1] != "global")
        return false;
      return base == "ld" ? only(2, n - 1, {"v2", "v4", "nc"})
                          : only(2, n - 1, {"v2", "v4"});
    }
    if (base == "shfl") {
      in.op = Op::Shfl;
      return n == 4 && p[1] == "sync" && p[2] == "bfly" && p[3] == "b32";
    }
    if (base == "bra") {
      in.op = Op::Bra;
      return n == 1 || (n == 2 && p[1] == "uni");
    }
    if (base == "ret") {
      in.op = Op::Ret;
      return n == 1;
    }
    return false;
  }

  /// Whether in's operands have the kinds its operation reads.
  static bool shapeOk(const Instr &in) {
    auto kinds = [&](std::initializer_list<int> want) {
      if (in.ops.size() != want.size())
        return false;
      size_t i = 0;
      for (int k : want) {
        const Operand &o = in.ops[i++];
        // -1: a register or immediate or special register.
        if (k == -1 ? (o.kind == Operand::Vec || o.kind == Operand::Addr)
                    : o.kind != k)
          return false;
      }
      return true;
    };
    const int R = Operand::Reg, V = Operand::Vec, A = Operand::Addr, X = -1;
    switch (in.op) {
    case Op::Neg:
    case Op::Not:
    case Op::Rcp:
    case Op::Sqrt:
    case Op::Cvt:
    case Op::Cvta:
      return kinds({R, X});
    case Op::Mov:
      return kinds({R, X}) || kinds({V, R}) || kinds({R, V});
    case Op::Fma:
    case Op::Selp:
    case Op::Bfe:
      return kinds({R, X, X, X});
    case Op::Bfi:
      return kinds({R, X, X, X, X});
    case Op::LdParam:
      return kinds({R, A}) && in.ops[1].reg == kParamBase;
    case Op::LdGlobal:
      return (kinds({R, A}) || kinds({V, A})) && in.ops[1].reg != kParamBase;
    case Op::StGlobal:
      return (kinds({A, R}) || kinds({A, V})) && in.ops[0].reg != kParamBase;
    case Op::Shfl:
      return kinds({R, X, X, X, X});
    case Op::Bra:
      return in.ops.size() == 1;
    case Op::Ret:
      return in.ops.empty();
    case Op::Setp: // f16x2 sets two predicates, p|q.
      return in.type == Ty::F16x2
                 ? kinds({V, X, X}) && in.ops[0].regs.size() == 2
                 : kinds({R, X, X});
    default:
      return kinds({R, X, X});
    }
  }

  Entry &e;
  std::string &error;
  std::unordered_map<std::string, uint32_t> registers, labels;
  int scopes = 0;
};

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

struct PtxModule::Impl {
  std::vector<Entry> entries;
  mutable PtxStats stats;
};

PtxModule::PtxModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PtxModule::PtxModule(PtxModule &&) noexcept = default;
PtxModule &PtxModule::operator=(PtxModule &&) noexcept = default;
PtxModule::~PtxModule() = default;

const PtxStats &PtxModule::stats() const { return impl_->stats; }

bool PtxModule::hasEntry(std::string_view name) const {
  return std::any_of(impl_->entries.begin(), impl_->entries.end(),
                     [&](const Entry &e) { return e.name == name; });
}

StatusOr<PtxModule> PtxModule::parse(std::string_view ptx) {
  auto impl = std::make_unique<Impl>();
  std::string error;
  std::istringstream in{std::string(ptx)};
  std::string raw;
  int line = 0;
  enum { Outside, Params, Body } where = Outside;
  std::unique_ptr<EntryParser> parser;
  while (std::getline(in, raw)) {
    ++line;
    std::string_view s = raw;
    if (size_t comment = s.find("//"); comment != std::string_view::npos)
      s = s.substr(0, comment);
    s = trim(s);
    if (s.empty())
      continue;
    if (where == Outside) {
      if (s.rfind(".visible .entry ", 0) == 0 || s.rfind(".entry ", 0) == 0) {
        std::string_view name = s.substr(s.find(".entry ") + 7);
        name = trim(name.substr(0, name.find('(')));
        impl->entries.push_back({});
        impl->entries.back().name = std::string(name);
        parser = std::make_unique<EntryParser>(impl->entries.back(), error);
        where = Params;
        if (s.back() == ')')
          where = Body; // No parameters.
      } else if (s.rfind(".version", 0) && s.rfind(".target", 0) &&
                 s.rfind(".address_size", 0)) {
        return invalidArgument("line " + std::to_string(line) +
                               ": unsupported directive: " + std::string(s));
      }
    } else if (where == Params) {
      if (s == ")") {
        where = Body;
        continue;
      }
      if (s.back() == ',')
        s.remove_suffix(1);
      parser->param(s, line);
    } else if (s == "{") {
      continue;
    } else if (s == "}") {
      parser->finish();
      where = Outside;
    } else {
      parser->statement(s, line);
    }
    if (!error.empty())
      return invalidArgument("PTX " + error);
  }
  if (where != Outside)
    return invalidArgument("PTX ends inside an entry");
  return PtxModule(std::move(impl));
}

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
