//===- PlanFuzzer.cpp - Fuzzing the compiler with mutated plans -----------===//
//
// Feeds mutated plans to the compiler as kvc-opt would: parse, import the
// model, attach the target, then a pipeline, in process. A malformed plan
// must get a diagnostic, never a crash or a hang; a pass must fail or leave
// IR the verifiers accept; and a plan that compiles must become a bundle
// the runtime's reader (parsePlanBundle, the checks a server's bundle goes
// through) accepts, so that the compiler never hands the runtime a plan it
// refuses.
//
//   build/bin/kvc-plan-fuzz ITERATIONS MODEL.json TARGET.json SEED.mlir...
//
// Mutations keep most of the syntax, so that they reach the verifiers and
// passes behind the parser: a number moved (off by one or sixteen, doubled,
// halved, zeroed), a keyword swapped for another of its kind (a codec's
// width, a form, a tier, a segment's method), a line dropped or repeated;
// one input in sixteen also has bytes flipped, cut or appended. Pipelines:
// kvc-restore-pipeline and kvc-save-pipeline (one run in sixteen with
// gpu-chip=sm_90, the kernels lowered to PTX, two with layer-wise=true,
// the objects issued layer by layer), the plans as written
// (kvc-expand, kvc-fuse, kvc-schedule, kvc-estimate), and the kernels'
// host lowering (kvc-lower-kernels{host}, kvc-kernels-to-llvm).
//
//===----------------------------------------------------------------------===//

#include "../Mutations.h"

#include "kvc/Runtime/Exec/PlanBundle.h"
#include "kvc/Transforms/EmitBundle.h"
#include "kvc/Conversion/KernelGen.h"
#include "kvc/Conversion/Passes.h"
#include "kvc/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace mlir;

namespace {

/// Words that stand where another of their group may: an edit that keeps
/// the syntax and changes what the plan means.
const std::vector<std::vector<std::string>> kKeywordGroups = {
    {"int8", "int4", "int2"},
    {"kv", "hidden"},
    {"channel", "token"},
    {"zstd", "deflate", "lz4", "none"},
    {"hadamard", "none"},
    {"dram", "ssd", "remote", "disk"},
    {"compute", "load_kv", "load_hidden"},
    {"host", "device"},
    {"bf16", "f16", "f32"},
};

bool isWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

/// The [begin, end) of every word (a maximal run of letters, digits and
/// underscores) of `text`.
std::vector<std::pair<size_t, size_t>> words(const std::string &text) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < text.size();) {
    if (!isWordChar(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && isWordChar(text[end]))
      ++end;
    out.push_back({i, end});
    i = end;
  }
  return out;
}

/// One edit of a plan's text (the file comment's list).
void mutate(std::string &text, std::mt19937_64 &rng) {
  const unsigned kind = rng() % 10;
  if (kind < 5) {
    // A number: a word of digits alone (not a name such as "int8").
    std::vector<std::pair<size_t, size_t>> numbers;
    for (auto [b, e] : words(text))
      if (std::all_of(text.begin() + b, text.begin() + e, isDigit))
        numbers.push_back({b, e});
    if (numbers.empty())
      return;
    auto [b, e] = numbers[rng() % numbers.size()];
    const int64_t value =
        std::stoll(text.substr(b, std::min<size_t>(e - b, 17)));
    const std::array<int64_t, 8> choices = {value + 1, value - 1,  value * 2,
                                            value / 2, value + 16, value - 16,
                                            0,         value * 3};
    const int64_t moved = std::max<int64_t>(0, choices[rng() % choices.size()]);
    text.replace(b, e - b, std::to_string(moved));
  } else if (kind < 8) {
    // A keyword, for another of its group.
    const auto &group = kKeywordGroups[rng() % kKeywordGroups.size()];
    std::vector<std::pair<size_t, size_t>> hits;
    for (auto [b, e] : words(text))
      if (std::find(group.begin(), group.end(), text.substr(b, e - b)) !=
          group.end())
        hits.push_back({b, e});
    if (hits.empty())
      return;
    auto [b, e] = hits[rng() % hits.size()];
    text.replace(b, e - b, group[rng() % group.size()]);
  } else {
    // A line dropped or repeated.
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      lines.push_back(line);
    if (lines.empty())
      return;
    const size_t at = rng() % lines.size();
    if (kind == 8)
      lines.erase(lines.begin() + at);
    else
      lines.insert(lines.begin() + at, lines[rng() % lines.size()]);
    text.clear();
    for (const std::string &line : lines)
      text += line + "\n";
  }
}

enum class Outcome { Refused, Failed, Bundled, Lowered };

/// Aborts where a pass succeeds and leaves IR the verifiers refuse: a pass
/// fails with a diagnostic or keeps the module valid, whatever its input.
struct VerifyAfterEachPass : PassInstrumentation {
  const std::string &diagnostics;
  explicit VerifyAfterEachPass(const std::string &diagnostics)
      : diagnostics(diagnostics) {}
  void runAfterPass(Pass *pass, Operation *op) override {
    if (succeeded(verify(op)))
      return;
    std::fprintf(stderr,
                 "kvc-plan-fuzz: %s succeeded and left IR the verifiers "
                 "refuse:\n%s",
                 pass->getName().str().c_str(), diagnostics.c_str());
    std::abort();
  }
};

struct Fuzzer {
  DialectRegistry registry;
  std::unique_ptr<MLIRContext> context;
  std::string model, target;

  Fuzzer(std::string model, std::string target)
      : model(std::move(model)), target(std::move(target)) {
    kvc::compiler::registerKernelDialects(registry);
    kvc::compiler::registerKVCPasses();
    kvc::compiler::registerKVCConversionPasses();
    kvc::compiler::registerKVCPipelines();
    context = std::make_unique<MLIRContext>(registry,
                                            MLIRContext::Threading::DISABLED);
    context->loadAllAvailableDialects();
  }

  /// The model and target, as kvc-opt attaches them: a plan that does not
  /// fit them fails verification after these passes, with a diagnostic.
  std::string descriptions() const {
    return "kvc-import-model{path=" + model +
           "},kvc-attach-target{path=" + target + "}";
  }

  /// Pipeline `which` of the file comment's list (0, 1: the restore and save
  /// pipelines, without and with kernels; 2: as written; 3: the host form;
  /// 4: the pipelines layer-wise).
  static std::string pipeline(int which) {
    switch (which) {
    case 0:
      return "kvc-restore-pipeline{gpu-chip=none},"
             "kvc-save-pipeline{gpu-chip=none}";
    case 1:
      return "kvc-restore-pipeline{gpu-chip=sm_90},"
             "kvc-save-pipeline{gpu-chip=sm_90}";
    case 2:
      return "kvc-expand,kvc-fuse,kvc-schedule,kvc-estimate";
    case 3:
      return "kvc-expand,kvc-fuse,kvc-lower-kernels{host=true},"
             "kvc-kernels-to-llvm";
    default:
      return "kvc-restore-pipeline{layer-wise=true gpu-chip=none},"
             "kvc-save-pipeline{layer-wise=true gpu-chip=none}";
    }
  }

  /// Runs `passes` on `module`; `verifyEach` as the pass manager's own
  /// verifier, else through VerifyAfterEachPass.
  LogicalResult run(ModuleOp module, const std::string &passes, bool verifyEach,
                    const std::string &diagnostics) {
    PassManager pm(context.get());
    if (failed(parsePassPipeline(passes, pm))) {
      std::fprintf(stderr, "kvc-plan-fuzz: cannot build pipeline %s\n",
                   passes.c_str());
      std::exit(2);
    }
    pm.enableVerifier(verifyEach);
    if (!verifyEach)
      pm.addInstrumentation(std::make_unique<VerifyAfterEachPass>(diagnostics));
    return pm.run(module);
  }

  /// Compiles `text` with pipeline `which`; aborts, saying why, where the
  /// compiler writes a bundle the runtime refuses. Diagnostics,
  /// the expected answer to most mutants, print only where `loud`.
  Outcome compile(const std::string &text, int which, bool loud = false) {
    std::string diagnostics; // This input's, for a report.
    ScopedDiagnosticHandler quiet(context.get(), [&](Diagnostic &d) {
      diagnostics += d.str() + "\n";
      return loud ? failure() : success();
    });
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(text, context.get());
    if (!module || failed(run(*module, descriptions(), true, diagnostics)))
      return Outcome::Refused;
    if (failed(run(*module, pipeline(which), false, diagnostics)))
      return Outcome::Failed;
    if (which == 3)
      return Outcome::Lowered;
    std::string json;
    llvm::raw_string_ostream os(json);
    if (failed(kvc::compiler::writePlanBundle(*module, os)))
      return Outcome::Failed;
    os.flush();
    kvc::StatusOr<kvc::PlanBundle> bundle = kvc::parsePlanBundle(json);
    if (!bundle) {
      std::fprintf(stderr,
                   "kvc-plan-fuzz: the compiler wrote a bundle the runtime "
                   "refuses: %s\n",
                   bundle.status().toString().c_str());
      std::abort();
    }
    return Outcome::Bundled;
  }
};

/// How long one input may take before it counts as a hang.
constexpr unsigned kTimeoutSeconds = 120;

/// Fuzzer::compile in a child process, so that nothing one input does to
/// the process reaches the next. MLIR 19's parser writes freed memory on
/// one kind of invalid input (a value used above the region nesting its
/// definition, then a parse error: llvm/llvm-project#107121, fixed upstream
/// by #127778 in February 2025), which corrupts the heap of a process that
/// goes on parsing; the child that parsed it ends with `_exit`. Exits,
/// printing the input, where the child crashes (its aborts say why) or
/// hangs.
Outcome compileIsolated(Fuzzer &fuzzer, const std::string &text, int which) {
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("kvc-plan-fuzz: fork");
    std::exit(2);
  }
  if (child == 0) {
    alarm(kTimeoutSeconds);
    _exit(int(fuzzer.compile(text, which)));
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) <= int(Outcome::Lowered))
    return Outcome(WEXITSTATUS(status));
  const bool hung = WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
  std::fprintf(stderr,
               "kvc-plan-fuzz: the compiler %s on this input (pipeline "
               "%s):\n%s\n",
               hung ? "hung" : "crashed", Fuzzer::pipeline(which).c_str(),
               text.c_str());
  std::exit(1);
}

std::string readFile(const char *path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: kvc-plan-fuzz ITERATIONS MODEL.json "
                         "TARGET.json SEED.mlir [SEED.mlir ...]\n");
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  Fuzzer fuzzer(argv[2], argv[3]);
  std::vector<std::string> seeds;
  for (int i = 4; i < argc; ++i) {
    seeds.push_back(readFile(argv[i]));
    // A seed that does not compile fuzzes nothing behind the verifiers.
    if (fuzzer.compile(seeds.back(), 0, /*loud=*/true) != Outcome::Bundled) {
      std::fprintf(stderr, "kvc-plan-fuzz: seed %s does not compile\n",
                   argv[i]);
      return 1;
    }
  }
  std::mt19937_64 rng(kvc::fuzz::mutationSeed(20261124));
  long counts[4] = {};
  for (long i = 0; i < iterations; ++i) {
    std::string text = seeds[rng() % seeds.size()];
    for (int m = 0, n = 1 + int(rng() % 2); m < n; ++m)
      mutate(text, rng);
    if (rng() % 16 == 0)
      kvc::fuzz::damage(text, rng);
    const unsigned pick = rng() % 16;
    const int which = pick == 0   ? 1
                      : pick < 6  ? 0
                      : pick < 8  ? 4
                      : pick < 12 ? 2
                                  : 3;
    ++counts[int(compileIsolated(fuzzer, text, which))];
  }
  std::printf("%ld mutated plans compiled without a crash: %ld refused by "
              "the parser or the verifiers, %ld by a pass, %ld written as "
              "bundles the runtime accepts, %ld lowered for the host\n",
              iterations, counts[0], counts[1], counts[2], counts[3]);
  // Mutations that never get past the verifiers test only the parser.
  if (iterations >= 100 && counts[int(Outcome::Bundled)] == 0) {
    std::fprintf(stderr, "kvc-plan-fuzz: no mutated plan compiled\n");
    return 1;
  }
  return 0;
}
