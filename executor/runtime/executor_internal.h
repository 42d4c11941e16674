// Helpers shared by the executor runtime's translation units (executor.cc:
// construction and the owner's side; device_loop.cc: the device threads;
// owner_wait.cc: how the owner waits and is woken). Private to the runtime.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "slicesched/common/ids.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched::executor::runtime_internal {

inline std::string NodeLabel(const GraphTemplate* tpl, int op, NodeId id) {
  if (tpl == nullptr || op < 0) return id.ToString();
  return StrCat(id, " (", tpl->name(), "/", tpl->op(op).name, ")");
}

// Adds `delta` to one of the counters the owner's waits read without the
// set's lock (see "Owner waits"). They are written only with mu_ held, so a
// plain load and store does: no locked read-modify-write per operator.
inline void AddLocked(std::atomic<size_t>& counter, ptrdiff_t delta) {
  counter.store(counter.load(std::memory_order_relaxed) + static_cast<size_t>(delta), std::memory_order_relaxed);
}

// A spin-wait iteration's hint to the CPU.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace slicesched::executor::runtime_internal
