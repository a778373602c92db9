//===- PtxParser.cpp - PTX text to the interpreter's program ---------------===//
//
// PtxModule::parse: each .entry's parameters and body decoded into
// instructions (operands resolved to register numbers, immediates, special
// registers, parameter offsets and branch targets), refusing what the
// interpreter does not model by line. See PtxInterpreter.h for the model.
//
//===----------------------------------------------------------------------===//

#include "PtxProgram.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <regex>
#include <sstream>

namespace kvc::testing {
namespace {

using namespace ptx;

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

} // namespace

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

} // namespace kvc::testing
