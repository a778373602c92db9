//===- Plan.cpp - Requests, plans and their chunks ------------------------===//

#include "kvc/Planning/Plan.h"

#include <algorithm>
#include <set>

namespace kvc::planning {

const char *methodName(Method method) {
  switch (method) {
  case Method::Compute:
    return "compute";
  case Method::LoadKV:
    return "load_kv";
  case Method::LoadHidden:
    return "load_hidden";
  }
  return "unknown";
}

std::vector<Chunk> chunkPlan(const Plan &plan, int64_t chunkTokens,
                             int64_t layerGroup) {
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const Segment &segment = plan.segments[s];
    const Box &box = segment.box;
    int64_t group =
        segment.method == Method::Compute ? box.layers() : layerGroup;
    for (int64_t t0 = box.t0; t0 < box.t1;) {
      int64_t t1 = std::min((t0 / chunkTokens + 1) * chunkTokens, box.t1);
      for (int64_t l0 = box.l0; l0 < box.l1; l0 += group)
        chunks.push_back({static_cast<int>(s), segment.method,
                          Box{t0, t1, l0, std::min(l0 + group, box.l1)},
                          segment.source});
      t0 = t1;
    }
  }
  return chunks;
}

namespace {
std::string str(const Box &b) {
  return "tokens " + std::to_string(b.t0) + " to " + std::to_string(b.t1) +
         " of layers " + std::to_string(b.l0) + " to " + std::to_string(b.l1);
}
} // namespace

Status verifyPlan(const Plan &plan, const Request &request, int64_t layers) {
  Box whole{0, request.tokens, 0, layers};
  // Coverage on the grid of segment boundaries.
  std::set<int64_t> ts{whole.t0, whole.t1}, ls{whole.l0, whole.l1};
  for (const Segment &s : plan.segments) {
    if (s.box.empty() || !whole.contains(s.box))
      return invalidArgument("segment " + str(s.box) +
                             " is empty or outside the request");
    ts.insert({s.box.t0, s.box.t1});
    ls.insert({s.box.l0, s.box.l1});
    if (s.method == Method::Compute && s.source < 0)
      continue;
    if (s.source < 0 || s.source >= static_cast<int>(request.sources.size()))
      return invalidArgument(std::string(methodName(s.method)) + " segment " +
                             str(s.box) + " names no stored source");
    const Source &source = request.sources[s.source];
    Form want = s.method == Method::LoadKV ? Form::KV : Form::Hidden;
    Box needed = s.box;
    if (s.method == Method::Compute)
      needed.l1 = needed.l0 + 1; // Hidden states entering the first layer.
    if (source.form != want || !source.box.contains(needed))
      return invalidArgument("source " + std::to_string(s.source) +
                             " does not hold the " + name(want) + " of " +
                             str(needed));
  }
  std::vector<int64_t> tv(ts.begin(), ts.end()), lv(ls.begin(), ls.end());
  for (size_t i = 0; i + 1 < tv.size(); ++i) {
    for (size_t j = 0; j + 1 < lv.size(); ++j) {
      Box cell{tv[i], tv[i + 1], lv[j], lv[j + 1]};
      int count = 0;
      for (const Segment &s : plan.segments)
        count += s.box.contains(cell);
      if (count == 0)
        return invalidArgument("plan leaves " + str(cell) + " uncovered");
      if (count > 1)
        return invalidArgument("plan covers " + str(cell) + " twice");
    }
  }
  return Status::ok();
}

} // namespace kvc::planning
