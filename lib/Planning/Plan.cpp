//===- Plan.cpp - Requests, plans and their chunks ------------------------===//

#include "kvc/Planning/Plan.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <queue>
#include <set>
#include <tuple>

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
                             int64_t loadLayers) {
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const Segment &segment = plan.segments[s];
    const Box &box = segment.box;
    int64_t group =
        segment.method == Method::Compute ? box.layers() : loadLayers;
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

bool dependsOn(const Chunk &later, const Chunk &earlier) {
  if (later.method != Method::Compute)
    return false;
  const Box &a = later.box, &b = earlier.box;
  bool overlap = b.l0 < a.l1 && a.l0 < b.l1;
  bool hiddenInput = earlier.method == Method::Compute && b.t0 == a.t0 &&
                     b.t1 == a.t1 && b.l1 == a.l0;
  return (b.t0 < a.t0 && overlap) || hiddenInput;
}

void orderChunks(std::vector<Chunk> &chunks, ChunkOrder order) {
  if (order == ChunkOrder::TokenMajor) {
    std::stable_sort(
        chunks.begin(), chunks.end(), [](const Chunk &a, const Chunk &b) {
          return std::tie(a.box.t0, a.box.l0) < std::tie(b.box.t0, b.box.l0);
        });
    return;
  }
  // Each chunk's place within its segment: loads layer by layer, computes
  // token by token (chunkPlan's order).
  const size_t n = chunks.size();
  std::map<int, std::vector<size_t>> bySegment;
  for (size_t i = 0; i < n; ++i)
    bySegment[chunks[i].segment].push_back(i);
  std::vector<double> place(n);
  for (auto &[segment, members] : bySegment) {
    std::stable_sort(members.begin(), members.end(), [&](size_t a, size_t b) {
      const Box &x = chunks[a].box, &y = chunks[b].box;
      return chunks[a].method == Method::Compute
                 ? std::tie(x.t0, x.l0) < std::tie(y.t0, y.l0)
                 : std::tie(x.l0, x.t0) < std::tie(y.l0, y.t0);
    });
    for (size_t r = 0; r < members.size(); ++r)
      place[members[r]] = double(r + 1) / double(members.size());
  }
  // Issue the ready chunk of least place (of least segment on a tie): a
  // topological order of the dependencies. Loads depend on nothing, so
  // only computed chunks wait.
  std::vector<int> waitingOn(n, 0);
  std::vector<std::vector<size_t>> users(n);
  for (size_t i = 0; i < n; ++i) {
    if (chunks[i].method != Method::Compute)
      continue;
    for (size_t j = 0; j < n; ++j)
      if (j != i && dependsOn(chunks[i], chunks[j])) {
        users[j].push_back(i);
        ++waitingOn[i];
      }
  }
  auto later = [&](size_t a, size_t b) {
    return std::tie(place[a], chunks[a].segment, a) >
           std::tie(place[b], chunks[b].segment, b);
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(
      later);
  for (size_t i = 0; i < n; ++i)
    if (waitingOn[i] == 0)
      ready.push(i);
  std::vector<Chunk> out;
  out.reserve(n);
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    out.push_back(chunks[i]);
    for (size_t user : users[i])
      if (--waitingOn[user] == 0)
        ready.push(user);
  }
  // Chunks of a plan that verifyPlan accepts never wait on each other in a
  // cycle (a dependency is on earlier tokens or lower layers).
  assert(out.size() == n && "cyclic chunk dependencies");
  chunks = std::move(out);
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
