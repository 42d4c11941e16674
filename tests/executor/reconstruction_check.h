// Test helper shared by the executor tests (torch-free): the
// snapshot-equivalence check of a paused ExecutorSet against the simulator's
// reconstruction from the GMG snapshot.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "slicesched/common/clock.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sim/simulator.h"

namespace slicesched::executor {

using StoredBuf = std::tuple<uint64_t, int32_t, uint16_t>;  // (node or checkpoint, output, device)

// Pauses `exec` (the caller resumes it), applies everything up to the
// clock's now, read after pausing (feedback appended to `fb`), and expects the reconstruction to name the
// operator each device runs and the buffers the executors' stores hold;
// `stored` receives the latter.
inline void ExpectReconstructionMatches(ExecutorSet& exec, const GlobalMappingGraph& g,
                                        SimContext& ctx, const Clock& clock,
                                        std::vector<Feedback>* fb, const std::string& where,
                                        std::set<StoredBuf>* stored) {
  exec.Pause();
  const Timestamp now = clock.Now();
  ASSERT_TRUE(exec.AdvanceTo(now, fb).ok()) << where;
  const GmgSnapshot snap = g.Snapshot(now);
  auto sim = Simulator::Create(snap, ctx);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const std::vector<NodeId> running = exec.RunningNow();
  ASSERT_EQ(sim->num_devices(), running.size());
  for (size_t d = 0; d < running.size(); ++d) {
    const uint32_t idx = sim->running(d);
    const NodeId in_sim = idx == GmgSnapshot::kNone ? NodeId() : NodeId(snap.nodes[idx].id);
    EXPECT_EQ(in_sim, running[d]) << "device " << d << " " << where;
  }
  std::set<StoredBuf> in_sim;
  stored->clear();
  for (const SimResidentBuffer& b : sim->ResidentBuffers()) in_sim.insert({b.id, b.output, b.device});
  for (const ExecutorSet::StoredBuffer& b : exec.StoredBuffers()) stored->insert({b.id, b.output, b.device});
  EXPECT_EQ(in_sim, *stored) << where;
}

}  // namespace slicesched::executor
