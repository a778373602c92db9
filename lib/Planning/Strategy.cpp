//===- Strategy.cpp - The restore strategies, one table -------------------===//
//
// Each strategy's name, the form it loads, whether it only loads and whether
// the joint search is held against it: every list of strategies (the
// planner's baselines, the Connector's filters, the tools' and the Python
// package's names) reads this table.
//
//===----------------------------------------------------------------------===//

#include "kvc/Planning/Planner.h"

#include <algorithm>

namespace kvc::planning {

namespace {

struct StrategyRow {
  Strategy strategy;
  const char *name;
  std::optional<Form> needs;
  bool onlyLoads; ///< strategyOnlyLoads.
  /// One of the single techniques the joint search is held against
  /// (Planner::baselines): every one but joint.
  bool baseline;
};

constexpr StrategyRow kStrategies[] = {
    {Strategy::Compute, "compute", std::nullopt, false, true},
    {Strategy::Kv, "kv", Form::KV, true, true},
    {Strategy::Hidden, "hidden", Form::Hidden, true, true},
    {Strategy::Cake, "cake", Form::KV, false, true},
    {Strategy::HCache, "hcache", Form::Hidden, false, true},
    {Strategy::Joint, "joint", std::nullopt, false, false},
};

} // namespace

const std::vector<Strategy> &allStrategies() {
  static const std::vector<Strategy> all = [] {
    std::vector<Strategy> out;
    for (const StrategyRow &row : kStrategies)
      out.push_back(row.strategy);
    return out;
  }();
  return all;
}

const char *strategyName(Strategy strategy) {
  return kStrategies[int(strategy)].name;
}

std::optional<Strategy> parseStrategy(std::string_view name) {
  for (const StrategyRow &row : kStrategies)
    if (name == row.name)
      return row.strategy;
  return std::nullopt;
}

std::optional<Form> strategyNeeds(Strategy strategy) {
  return kStrategies[int(strategy)].needs;
}

bool strategyOnlyLoads(Strategy strategy) {
  return kStrategies[int(strategy)].onlyLoads;
}

bool strategyIsBaseline(Strategy strategy) {
  return kStrategies[int(strategy)].baseline;
}

StatusOr<std::vector<Strategy>> parseStrategies(std::string_view list) {
  std::vector<Strategy> out;
  if (list == "all" || list.empty())
    return out;
  for (size_t at = 0; at <= list.size();) {
    size_t end = std::min(list.find(',', at), list.size());
    std::string_view name = list.substr(at, end - at);
    std::optional<Strategy> strategy = parseStrategy(name);
    if (!strategy) {
      std::string known;
      for (const StrategyRow &row : kStrategies)
        known += std::string(known.empty() ? "" : ", ") + row.name;
      return invalidArgument("unknown strategy \"" + std::string(name) +
                             "\" (known: " + known + ", or all)");
    }
    out.push_back(*strategy);
    at = end + 1;
  }
  return out;
}

std::vector<Strategy> strategiesFor(const std::vector<Source> &sources) {
  auto stores = [&](Form form) {
    return std::any_of(
        sources.begin(), sources.end(),
        [&](const Source &source) { return source.form == form; });
  };
  std::vector<Strategy> out;
  for (const StrategyRow &row : kStrategies)
    if (!row.needs || stores(*row.needs))
      out.push_back(row.strategy);
  return out;
}

} // namespace kvc::planning
