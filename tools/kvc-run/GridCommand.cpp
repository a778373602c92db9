//===- GridCommand.cpp - kvc-run grid: the main job in one process --------===//
//
// Saves each context once and compares every strategy at each link rate,
// each cell a step run as its command (runStep) with its output in a file
// of its own, the tables rewritten after every cell.
//
//===----------------------------------------------------------------------===//

#include "Commands.h"

#include "kvc/Host/Tools/Calibrate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace kvc::run {

namespace {

/// Comma-separated numbers, each positive.
StatusOr<std::vector<int64_t>> positiveList(const std::string &flag,
                                            const std::string &text) {
  std::vector<int64_t> values;
  std::stringstream in(text);
  for (std::string word; std::getline(in, word, ',');) {
    char *end = nullptr;
    const long long value = std::strtoll(word.c_str(), &end, 10);
    if (word.empty() || *end || value <= 0)
      return invalidArgument("--" + flag +
                             " expects positive integers "
                             "separated by commas, got " +
                             text);
    values.push_back(value);
  }
  if (values.empty())
    return invalidArgument("--" + flag + " names nothing");
  return values;
}

} // namespace

/// The main job in one process: the model read once (loadModel), the
/// machine calibrated (or --target taken as it is), each context saved
/// through the backend's prefill, and every strategy planned in-process for
/// each link and compared over the store throttled to it, every run
/// verified. Each cell's output goes to PREFIX-T-GBPS.txt as it runs, and
/// PREFIX.md and PREFIX.json are rewritten after each cell, so that a run
/// stopped by a time limit keeps what finished.
Status gridCommand(Args &args) {
  KVC_ASSIGN_OR_RETURN(modelDir, args.required("model"));
  KVC_ASSIGN_OR_RETURN(prefix, args.required("out"));
  KVC_ASSIGN_OR_RETURN(work, args.required("work"));
  KVC_ASSIGN_OR_RETURN(contexts,
                       positiveList("tokens", args.get("tokens", "8192")));
  KVC_ASSIGN_OR_RETURN(links, positiveList("links", args.get("links", "7")));
  KVC_ASSIGN_OR_RETURN(repeat, args.integer("repeat", 2));
  if (repeat <= 0)
    return invalidArgument("--repeat must be positive");
  const bool calibrateFirst = args.has("calibrate");
  const std::string prefillTokens = args.get("prefill-tokens");
  std::string target = args.get("target");
  if (target.empty())
    return invalidArgument("missing --target (the target to plan for; with "
                           "--calibrate, to start from)");
  KVC_RETURN_IF_ERROR(args.checkUnused());
  std::error_code error;
  std::filesystem::create_directories(work, error);
  if (error)
    return invalidArgument("--work " + work + ": " + error.message());
  const std::string absoluteWork = std::filesystem::absolute(work).string();

  using Json = nlohmann::json;
  Json cells = Json::array();
  std::string table = "| step | tokens | link Gbps | status | seconds | "
                      "output |\n|---|---|---|---|---|---|\n";
  std::string planTable =
      "| tokens | link Gbps | plan | predicted ms | fastest ms | off | "
      "median ms | fallbacks |\n|---|---|---|---|---|---|---|---|\n";
  Status first;
  auto record = [&](const std::string &step, int64_t tokens, int64_t gbps,
                    const std::string &output, const Status &status,
                    double seconds,
                    const Json &plans = Json::array()) -> Status {
    cells.push_back({{"step", step},
                     {"tokens", tokens},
                     {"gbps", gbps},
                     {"status", status.isOk() ? "ok" : status.toString()},
                     {"seconds", seconds},
                     {"output", output},
                     {"plans", plans}});
    for (const Json &plan : plans) {
      const double fastest = plan.value("fastest_ms", 0.0);
      std::string predicted = "-", off = "-";
      if (plan.contains("predicted_ms")) {
        const double priced = plan.value("predicted_ms", 0.0);
        char text[32];
        std::snprintf(text, sizeof(text), "%.3f", priced);
        predicted = text;
        if (priced > 0) {
          std::snprintf(text, sizeof(text), "%+.0f%%",
                        (fastest / priced - 1) * 100);
          off = text;
        }
      }
      char line[256];
      std::snprintf(line, sizeof(line),
                    "| %lld | %lld | %s | %s | %.3f | %s | %.3f | %lld |\n",
                    (long long)tokens, (long long)gbps,
                    plan.value("plan", std::string()).c_str(),
                    predicted.c_str(), fastest, off.c_str(),
                    plan.value("median_ms", 0.0),
                    (long long)plan.value("fallbacks", 0));
      planTable += line;
    }
    char row[512];
    std::snprintf(row, sizeof(row), "| %s | %s | %s | %s | %.1f | %s |\n",
                  step.c_str(), tokens ? std::to_string(tokens).c_str() : "-",
                  gbps ? std::to_string(gbps).c_str() : "-",
                  status.isOk() ? "ok" : "FAILED", seconds, output.c_str());
    table += row;
    std::printf("grid: %s", row);
    std::fflush(stdout);
    if (!status.isOk() && first.isOk())
      first = status;
    std::ofstream md(prefix + ".md"), json(prefix + ".json");
    md << table << "\n" << planTable;
    json << Json{{"model", modelDir}, {"target", target}, {"cells", cells}}
                .dump(1)
         << "\n";
    if (!md || !json)
      return unavailable(prefix + ".md: cannot write the grid's results");
    return Status::ok();
  };
  auto timed = [&](const std::string &name,
                   const std::vector<std::string> &words,
                   const std::string &output) {
    auto started = std::chrono::steady_clock::now();
    Status status = runStep(name, words, output);
    std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - started;
    return std::make_pair(status, took.count());
  };

  {
    // The model, read once for every step (its weights go to a device as
    // stored on the first step that computes there).
    auto started = std::chrono::steady_clock::now();
    Status loaded = loadModel(modelDir).status();
    std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - started;
    KVC_RETURN_IF_ERROR(record("load", 0, 0, "-", loaded, took.count()));
    if (!loaded.isOk())
      return loaded;
  }
  if (calibrateFirst) {
    const std::string calibrated = prefix + "-target.json";
    auto [status, seconds] =
        timed("calibrate",
              {"--model", modelDir, "--base", target, "--out", calibrated,
               "--scratch", absoluteWork},
              prefix + "-calibrate.txt");
    KVC_RETURN_IF_ERROR(
        record("calibrate", 0, 0, prefix + "-calibrate.txt", status, seconds));
    if (!status.isOk())
      return status;
    target = calibrated;
  }
  for (int64_t tokens : contexts) {
    const std::string request = std::to_string(tokens);
    const std::string store = "file://" + absoluteWork + "/store-" + request;
    const std::vector<std::string> common = {
        "--model", modelDir, "--random-tokens", request, "--seed", "7"};
    if (!std::filesystem::is_directory(absoluteWork + "/store-" + request)) {
      std::vector<std::string> words = common;
      words.insert(words.end(), {"--store", store, "--forms", "kv,hidden"});
      if (!prefillTokens.empty())
        words.insert(words.end(), {"--prefill-tokens", prefillTokens});
      const std::string output = prefix + "-save-" + request + ".txt";
      auto [status, seconds] = timed("save", words, output);
      KVC_RETURN_IF_ERROR(record("save", tokens, 0, output, status, seconds));
      if (!status.isOk())
        continue;
    }
    const int64_t fastest = *std::max_element(links.begin(), links.end());
    for (std::size_t l = 0; l < links.size(); ++l) {
      const std::string gbps = std::to_string(links[l]);
      std::vector<std::string> words = common;
      words.insert(words.end(),
                   {"--store", store + "?gbps=" + gbps, "--strategy",
                    "--target", target, "--repeat", std::to_string(repeat)});
      // A trace of each plan's fastest run at the fastest link, where the
      // load and the compute overlap most.
      if (links[l] == fastest)
        words.insert(words.end(), {"--trace", prefix + "-trace-" + request});
      const std::string cell = prefix + "-" + request + "-" + gbps;
      words.insert(words.end(), {"--json", cell + ".json"});
      auto [status, seconds] = timed("compare", words, cell + ".txt");
      // The comparison's own table, where it got as far as writing it.
      Json plans = Json::array();
      if (std::ifstream in(cell + ".json"); in) {
        Json written = Json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (written.is_object() && written.contains("plans"))
          plans = written["plans"];
      }
      KVC_RETURN_IF_ERROR(record("compare", tokens, links[l], cell + ".txt",
                                 status, seconds, plans));
    }
  }
  return first;
}

Status runStep(const std::string &name, const std::vector<std::string> &words,
               const std::string &outputPath) {
  const auto &all = commands();
  auto command = std::find_if(all.begin(), all.end(),
                              [&](const Command &c) { return name == c.name; });
  if (command == all.end())
    return internalError("no command " + name);
  std::vector<std::string> owned = words;
  std::vector<char *> argv;
  for (std::string &word : owned)
    argv.push_back(word.data());
  KVC_ASSIGN_OR_RETURN(args, Args::parse(int(argv.size()), argv.data(), 0,
                                         command->name, command->options));
  // The step's standard output goes to its file.
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  std::FILE *file = std::fopen(outputPath.c_str(), "w");
  if (saved < 0 || !file) {
    if (saved >= 0)
      ::close(saved);
    return unavailable(outputPath + ": cannot write: " + std::strerror(errno));
  }
  ::dup2(::fileno(file), STDOUT_FILENO);
  Status status = command->run(args);
  if (!status.isOk())
    std::printf("kvc-run %s: %s\n", name.c_str(), status.toString().c_str());
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  std::fclose(file);
  return status;
}

} // namespace kvc::run
