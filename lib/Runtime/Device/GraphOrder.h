//===- GraphOrder.h - Topological order of task graphs ----------*- C++ -*-===//
//
// Private to lib/Runtime/Exec: the one dependency-graph walk that bundle
// validation and graph runs share.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_DEVICE_GRAPHORDER_H
#define KVC_LIB_RUNTIME_DEVICE_GRAPHORDER_H

#include <cstdint>
#include <vector>

namespace kvc::exec_detail {

/// Tasks 0..n-1 in an order where each follows the tasks `after(i)` names
/// (Kahn's algorithm). `after(i)` must return valid, in-range indices. The
/// order is shorter than n exactly when the graph has a cycle; `onCycle` is
/// then set to a task on (or behind) one.
template <typename AfterFn>
std::vector<int64_t> topologicalOrder(int64_t n, AfterFn after,
                                      int64_t *onCycle = nullptr) {
  std::vector<std::vector<int64_t>> users(n);
  std::vector<int64_t> pending(n, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t dep : after(i)) {
      users[dep].push_back(i);
      ++pending[i];
    }
  std::vector<int64_t> order;
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    if (pending[i] == 0)
      order.push_back(i);
  for (std::size_t next = 0; next < order.size(); ++next)
    for (int64_t user : users[order[next]])
      if (--pending[user] == 0)
        order.push_back(user);
  if (onCycle && int64_t(order.size()) != n)
    for (int64_t i = 0; i < n; ++i)
      if (pending[i] > 0) {
        *onCycle = i;
        break;
      }
  return order;
}

} // namespace kvc::exec_detail

#endif // KVC_LIB_RUNTIME_DEVICE_GRAPHORDER_H
