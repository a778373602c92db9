//===- Args.h - kvc-run's options and progress line -------------*- C++ -*-===//

#ifndef KVC_TOOLS_KVC_RUN_ARGS_H
#define KVC_TOOLS_KVC_RUN_ARGS_H

#include "kvc/Runtime/Base/Status.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace kvc::run {

/// One option of a command: its name, the placeholder of its value ("" for
/// a flag; in brackets when the value may be left out), and one line of
/// help with its default.
struct Option {
  const char *name, *value, *help;
  bool isFlag() const { return !*value; }
  bool valueOptional() const { return *value == '['; }
};

/// `--key value` and `--flag` options after the command, checked against
/// the command's options as they are parsed: an unknown option, one given
/// twice, or one that needs a value given without one is an error before
/// any work starts.
class Args {
public:
  static StatusOr<Args> parse(int argc, char **argv, int first,
                              const std::string &command,
                              const std::vector<Option> &options) {
    Args args;
    for (const Option &option : options)
      args.known_.push_back(option.name);
    for (int i = first; i < argc; ++i) {
      std::string key = argv[i];
      if (key == "-h")
        key = "--help";
      if (key.rfind("--", 0) != 0)
        return invalidArgument("unexpected argument " + key);
      key = key.substr(2);
      auto option =
          std::find_if(options.begin(), options.end(),
                       [&](const Option &o) { return key == o.name; });
      if (option == options.end())
        return invalidArgument("unknown option --" + key + " (kvc-run " +
                               command + " --help lists them)");
      if (args.values_.count(key))
        return invalidArgument("--" + key + " given twice");
      const bool valueNext =
          i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
      if (option->isFlag() || (!valueNext && option->valueOptional()))
        args.values_[key] = "";
      else if (valueNext)
        args.values_[key] = argv[++i];
      else
        return invalidArgument("--" + key + " needs a value");
    }
    return args;
  }
  bool has(const std::string &key) {
    used_.push_back(key);
    return values_.count(key);
  }
  std::string get(const std::string &key, const std::string &fallback = "") {
    used_.push_back(key);
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  StatusOr<int64_t> integer(const std::string &key, int64_t fallback) {
    std::string text = get(key);
    if (text.empty())
      return fallback;
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (*end || errno == ERANGE)
      return invalidArgument("--" + key + " expects an integer, got " + text);
    return int64_t(v);
  }
  /// The number `key` names, or none where it is not given.
  StatusOr<std::optional<double>> number(const std::string &key) {
    if (!has(key))
      return std::optional<double>();
    std::string text = get(key);
    char *end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end || std::isnan(v))
      return invalidArgument("--" + key + " expects a number, got " + text);
    return std::optional<double>(v);
  }
  /// Whether the command takes option `key` at all.
  bool takes(const std::string &key) const {
    return std::find(known_.begin(), known_.end(), key) != known_.end();
  }
  /// Gives `key` `value` where the command line did not.
  void setDefault(const std::string &key, const std::string &value) {
    values_.emplace(key, value);
  }
  StatusOr<std::string> required(const std::string &key) {
    if (!has(key))
      return invalidArgument("missing --" + key);
    return get(key);
  }
  /// Fails on options this use of the command does not read (--plan
  /// without --bundle, say).
  Status checkUnused() const {
    for (const auto &[key, value] : values_)
      if (std::find(used_.begin(), used_.end(), key) == used_.end())
        return invalidArgument("--" + key + " does not apply here");
    return Status::ok();
  }

private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> used_, known_;
};

/// One line of progress on a terminal's stderr, rewritten in place and
/// erased when done; nothing when stderr is not a terminal (a log, a pipe).
class Progress {
public:
  Progress() : tty_(isatty(STDERR_FILENO)) {}
  ~Progress() {
    if (shown_)
      std::fprintf(stderr, "\r\033[K");
  }
  void show(const std::string &text) {
    if (!tty_)
      return;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }

private:
  bool tty_, shown_ = false;
};

} // namespace kvc::run

#endif // KVC_TOOLS_KVC_RUN_ARGS_H
