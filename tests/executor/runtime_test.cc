// Tests of the torch-free executor runtime: memory pools, the communication
// graph, and ExecutorSet driving a live GMG with fake kernels.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "slicesched/comm/comm_graph.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/runtime/kernel.h"
#include "slicesched/executor/runtime/memory_pool.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sim/simulator.h"
#include "reconstruction_check.h"

namespace slicesched::executor {
namespace {

using ::testing::HasSubstr;

// Aborts the process (failing the test) if not disarmed within `limit`, so a
// deadlock fails instead of hanging.
class Watchdog {
 public:
  explicit Watchdog(absl::Duration limit)
      : thread_([this, limit] {
          if (!done_.WaitForNotificationWithTimeout(limit)) {
            fprintf(stderr, "watchdog: test still running after %s; deadlock?\n",
                    absl::FormatDuration(limit).c_str());
            std::abort();
          }
        }) {}
  ~Watchdog() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

AcceleratorSet Devices(int n, Bytes mem = Bytes::GiB(1)) {
  std::vector<DeviceSpec> devs(n);
  for (int d = 0; d < n; ++d) {
    devs[d].name = "cpu" + std::to_string(d);
    devs[d].type = "cpu";
    devs[d].memory = mem;
    devs[d].backend = DeviceBackend::kCpu;
  }
  return *AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)});
}

std::shared_ptr<const GraphTemplate> Chain(int len) {
  TemplateBuilder b("chain" + std::to_string(len));
  b.ExternalInput("in", DType::kI64, {"N"});
  for (int i = 0; i < len; ++i) {
    b.Op("op" + std::to_string(i), OpKind::kGeneric)
        .Inputs({i == 0 ? std::string("$in") : "op" + std::to_string(i - 1)})
        .Output("x", DType::kF32, {"N"})
        .Workspace("N*2");
  }
  return *b.Build();
}

std::shared_ptr<const GraphTemplate> Diamond() {
  TemplateBuilder b("diamond");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("a", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("b", OpKind::kGeneric).Inputs({"a"}).Output("y", DType::kF32, {"N"}).Workspace("N");
  b.Op("c", OpKind::kGeneric).Inputs({"a"}).Output("z", DType::kF32, {"N"});
  b.Op("d", OpKind::kGeneric).Inputs({"b", "c"}).Output("o", DType::kF32, {"N"});
  return *b.Build();
}

// One GMG, a manual clock the fake kernels advance, and the executors.
struct Rig {
  explicit Rig(int devices, Bytes mem = Bytes::GiB(1))
      : g(Devices(devices, mem)),
        kernels([](const KernelCall& c) { return Duration::Micros(10 + 5 * c.op_index); }, &clock) {
    chain = *g.RegisterTemplate(Chain(4));
    diamond = *g.RegisterTemplate(Diamond());
  }
  void Start(ExecutorOptions o = {}) {
    exec = std::make_unique<ExecutorSet>(&g, &clock, &kernels, &host, std::move(o));
  }
  InstanceId New(TemplateId t, int64_t n, int prio = 0,
                 PriorityClass cls = PriorityClass::kOffline) {
    InstanceSpec s;
    s.template_id = t;
    s.bindings = {{"N", n}};
    s.priority = prio;
    s.priority_class = cls;
    s.arrival = clock.Now();
    return *g.Instantiate(s);
  }
  // Places op i of `inst` on devs[i % devs.size()] and tells the executors.
  void Place(InstanceId inst, const std::vector<int>& devs, int32_t transfer_priority = 0) {
    const Instance* in = g.FindInstance(inst);
    std::vector<NodePlacement> p;
    for (int op : in->tpl->topo_order()) {
      p.push_back({in->nodes[op].id, DeviceId(devs[op % devs.size()])});
    }
    Issue(p, transfer_priority);
  }
  // Issues the placed nodes (part of an instance will do) and tells the
  // executors.
  void Issue(const std::vector<NodePlacement>& p, int32_t transfer_priority = 0) {
    auto issued = IssuePlacements(g, p, transfer_priority, clock.Now());
    ASSERT_TRUE(issued.ok()) << issued.status();
    for (NodeId n : *issued) exec->NodeIssued(n);
  }
  // Drives the executors until every instance retired; checks the GMG's
  // invariants after every step.
  absl::Status Run(bool verify = true) {
    SLICESCHED_RETURN_IF_ERROR(exec->Dispatch(clock.Now()));
    while (g.num_instances() > 0) {
      if (!exec->WaitForCompletion(absl::Seconds(60))) {
        return absl::DeadlineExceededError("no completion within 60 s: the executors are stuck");
      }
      SLICESCHED_RETURN_IF_ERROR(exec->AdvanceTo(clock.Now(), &feedback));
      if (verify) SLICESCHED_RETURN_IF_ERROR(g.VerifyInvariants());
    }
    return absl::OkStatus();
  }

  ManualClock clock;
  GlobalMappingGraph g;
  FakeKernelRunner kernels;
  HostTransferBackend host;
  std::unique_ptr<ExecutorSet> exec;
  TemplateId chain, diamond;
  std::vector<Feedback> feedback;
};

// Per device, the run intervals of compute feedback never overlap.
void ExpectNoOverlap(const std::vector<Feedback>& fb, Feedback::Kind kind, size_t devices) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> per(devices);
  for (const Feedback& f : fb) {
    if (f.kind != kind) continue;
    ASSERT_LE(f.start, f.end);
    per[f.device.value()].push_back({f.start.nanos(), f.end.nanos()});
    if (kind == Feedback::Kind::kTransfer) per[f.dst.value()].push_back({f.start.nanos(), f.end.nanos()});
  }
  for (size_t d = 0; d < devices; ++d) {
    std::sort(per[d].begin(), per[d].end());
    for (size_t i = 1; i < per[d].size(); ++i) {
      EXPECT_LE(per[d][i - 1].second, per[d][i].first)
          << "device " << d << ": interval " << i - 1 << " overlaps interval " << i;
    }
  }
}

// ---------------------------------------------------------------------------
// DevicePool

TEST(DevicePoolTest, ChargesReleasesAndReportsExhaustion) {
  DevicePool pool(DeviceId(3), "gpu3", Bytes(1000));
  {
    auto a = pool.Allocate(Bytes(600), AllocPurpose::kOutput);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(pool.used(), Bytes(600));
    auto b = pool.Allocate(Bytes(500), AllocPurpose::kRecv);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("gpu3"));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("500 bytes requested"));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("400 bytes free"));
    Allocation moved = std::move(*a);
    EXPECT_EQ(pool.used(), Bytes(600));
  }
  EXPECT_EQ(pool.used(), Bytes(0));
  EXPECT_EQ(pool.peak(), Bytes(600));
  pool.FailNextAllocations(2, AllocPurpose::kRecv);
  EXPECT_TRUE(pool.Allocate(Bytes(1), AllocPurpose::kOutput).ok());
  EXPECT_FALSE(pool.Allocate(Bytes(1), AllocPurpose::kRecv).ok());
  EXPECT_FALSE(pool.Allocate(Bytes(1), AllocPurpose::kRecv).ok());
  EXPECT_TRUE(pool.Allocate(Bytes(1), AllocPurpose::kRecv).ok());
  pool.SetFailureHook([](const AllocationRequest& r) { return r.bytes == Bytes(7); });
  EXPECT_FALSE(pool.Allocate(Bytes(7)).ok());
  EXPECT_TRUE(pool.Allocate(Bytes(8)).ok());
  EXPECT_EQ(pool.num_failures(), 4);
  EXPECT_EQ(pool.used(), Bytes(0));
}

// AllocateEach (the executors' outputs and workspace in one critical
// section) charges exactly as one Allocate() per request in order would: the
// same accounting and statistics, the first failure stops it with that
// request's error (the earlier allocations stay held), injected failures by
// purpose hit the same request, and a failure hook still sees every request.
TEST(DevicePoolTest, AllocateEachMatchesOneAllocatePerRequest) {
  using R = DevicePool::Request;
  DevicePool pool(DeviceId(1), "cpu1", Bytes(100));
  {
    const std::vector<R> req = {{Bytes(30), AllocPurpose::kOutput}, {Bytes(40), AllocPurpose::kOutput},
                                {Bytes(0), AllocPurpose::kWorkspace}};
    std::vector<Allocation> out(3);
    ASSERT_TRUE(pool.AllocateEach(req, out).ok());
    EXPECT_EQ(pool.used(), Bytes(70));
    EXPECT_EQ(pool.peak(), Bytes(70));
    EXPECT_EQ(pool.num_allocations(), 3);
    for (const Allocation& a : out) EXPECT_TRUE(a.held());
    // Out of memory at the second request: the first stays charged.
    std::vector<Allocation> more(2);
    const absl::Status st = pool.AllocateEach(std::vector<R>{{Bytes(20)}, {Bytes(20)}}, more);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(st.message()), HasSubstr("20 bytes requested, 10 bytes free"));
    EXPECT_TRUE(more[0].held());
    EXPECT_FALSE(more[1].held());
    EXPECT_EQ(pool.used(), Bytes(90));
    EXPECT_EQ(pool.num_failures(), 1);
    // A slot that already holds an allocation is refused.
    EXPECT_EQ(pool.AllocateEach(std::vector<R>{{Bytes(1)}}, more).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(pool.AllocateEach(std::vector<R>{{Bytes(1)}}, std::span<Allocation>()).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(pool.used(), Bytes(0));
  // An injected workspace failure hits the workspace request, after the outputs.
  pool.FailNextAllocations(1, AllocPurpose::kWorkspace);
  {
    std::vector<Allocation> out(3);
    const absl::Status st = pool.AllocateEach(
        std::vector<R>{{Bytes(5), AllocPurpose::kOutput}, {Bytes(5), AllocPurpose::kOutput},
                       {Bytes(5), AllocPurpose::kWorkspace}},
        out);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(st.message()), HasSubstr("cannot allocate workspace"));
    EXPECT_TRUE(out[0].held() && out[1].held());
    EXPECT_FALSE(out[2].held());
    EXPECT_EQ(pool.used(), Bytes(10));
  }
  EXPECT_EQ(pool.num_failures(), 2);
  // With a hook, every request is put to it (outside the pool's lock).
  std::vector<Bytes> asked;
  {
    std::vector<Allocation> out(3);
    pool.SetFailureHook([&](const AllocationRequest& r) {
      asked.push_back(r.bytes);
      return r.bytes == Bytes(7);
    });
    const absl::Status st = pool.AllocateEach(std::vector<R>{{Bytes(6)}, {Bytes(7)}, {Bytes(8)}}, out);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(asked, (std::vector<Bytes>{Bytes(6), Bytes(7)}));
    EXPECT_TRUE(out[0].held());
    EXPECT_FALSE(out[1].held() || out[2].held());
    EXPECT_EQ(pool.used(), Bytes(6));
  }
  EXPECT_EQ(pool.used(), Bytes(0));
  EXPECT_EQ(pool.num_failures(), 3);
  EXPECT_EQ(pool.num_allocations(), 7);
}

TEST(DevicePoolTest, ThreadSafe) {
  DevicePool pool(DeviceId(0), "cpu0", Bytes(1 << 20));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&pool] {
      for (int i = 0; i < 2000; ++i) {
        auto a = pool.Allocate(Bytes(100));
        ASSERT_TRUE(a.ok());
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(pool.used(), Bytes(0));
  EXPECT_LE(pool.peak(), Bytes(400));
  EXPECT_EQ(pool.num_allocations(), 8000);
}

// ---------------------------------------------------------------------------
// CommGraph

TEST(CommGraphTest, GrantsConflictFreeAndRetriesFailedRecv) {
  CommGraph cg(4);
  ASSERT_TRUE(cg.AddIntent({1, DeviceId(0), DeviceId(1), 0, 10, Bytes(8)}).ok());
  ASSERT_TRUE(cg.AddIntent({2, DeviceId(1), DeviceId(2), 5, 20, Bytes(8)}).ok());
  ASSERT_TRUE(cg.AddIntent({3, DeviceId(2), DeviceId(3), 0, 5, Bytes(8)}).ok());
  EXPECT_FALSE(cg.AddIntent({3, DeviceId(2), DeviceId(3), 0, 5, Bytes(8)}).ok());
  EXPECT_FALSE(cg.AddIntent({4, DeviceId(2), DeviceId(2), 0, 5, Bytes(8)}).ok());
  // Highest priority first (2 takes devices 1 and 2); 1 and 3 conflict with it.
  auto g = cg.Arbitrate();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].id, 2u);
  EXPECT_TRUE(cg.busy(DeviceId(1)) && cg.busy(DeviceId(2)));
  EXPECT_TRUE(cg.Arbitrate().empty());
  // The destination cannot allocate: back to pending, ends freed, retried.
  ASSERT_TRUE(cg.RecvFailed(2).ok());
  EXPECT_EQ(cg.retries(2), 1);
  EXPECT_EQ(cg.num_retrying(), 1u);
  EXPECT_FALSE(cg.busy(DeviceId(1)));
  EXPECT_FALSE(cg.Complete(2).ok());  // not sending
  g = cg.Arbitrate();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].id, 2u);
  EXPECT_EQ(cg.num_retrying(), 0u);
  ASSERT_TRUE(cg.RecvReady(2).ok());
  ASSERT_TRUE(cg.Complete(2).ok());
  g = cg.Arbitrate();  // now 3 (older) and 1 do not conflict
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].id, 3u);
  EXPECT_EQ(g[1].id, 1u);
  ASSERT_TRUE(cg.Abort(1).ok());
  ASSERT_TRUE(cg.RecvReady(3).ok());
  ASSERT_TRUE(cg.Complete(3).ok());
  EXPECT_EQ(cg.size(), 0u);
  for (int d = 0; d < 4; ++d) EXPECT_FALSE(cg.busy(DeviceId(d)));
  EXPECT_EQ(cg.total_retries(), 1);
}

// ---------------------------------------------------------------------------
// ExecutorSet

// (a) + (b): a chain and a diamond on 2-4 devices complete, the GMG's
// invariants hold throughout, and each device runs one operator at a time.
TEST(ExecutorSetTest, ChainsAndDiamondsComplete) {
  for (int devices : {2, 3, 4}) {
    SCOPED_TRACE(devices);
    Rig r(devices);
    r.Start();
    std::mt19937 rng(devices);
    int expected_ops = 0, expected_transfers = 0;
    for (int i = 0; i < 6; ++i) {
      const bool diamond = i % 2 == 1;
      InstanceId inst = r.New(diamond ? r.diamond : r.chain, 64 + i, i % 3);
      std::vector<int> devs(4);
      for (int& d : devs) d = static_cast<int>(rng() % devices);
      r.Place(inst, devs);
      expected_ops += 4;
      if (diamond) {
        // One transfer of a's output per distinct consumer device.
        std::set<int> a_dsts;
        for (int k : {1, 2}) {
          if (devs[k] != devs[0]) a_dsts.insert(devs[k]);
        }
        expected_transfers += static_cast<int>(a_dsts.size()) + (devs[3] != devs[1]) +
                              (devs[3] != devs[2]);
      } else {
        for (int k = 1; k < 4; ++k) expected_transfers += devs[k] != devs[k - 1];
      }
    }
    ASSERT_TRUE(r.Run().ok());
    auto retired = r.g.TakeRetired();
    ASSERT_EQ(retired.size(), 6u);
    for (const RetiredInstance& ri : retired) EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
    EXPECT_EQ(r.exec->completed_ops(), expected_ops);
    EXPECT_EQ(r.exec->completed_transfers(), expected_transfers);
    EXPECT_EQ(r.feedback.size(), static_cast<size_t>(expected_ops + expected_transfers));
    ExpectNoOverlap(r.feedback, Feedback::Kind::kOp, devices);
    ExpectNoOverlap(r.feedback, Feedback::Kind::kTransfer, devices);
    for (const Feedback& f : r.feedback) {
      // Other devices advance the shared clock too: at least the kernel's time.
      if (f.kind == Feedback::Kind::kOp) {
        EXPECT_GE(f.measured(), Duration::Micros(10 + 5 * f.op));
      }
    }
    EXPECT_EQ(r.exec->stored_tensors(), 0u);
    for (int d = 0; d < devices; ++d) {
      EXPECT_EQ(r.exec->pool(DeviceId(d)).used(), Bytes(0));
      EXPECT_EQ(r.g.memory(DeviceId(d)).total(), Bytes(0));
    }
  }
}

// Feedback::handoff: the master's launch gap on every transfer and its
// delivery gap on every operator a transfer fed, measured from the GMG
// times. The owner here takes exactly 50 us (of the manual clock) to react
// to each event, and a chain alternating between two devices has one
// operator or transfer in flight at a time, so every gap is exactly 50 us.
// The owner waits for completions only (WaitForFinish): woken by a start, it
// would advance the shared clock while the kernel runs (the kernels advance
// it too), and could then drain that kernel's finish at the advanced time
// and start the transfer at the instant the producer ended (a 0 gap).
TEST(ExecutorSetTest, FeedbackCarriesTheHandoffGapsOfEachHop) {
  Rig r(2);
  r.Start();
  const InstanceId inst = r.New(r.chain, 64);
  r.Place(inst, {0, 1, 0, 1});
  ASSERT_TRUE(r.exec->Dispatch(r.clock.Now()).ok());
  while (r.g.num_instances() > 0) {
    ASSERT_TRUE(r.exec->WaitForFinish(absl::Seconds(60)));
    r.clock.Advance(Duration::Micros(50));
    ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  }
  ASSERT_EQ(r.feedback.size(), 7u);  // 4 operators, 3 transfers
  int transfers = 0, fed = 0;
  for (const Feedback& f : r.feedback) {
    if (f.kind == Feedback::Kind::kTransfer) {
      ++transfers;
      EXPECT_EQ(f.handoff, Duration::Micros(50)) << "transfer " << f.node;
    } else if (f.op == 0) {
      EXPECT_LT(f.handoff, Duration::Zero()) << "the first operator has no hop";
    } else {
      ++fed;
      EXPECT_EQ(f.handoff, Duration::Micros(50)) << "op " << f.op;
    }
  }
  EXPECT_EQ(transfers, 3);
  EXPECT_EQ(fed, 3);
  // A same-device chain has no hop at all.
  r.feedback.clear();
  r.Place(r.New(r.chain, 64), {1});
  ASSERT_TRUE(r.Run().ok());
  ASSERT_EQ(r.feedback.size(), 4u);
  for (const Feedback& f : r.feedback) EXPECT_LT(f.handoff, Duration::Zero()) << "op " << f.op;
}

// The shared discipline picks among queued operators: online first.
TEST(ExecutorSetTest, OnlineRunsBeforeQueuedOffline) {
  Rig r(1);
  r.Start();
  // Hold the device in its first kernel while the rest queue up.
  absl::Notification entered, release;
  std::atomic<bool> first{true};
  r.kernels.SetHook([&](const KernelCall&) {
    if (first.exchange(false)) {
      entered.Notify();
      release.WaitForNotification();
    }
  });
  InstanceId blocker = r.New(r.chain, 8);
  r.Place(blocker, {0});
  entered.WaitForNotification();
  InstanceId off = r.New(r.chain, 8, 0, PriorityClass::kOffline);
  r.Place(off, {0});
  InstanceId on = r.New(r.chain, 8, 0, PriorityClass::kOnline);
  r.Place(on, {0});
  release.Notify();
  ASSERT_TRUE(r.Run().ok());
  Timestamp on_first, off_first;
  for (const Feedback& f : r.feedback) {
    if (f.op == 0 && f.instance == on) on_first = f.start;
    if (f.op == 0 && f.instance == off) off_first = f.start;
  }
  EXPECT_LT(on_first, off_first);
}

// The queue discipline on a device holding several same-device chains (the
// overhead harness's prefills in flight). With equal priorities it runs
// operators in the order they became ready: the chains advance in lockstep
// and finish together, so a master that refills on completion finds the
// device empty. Ranked first-come first-served (each instance one priority
// below the one before), the device runs the oldest chain to its end before
// the next one starts, as a direct loop does.
TEST(ExecutorSetTest, FirstComeFirstServedPrioritiesRunChainsOneAfterAnother) {
  for (const bool fcfs : {false, true}) {
    SCOPED_TRACE(fcfs ? "first come, first served" : "equal priorities");
    Rig r(1);
    r.Start();
    absl::Notification entered, release;
    std::atomic<bool> first{true};
    absl::Mutex mu;
    std::vector<std::pair<InstanceId, int>> order;  // (instance, op) as run
    r.kernels.SetHook([&](const KernelCall& c) {
      {
        absl::MutexLock l(&mu);
        order.push_back({c.instance, c.op_index});
      }
      if (first.exchange(false)) {
        entered.Notify();
        release.WaitForNotification();
      }
    });
    // A blocker (ranked first) holds the device while three chains queue.
    InstanceId blocker = r.New(r.chain, 8, 1);
    r.Place(blocker, {0});
    entered.WaitForNotification();
    std::vector<InstanceId> chains;
    for (int i = 0; i < 3; ++i) {
      chains.push_back(r.New(r.chain, 8, fcfs ? -i : 0));
      r.Place(chains.back(), {0});
    }
    release.Notify();
    ASSERT_TRUE(r.Run().ok());
    std::vector<std::pair<InstanceId, int>> got, want;
    {
      absl::MutexLock l(&mu);
      for (const auto& e : order) {
        if (e.first != blocker) got.push_back(e);
      }
    }
    if (fcfs) {
      for (InstanceId c : chains) {
        for (int op = 0; op < 4; ++op) want.push_back({c, op});
      }
    } else {
      for (int op = 0; op < 4; ++op) {
        for (InstanceId c : chains) want.push_back({c, op});
      }
    }
    EXPECT_EQ(got, want);
  }
}

// (c) Deadlock freedom: thousands of random cross-device transfers with
// random priorities on 8 devices, a third of the Recv allocations failing.
TEST(ExecutorSetTest, RandomTransfersWithRecvFailuresAllComplete) {
  Watchdog watchdog(absl::Minutes(5));
  constexpr int kDevices = 8, kPairs = 2500;
  Rig r(kDevices);
  TemplateBuilder b("pair");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("p", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("c", OpKind::kGeneric).Inputs({"p"}).Output("y", DType::kF32, {"1"});
  const TemplateId pair = *r.g.RegisterTemplate(*b.Build());
  r.Start();
  std::mt19937 hook_rng(7);
  std::atomic<int64_t> injected{0};
  for (int d = 0; d < kDevices; ++d) {
    r.exec->pool(DeviceId(d)).SetFailureHook([&](const AllocationRequest& q) {
      // Recv allocations happen on the owner thread only.
      if (q.purpose != AllocPurpose::kRecv || hook_rng() % 3 != 0) return false;
      ++injected;
      return true;
    });
  }
  std::mt19937 rng(11);
  for (int i = 0; i < kPairs; ++i) {
    const int a = static_cast<int>(rng() % kDevices);
    int c = static_cast<int>(rng() % (kDevices - 1));
    if (c >= a) ++c;
    InstanceId inst = r.New(pair, 16 + static_cast<int64_t>(rng() % 64));
    const int prio = static_cast<int>(rng() % 200) - 100;
    r.Place(inst, {a, c}, TransferPriority(static_cast<uint8_t>(rng() % 2), prio));
    if (i % 100 == 0) {  // keep some transfers arriving while others run
      std::vector<Feedback> fb;
      ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
    }
  }
  ASSERT_TRUE(r.Run(/*verify=*/false).ok());
  ASSERT_TRUE(r.g.VerifyInvariants().ok());
  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), static_cast<size_t>(kPairs));
  for (const RetiredInstance& ri : retired) ASSERT_EQ(ri.state, InstanceState::kDone) << ri.failure;
  EXPECT_EQ(r.exec->completed_transfers(), kPairs);
  EXPECT_GT(r.exec->comm().total_retries(), 0);
  EXPECT_EQ(r.exec->comm().total_retries(), injected.load());
  ExpectNoOverlap(r.feedback, Feedback::Kind::kTransfer, kDevices);
  ExpectNoOverlap(r.feedback, Feedback::Kind::kOp, kDevices);
  for (int d = 0; d < kDevices; ++d) EXPECT_EQ(r.exec->pool(DeviceId(d)).used(), Bytes(0));
}

// (d) Faults: each failing instance ends failed with a reason; the others
// complete; every pool returns to its baseline.
TEST(ExecutorSetTest, FaultsFailOnlyTheirInstanceAndLeakNothing) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(5);
  r.Start();
  std::vector<Bytes> baseline;
  for (int d = 0; d < 5; ++d) baseline.push_back(r.exec->pool(DeviceId(d)).used());
  const std::vector<int> spread = {0, 1, 2, 3};
  InstanceId ok1 = r.New(r.chain, 32);
  InstanceId thrower = r.New(r.chain, 33);
  InstanceId erring = r.New(r.diamond, 34);
  InstanceId oom = r.New(r.chain, 777);  // its outputs are 3108 bytes
  InstanceId ok2 = r.New(r.diamond, 35);
  InstanceId on_stopped_running = r.New(r.chain, 36);
  InstanceId on_stopped_queued = r.New(r.chain, 37);
  const NodeId throws_at = r.g.FindInstance(thrower)->nodes[1].id;
  const NodeId errs_at = r.g.FindInstance(erring)->nodes[2].id;
  const NodeId blocks_at = r.g.FindInstance(on_stopped_running)->nodes[0].id;
  r.kernels.ThrowWhen([=](const KernelCall& c) { return c.node == throws_at; }, "boom");
  r.kernels.FailWhen([=](const KernelCall& c) { return c.node == errs_at; },
                     absl::DataLossError("checksum mismatch"));
  for (int d = 0; d < 4; ++d) {
    r.exec->pool(DeviceId(d)).SetFailureHook([](const AllocationRequest& q) {
      return q.purpose == AllocPurpose::kOutput && q.bytes == Bytes(3108);
    });
  }
  absl::Notification entered, release;
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node == blocks_at) {
      entered.Notify();
      release.WaitForNotification();
    }
  });
  for (InstanceId i : {ok1, thrower, erring, oom, ok2}) r.Place(i, spread);
  r.Place(on_stopped_running, {4});
  r.Place(on_stopped_queued, {4});
  entered.WaitForNotification();
  r.exec->StopDevice(DeviceId(4));
  release.Notify();
  ASSERT_TRUE(r.Run().ok());
  std::map<uint64_t, RetiredInstance> by_id;
  for (RetiredInstance& ri : r.g.TakeRetired()) by_id[ri.id.value()] = ri;
  ASSERT_EQ(by_id.size(), 7u);
  EXPECT_EQ(by_id[ok1.value()].state, InstanceState::kDone);
  EXPECT_EQ(by_id[ok2.value()].state, InstanceState::kDone);
  auto expect_failed = [&](InstanceId i, const char* why) {
    const RetiredInstance& ri = by_id[i.value()];
    EXPECT_EQ(ri.state, InstanceState::kFailed) << i;
    EXPECT_THAT(ri.failure, HasSubstr(why)) << i;
  };
  expect_failed(thrower, "kernel threw: boom");
  expect_failed(erring, "checksum mismatch");
  expect_failed(oom, "memory allocation failed");
  expect_failed(on_stopped_running, "stopped while the node ran");
  expect_failed(on_stopped_queued, "stopped before node");
  EXPECT_TRUE(r.exec->device_stopped(DeviceId(4)));
  EXPECT_EQ(r.exec->failed_nodes(), 5);
  // A new node for the stopped device fails at once instead of hanging.
  InstanceId late = r.New(r.chain, 40);
  r.Place(late, {4});
  ASSERT_TRUE(r.Run().ok());
  auto late_ret = r.g.TakeRetired();
  ASSERT_EQ(late_ret.size(), 1u);
  EXPECT_EQ(late_ret[0].state, InstanceState::kFailed);
  EXPECT_THAT(late_ret[0].failure, HasSubstr("is stopped"));
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  for (int d = 0; d < 5; ++d) EXPECT_EQ(r.exec->pool(DeviceId(d)).used(), baseline[d]) << d;
}

// A failing Send fails its instance; Recv failures alone never do.
TEST(ExecutorSetTest, FailedSendFailsTheInstance) {
  Rig r(2);
  r.Start();
  InstanceId inst = r.New(r.chain, 16);
  r.host.FailWhen([](const TransferCall&) { return true; }, absl::UnavailableError("link down"));
  r.Place(inst, {0, 1});
  ASSERT_TRUE(r.Run().ok());
  auto ret = r.g.TakeRetired();
  ASSERT_EQ(ret.size(), 1u);
  EXPECT_EQ(ret[0].state, InstanceState::kFailed);
  EXPECT_THAT(ret[0].failure, HasSubstr("link down"));
  for (int d = 0; d < 2; ++d) EXPECT_EQ(r.exec->pool(DeviceId(d)).used(), Bytes(0));
}

// Host payloads move through the host transfer backend.
TEST(ExecutorSetTest, HostPayloadsReachTheConsumer) {
  Rig r(2);
  r.Start();
  std::atomic<int> seen{0};
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.op_index == 0) {
      auto hb = std::make_shared<HostBytes>();
      hb->data.assign(static_cast<size_t>(c.outputs[0].bytes.count()), std::byte{42});
      c.outputs[0].kind = kHostBytesPayload;
      c.outputs[0].payload = hb;
    } else if (c.op_index == 1) {
      ASSERT_EQ(c.inputs[0].kind, kHostBytesPayload);
      const auto* hb = static_cast<const HostBytes*>(c.inputs[0].payload.get());
      ASSERT_NE(hb, nullptr);
      EXPECT_EQ(hb->data.size(), static_cast<size_t>(c.inputs[0].bytes.count()));
      EXPECT_EQ(hb->data.front(), std::byte{42});
      EXPECT_EQ(c.device, DeviceId(1));
      ++seen;
    }
  });
  r.Place(r.New(r.chain, 16), {0, 1});
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(seen.load(), 1);
}

// (e) Snapshot equivalence: paused at several instants of a run on 4
// devices, the GMG snapshot names the same running node on every device as
// the executors do.
TEST(ExecutorSetTest, SnapshotMatchesWhatRuns) {
  Watchdog watchdog(absl::Minutes(2));
  SteadyClock steady;
  GlobalMappingGraph g(Devices(4));
  const TemplateId chain = *g.RegisterTemplate(Chain(4));
  SpinSleeper spin(&steady);
  EmulatedKernelRunner kernels([](const KernelCall& c) { return Duration::Micros(200 + 50 * c.op_index); },
                               &spin);
  HostTransferBackend host;
  ExecutorSet exec(&g, &steady, &kernels, &host);
  // One deterministic instant: the first instance's first operator is held
  // inside its kernel, so the GMG must show it running there. (The hook is
  // installed before anything is issued.)
  NodeId held;
  DeviceId held_on;
  absl::Notification entered, release;
  kernels.SetHook([&](const KernelCall& c) {
    if (c.node == held) {
      entered.Notify();
      release.WaitForNotification();
    }
  });
  std::mt19937 rng(5);
  for (int i = 0; i < 24; ++i) {
    InstanceSpec s;
    s.template_id = chain;
    s.bindings = {{"N", 128}};
    s.priority = i % 4;
    s.arrival = steady.Now();
    const InstanceId inst = *g.Instantiate(s);
    std::vector<NodePlacement> p;
    for (int op = 0; op < 4; ++op) {
      p.push_back({g.FindInstance(inst)->nodes[op].id, DeviceId(static_cast<uint16_t>(rng() % 4))});
    }
    if (i == 0) {
      held = p[0].node;
      held_on = p[0].device;
    }
    auto issued = IssuePlacements(g, p, 0, steady.Now());
    ASSERT_TRUE(issued.ok());
    for (NodeId n : *issued) exec.NodeIssued(n);
  }
  std::vector<Feedback> fb;
  ASSERT_TRUE(exec.Dispatch(steady.Now()).ok());
  entered.WaitForNotification();
  exec.Pause();
  ASSERT_TRUE(exec.AdvanceTo(steady.Now(), &fb).ok());
  EXPECT_EQ(exec.RunningNow()[held_on.value()], held);
  EXPECT_EQ(g.running_compute(held_on), held);
  {
    const GmgSnapshot snap = g.Snapshot(steady.Now());
    const uint32_t idx = snap.devices[held_on.value()].running;
    ASSERT_NE(idx, GmgSnapshot::kNone);
    EXPECT_EQ(NodeId(snap.nodes[idx].id), held);
  }
  exec.Resume();
  release.Notify();
  int steps = 0, instants = 0;
  while (g.num_instances() > 0) {
    ASSERT_TRUE(exec.WaitForCompletion(absl::Seconds(60)));
    ASSERT_TRUE(exec.AdvanceTo(steady.Now(), &fb).ok());
    if (++steps % 4 != 0) continue;
    exec.Pause();
    ASSERT_TRUE(exec.AdvanceTo(steady.Now(), &fb).ok());
    const GmgSnapshot snap = g.Snapshot(steady.Now());
    const std::vector<NodeId> running = exec.RunningNow();
    ASSERT_EQ(running.size(), snap.devices.size());
    for (size_t d = 0; d < running.size(); ++d) {
      const uint32_t idx = snap.devices[d].running;
      const NodeId in_snapshot = idx == GmgSnapshot::kNone ? NodeId() : NodeId(snap.nodes[idx].id);
      EXPECT_EQ(in_snapshot, running[d]) << "device " << d << " at step " << steps;
      EXPECT_EQ(g.running_compute(DeviceId(static_cast<uint16_t>(d))), running[d]);
    }
    ++instants;
    exec.Resume();
  }
  EXPECT_GT(instants, 3);
  ExpectNoOverlap(fb, Feedback::Kind::kOp, 4);
  EXPECT_EQ(exec.completed_ops(), 24 * 4);
}


// The local-successor fast path under snapshots: same-device chains on 4
// devices run operator after operator without the ReadyQueue and without a
// start record of their own (one record per operator), while the owner takes
// snapshots at five deterministic instants, each with an operator inside a
// chain (reached through the fast path) held in its kernel, and then after
// every record it is woken for. At each instant, after Pause() and
// AdvanceTo(now), the simulator's reconstruction from the GMG snapshot names
// the operator each device runs and the tensors the executors hold. Without
// the starts applied from the devices' running state the held operators
// would not be running in the GMG.
TEST(ExecutorSetTest, SnapshotsWhileChainsRunThroughTheFastPath) {
  Watchdog watchdog(absl::Minutes(2));
  constexpr int kLen = 8, kDevices = 4, kChains = 8;
  SteadyClock steady;
  GlobalMappingGraph g(Devices(kDevices));
  const TemplateId chain = *g.RegisterTemplate(Chain(kLen));
  SpinSleeper spin(&steady);
  EmulatedKernelRunner kernels([](const KernelCall& c) { return Duration::Micros(100 + 20 * c.op_index); },
                               &spin);
  HostTransferBackend host;
  ExecutorSet exec(&g, &steady, &kernels, &host);
  OpEstimator op_est;
  TransferEstimator xfer_est(g.accelerators());
  SimContext ctx(&g.templates(), &op_est, &xfer_est);
  // No kernel runs before every chain is handed over (so the counts below
  // do not depend on how fast the owner issues).
  struct Hold {
    int chain, op;
    NodeId node;
    absl::Notification entered, release;
  };
  // In the order each device reaches them (chains 0 and 4 share device 0,
  // 1 and 5 device 1; the lower chain index runs first).
  Hold holds[] = {{0, 5, {}, {}, {}}, {1, 3, {}, {}, {}}, {2, 7, {}, {}, {}}, {5, 1, {}, {}, {}}, {4, 4, {}, {}, {}}};
  absl::Notification issued_all;
  kernels.SetHook([&](const KernelCall& c) {
    issued_all.WaitForNotification();
    for (Hold& h : holds) {
      if (c.node == h.node) {
        h.entered.Notify();
        h.release.WaitForNotification();
      }
    }
  });
  std::vector<Feedback> fb;
  int instants = 0;
  auto check = [&](const std::string& where) {
    std::set<StoredBuf> stored;
    ExpectReconstructionMatches(exec, g, ctx, steady, &fb, where, &stored);
    for (size_t d = 0; d < kDevices; ++d) {
      EXPECT_EQ(g.running_compute(DeviceId(static_cast<uint16_t>(d))), exec.RunningNow()[d]) << where;
    }
    ++instants;
    exec.Resume();
  };
  std::vector<InstanceId> ids;
  for (int i = 0; i < kChains; ++i) {
    InstanceSpec s;
    s.template_id = chain;
    s.bindings = {{"N", 64}};
    s.priority = -i;  // first come, first served
    s.arrival = steady.Now();
    ids.push_back(*g.Instantiate(s));
  }
  for (Hold& h : holds) h.node = g.FindInstance(ids[h.chain])->nodes[h.op].id;
  for (int i = 0; i < kChains; ++i) {
    std::vector<NodePlacement> p;
    for (int op = 0; op < kLen; ++op) {
      p.push_back({g.FindInstance(ids[i])->nodes[op].id, DeviceId(static_cast<uint16_t>(i % kDevices))});
    }
    auto issued = IssuePlacements(g, p, 0, steady.Now());
    ASSERT_TRUE(issued.ok()) << issued.status();
    for (NodeId n : *issued) exec.NodeIssued(n);
  }
  ASSERT_TRUE(exec.Dispatch(steady.Now()).ok());
  issued_all.Notify();
  for (Hold& h : holds) {
    const std::string where = StrCat("with chain ", h.chain, " op ", h.op, " held in its kernel");
    h.entered.WaitForNotification();
    check(where);
    EXPECT_EQ(g.running_compute(DeviceId(static_cast<uint16_t>(h.chain % kDevices))), h.node) << where;
    for (int op = 0; op < h.op; ++op) {
      EXPECT_EQ(g.FindInstance(ids[h.chain])->nodes[op].state, NodeState::kDone) << where << ": op " << op;
    }
    h.release.Notify();
  }
  EXPECT_GE(exec.fast_path_ops(), 5 + 3 + 7 + 1 + 4) << "the held operators came through the fast path";
  while (g.num_instances() > 0) {
    ASSERT_TRUE(exec.WaitForCompletion(absl::Seconds(60)));
    check("after a record");
  }
  EXPECT_GT(instants, 5);
  ExpectNoOverlap(fb, Feedback::Kind::kOp, kDevices);
  EXPECT_EQ(exec.completed_ops(), kChains * kLen);
  // Every operator but each chain's first is a local successor that the
  // discipline picks next (chains are ranked first come, first served).
  EXPECT_EQ(exec.fast_path_ops(), kChains * (kLen - 1));
  // Program order per chain, as the GMG recorded it.
  std::map<std::pair<uint64_t, int>, const Feedback*> by_op;
  for (const Feedback& f : fb) by_op[{f.instance.value(), f.op}] = &f;
  for (InstanceId id : ids) {
    for (int op = 1; op < kLen; ++op) {
      const auto prev = by_op.find({id.value(), op - 1}), cur = by_op.find({id.value(), op});
      ASSERT_NE(prev, by_op.end());
      ASSERT_NE(cur, by_op.end());
      EXPECT_LE(prev->second->end, cur->second->start);
    }
  }
  EXPECT_EQ(exec.stored_tensors(), 0u);
}

// The fast path never skips the queue discipline: an operator of a
// higher-priority instance queued while a chain's operator runs wins the
// next operator boundary over that operator's local successor, which then
// waits in the ReadyQueue; the rest of the chain goes through the fast path.
TEST(ExecutorSetTest, HigherPriorityArrivalWinsTheNextOperatorBoundary) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  const TemplateId one = *r.g.RegisterTemplate(Chain(1));
  r.Start();
  const InstanceId low = r.New(r.chain, 8, /*prio=*/0);
  const InstanceId high = r.New(one, 8, /*prio=*/5);
  const NodeId low0 = r.g.FindInstance(low)->nodes[0].id;
  absl::Notification entered, release;
  absl::Mutex mu;
  std::vector<std::pair<InstanceId, int>> order;
  r.kernels.SetHook([&](const KernelCall& c) {
    {
      absl::MutexLock l(&mu);
      order.push_back({c.instance, c.op_index});
    }
    if (c.node == low0) {
      entered.Notify();
      release.WaitForNotification();
    }
  });
  r.Place(low, {0});  // the whole chain is handed over; op0 runs
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  r.Place(high, {0});
  release.Notify();
  ASSERT_TRUE(r.Run().ok());
  const std::vector<std::pair<InstanceId, int>> want = {
      {low, 0}, {high, 0}, {low, 1}, {low, 2}, {low, 3}};
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(order, want);
  }
  EXPECT_EQ(r.exec->fast_path_ops(), 2);  // low op2 and op3
  for (const RetiredInstance& ri : r.g.TakeRetired()) EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
}

// A device runs its work item in place, without the lock (see
// DeviceState::items): the owner handing the device many more items while one
// runs must not move it. The running kernel's call (its attribute span points
// into the item) reads the same after 64 more instances were queued behind
// it, and every node, the running one included, finishes as itself.
TEST(ExecutorSetTest, ARunningItemStaysPutWhileTheOwnerQueuesMore) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  TemplateBuilder b("attr1");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("op0", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"}).Attr("n3", "N*3");
  const TemplateId one = *r.g.RegisterTemplate(*b.Build());
  r.Start();
  const InstanceId first = r.New(one, 8);
  const NodeId first0 = r.g.FindInstance(first)->nodes[0].id;
  absl::Notification entered, release;
  std::vector<int64_t> before, after;
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node != first0) return;
    before.assign(c.attrs.begin(), c.attrs.end());
    entered.Notify();
    release.WaitForNotification();
    after.assign(c.attrs.begin(), c.attrs.end());
  });
  r.Place(first, {0});
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  for (int i = 0; i < 64; ++i) r.Place(r.New(one, 16 + i), {0});
  release.Notify();
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(before, std::vector<int64_t>{24});  // N*3
  EXPECT_EQ(after, before);
  const std::vector<RetiredInstance> retired = r.g.TakeRetired();
  EXPECT_EQ(retired.size(), 65u);
  for (const RetiredInstance& ri : retired) EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes::Zero());
}

// A start stamped after the time the owner drains to (the device began
// between the owner reading its clock and taking the lock) is not applied by
// that drain, so it stays an event: the next WaitForCompletion() returns for
// it instead of sleeping while the operator runs, and the next drain applies
// it. (Otherwise a caller that holds an operator in its kernel until the
// GMG shows it running waits forever.)
TEST(ExecutorSetTest, AStartAfterTheDrainTimeStaysAnEvent) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  r.Start();
  const InstanceId inst = r.New(r.chain, 8);
  const NodeId op0 = r.g.FindInstance(inst)->nodes[0].id;
  absl::Notification entered, release;
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node != op0) return;
    entered.Notify();
    release.WaitForNotification();
  });
  absl::Cleanup let_go = [&release] {
    if (!release.HasBeenNotified()) release.Notify();
  };
  const Timestamp drained_to = r.clock.Now();
  r.clock.Advance(Duration::Millis(1));
  r.Place(inst, {0});
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(r.exec->AdvanceTo(drained_to, &r.feedback).ok());
  EXPECT_EQ(r.g.FindNode(op0)->state, NodeState::kIssued);
  EXPECT_TRUE(r.exec->WaitForCompletion(absl::Seconds(5)));
  ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  EXPECT_EQ(r.g.FindNode(op0)->state, NodeState::kRunning);
  // Applied: no event is left until the kernel ends.
  EXPECT_FALSE(r.exec->WaitForCompletion(absl::ZeroDuration()));
  release.Notify();
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(r.exec->completed_ops(), 4);
}

// Local readiness: a chain (and a diamond) on one device runs to its last
// operator while the owner applies nothing: the device starts operator k+1
// without waiting for the owner to apply operator k's completion. The GMG
// then learns the same history in one drain.
TEST(ExecutorSetTest, SameDeviceChainRunsWithoutTheOwner) {
  Watchdog watchdog(absl::Minutes(2));
  constexpr int kLen = 16;
  Rig r(1);
  const TemplateId chain = *r.g.RegisterTemplate(Chain(kLen));
  r.Start();
  InstanceId c = r.New(chain, 32);
  InstanceId d = r.New(r.diamond, 32);
  const NodeId c_last = r.g.FindInstance(c)->nodes[kLen - 1].id;
  const NodeId d_last = r.g.FindInstance(d)->nodes[3].id;
  absl::Notification c_done, d_done;
  r.kernels.SetHook([&](const KernelCall& k) {
    if (k.node == c_last) c_done.Notify();
    if (k.node == d_last) d_done.Notify();
  });
  r.Place(c, {0});
  r.Place(d, {0});
  // No AdvanceTo/Dispatch yet: only the device threads make progress.
  ASSERT_TRUE(c_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(d_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(r.exec->completed_ops(), 0);
  ASSERT_TRUE(r.Run().ok());
  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), 2u);
  for (const RetiredInstance& ri : retired) EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
  EXPECT_EQ(r.exec->completed_ops(), kLen + 4);
  ASSERT_EQ(r.feedback.size(), static_cast<size_t>(kLen + 4));
  ExpectNoOverlap(r.feedback, Feedback::Kind::kOp, 1);
  // Program order within the chain, as the GMG recorded it.
  std::vector<const Feedback*> ops(kLen, nullptr);
  for (const Feedback& f : r.feedback) {
    if (f.instance == c) ops[f.op] = &f;
  }
  for (int k = 1; k < kLen; ++k) {
    ASSERT_NE(ops[k], nullptr);
    EXPECT_LE(ops[k - 1]->end, ops[k]->start) << k;
  }
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
  EXPECT_EQ(r.g.memory(DeviceId(0)).total(), Bytes(0));
}

// WaitForFinishBatch returns once `min_completions` completions the owner
// must apply are pending, or earlier when fewer are and the devices have
// nothing left to run (so a batch larger than what is in flight cannot
// hang), with a napping owner (the default) and with one woken for every
// completion (owner_nap 0). With nothing in flight the waits time out.
TEST(ExecutorSetTest, BatchedWaitsReturnForPendingCompletions) {
  Watchdog watchdog(absl::Minutes(2));
  for (const absl::Duration nap : {ExecutorOptions::kDefaultOwnerNap, absl::ZeroDuration()}) {
    SCOPED_TRACE(absl::FormatDuration(nap));
    Rig r(1);
    ExecutorOptions o;
    o.owner_nap = nap;
    r.Start(o);
    // Drives the executors with `wait` until every instance retired.
    auto drive = [&](const std::function<bool()>& wait) {
      size_t retired = 0;
      while (r.g.num_instances() > 0) {
        ASSERT_TRUE(wait()) << "a wait timed out with " << r.g.num_instances() << " instances in flight";
        ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
        ASSERT_TRUE(r.g.VerifyInvariants().ok());
        for (const RetiredInstance& ri : r.g.TakeRetired()) {
          EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
          ++retired;
        }
      }
      EXPECT_GT(retired, 0u);
    };
    // Two chains of 4 on one device, retired in batches of 2.
    r.Place(r.New(r.chain, 8), {0});
    r.Place(r.New(r.chain, 8), {0});
    drive([&] { return r.exec->WaitForFinishBatch(absl::Seconds(60), 2); });
    // One chain, batches of 3: more than will ever be pending at once.
    r.Place(r.New(r.chain, 8), {0});
    drive([&] { return r.exec->WaitForFinishBatch(absl::Seconds(60), 3); });
    r.Place(r.New(r.chain, 8), {0});
    drive([&] { return r.exec->WaitForFinish(absl::Seconds(60)); });
    // Nothing in flight: the waits time out.
    EXPECT_FALSE(r.exec->WaitForFinishBatch(absl::Milliseconds(1), 2));
    EXPECT_FALSE(r.exec->WaitForFinish(absl::Milliseconds(1)));
    EXPECT_EQ(r.exec->completed_ops(), 16);
    EXPECT_EQ(r.exec->stored_tensors(), 0u);
    EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
  }
}

// Pins the calling thread to `cpu` for its scope (restores its mask after).
class PinnedThread {
 public:
  explicit PinnedThread(int cpu) {
    ok_ = pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_) == 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    ok_ = ok_ && pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
  }
  ~PinnedThread() { (void)pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_); }
  bool ok() const { return ok_; }

 private:
  cpu_set_t saved_;
  bool ok_ = false;
};

// The owner (this thread, on CPU 0) and the device thread (pinned to
// `device_cpu`): when they run on different CPUs a napping owner (see
// "Owner waits" in executor.h) is not woken by a completion while its
// device goes on with queued work: A's completion leaves B queued, so the
// owner sleeps on (its nap here outlasts the test) and learns of A with B.
// B's completion leaves the device idle, which does wake it: one wake for
// two completions, and no wait for the nap. Beside the device (the same
// CPU), or with owner_nap 0 (no naps), the owner blocks and A
// wakes it. A helper thread releases the kernels once the owner sleeps;
// nothing waits on time.
TEST(ExecutorSetTest, NappingOwnerIsWokenWhenTheDeviceGoesIdleNotPerCompletion) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  Watchdog watchdog(absl::Minutes(2));
  struct Case {
    absl::Duration nap;
    int device_cpu;
    bool naps;
  };
  for (const Case c : {Case{absl::Minutes(10), 1, true}, Case{absl::ZeroDuration(), 1, false},
                       Case{absl::Minutes(10), 0, false}}) {
    SCOPED_TRACE(StrCat("nap ", absl::FormatDuration(c.nap), ", device on CPU ", c.device_cpu));
    PinnedThread pin(0);
    ASSERT_TRUE(pin.ok());
    Rig r(1);
    ExecutorOptions o;
    o.owner_nap = c.nap;
    o.device_cpus = {c.device_cpu};
    r.Start(o);
    const TemplateId single = *r.g.RegisterTemplate(Chain(1));
    const InstanceId a = r.New(single, 8, /*prio=*/1), b = r.New(single, 8, /*prio=*/0);
    absl::Notification a_entered, release_a, b_entered, release_b;
    r.kernels.SetHook([&](const KernelCall& k) {
      if (k.instance == a) {
        a_entered.Notify();
        release_a.WaitForNotification();
      }
      if (k.instance == b) {
        b_entered.Notify();
        release_b.WaitForNotification();
      }
    });
    int64_t wakes_after_a = -1;
    bool napping = false, asleep_after_a = false;
    std::thread helper([&] {
      while (!r.exec->owner_asleep()) std::this_thread::yield();
      napping = r.exec->owner_napping();
      release_a.Notify();
      b_entered.WaitForNotification();  // A's completion is posted: B runs after it
      wakes_after_a = r.exec->owner_wakes();
      asleep_after_a = r.exec->owner_asleep();
      release_b.Notify();
    });
    r.Place(a, {0});
    r.Place(b, {0});
    a_entered.WaitForNotification();  // the device has published its CPU
    std::vector<size_t> retired_per_wait;
    while (r.g.num_instances() > 0) {
      ASSERT_TRUE(r.exec->WaitForFinish(absl::Seconds(60)));
      ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
      retired_per_wait.push_back(r.g.TakeRetired().size());
    }
    helper.join();
    EXPECT_EQ(napping, c.naps);
    if (c.naps) {
      EXPECT_EQ(wakes_after_a, 0) << "A's completion woke the owner while B was queued";
      EXPECT_TRUE(asleep_after_a);
      EXPECT_EQ(r.exec->owner_wakes(), 1) << "the device going idle must wake the owner";
      EXPECT_THAT(retired_per_wait, ::testing::ElementsAre(2u));
    } else {
      EXPECT_EQ(wakes_after_a, 1);  // (B may then finish before the owner sleeps again)
    }
  }
}

// WaitForFinishBatch's `spin`: an owner that would nap (on CPU 0, its
// device thread on CPU 1) polls instead, so the completion it waits for is
// seen without a wake (owner_wakes stays 0; napping, the device going idle
// would wake it: see the test above); beside the device (both on CPU 0) it
// blocks and is woken as without a spin. Either way the wait returns true
// with the completion pending and the instance retires. A helper thread
// releases the kernel once the owner waits; nothing waits on time.
TEST(ExecutorSetTest, SpinningOwnerPollsInsteadOfNappingButNotBesideTheDevice) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  Watchdog watchdog(absl::Minutes(2));
  for (const int device_cpu : {1, 0}) {
    SCOPED_TRACE(StrCat("device on CPU ", device_cpu));
    PinnedThread pin(0);
    ASSERT_TRUE(pin.ok());
    Rig r(1);
    ExecutorOptions o;
    o.owner_nap = absl::Minutes(10);  // a nap outlasts the test
    o.device_cpus = {device_cpu};
    r.Start(o);
    const TemplateId single = *r.g.RegisterTemplate(Chain(1));
    const InstanceId a = r.New(single, 8);
    absl::Notification entered, release;
    r.kernels.SetHook([&](const KernelCall& k) {
      if (k.instance != a) return;
      entered.Notify();
      release.WaitForNotification();
    });
    std::thread helper([&] {
      entered.WaitForNotification();  // the device has published its CPU
      // Released once the owner waits (polling, or asleep beside the device).
      while (!r.exec->owner_waiting() || (device_cpu == 0 && !r.exec->owner_asleep())) std::this_thread::yield();
      release.Notify();
    });
    r.Place(a, {0});
    entered.WaitForNotification();
    ASSERT_TRUE(r.exec->WaitForFinishBatch(absl::Seconds(60), 1, absl::Minutes(10)));
    helper.join();
    ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
    const std::vector<RetiredInstance> retired = r.g.TakeRetired();
    ASSERT_EQ(retired.size(), 1u);
    EXPECT_EQ(retired[0].state, InstanceState::kDone) << retired[0].failure;
    EXPECT_EQ(r.exec->owner_wakes(), device_cpu == 1 ? 0 : 1);
    // Nothing in flight: the spin does not outlast the timeout.
    EXPECT_FALSE(r.exec->WaitForFinishBatch(absl::Milliseconds(1), 1, absl::Minutes(10)));
    EXPECT_EQ(r.exec->stored_tensors(), 0u);
  }
}

// A completion whose successor leaves the device (a transfer to another
// device) needs the owner at once, even though its device goes on with
// other work: the devices do not pass work to each other. X = op0 on cpu0
// -> op1 on cpu1; Y runs on cpu0 after op0 and blocks there until the owner
// has started the transfer, which it can do only if op0's completion woke
// it (the owner naps, apart from the device threads, and its nap outlasts
// the test).
TEST(ExecutorSetTest, NappingOwnerIsWokenForACompletionThatFeedsAnotherDevice) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  Watchdog watchdog(absl::Minutes(2));
  PinnedThread pin(0);
  ASSERT_TRUE(pin.ok());
  Rig r(2);
  ExecutorOptions o;
  o.owner_nap = absl::Minutes(10);
  o.device_cpus = {1, 1};
  r.Start(o);
  const TemplateId two = *r.g.RegisterTemplate(Chain(2));
  const TemplateId single = *r.g.RegisterTemplate(Chain(1));
  const InstanceId x = r.New(two, 8, /*prio=*/1), y = r.New(single, 8, /*prio=*/0);
  absl::Notification x0_entered, release_x0, y_entered, release_y;
  r.kernels.SetHook([&](const KernelCall& k) {
    if (k.instance == x && k.op_index == 0) {
      x0_entered.Notify();
      release_x0.WaitForNotification();
    }
    if (k.instance == y) {
      y_entered.Notify();
      release_y.WaitForNotification();
    }
  });
  std::thread helper([&] {
    while (!r.exec->owner_asleep()) std::this_thread::yield();
    EXPECT_TRUE(r.exec->owner_napping());
    release_x0.Notify();
  });
  r.Place(x, {0, 1});
  r.Place(y, {0});
  ASSERT_TRUE(r.exec->Dispatch(r.clock.Now()).ok());
  x0_entered.WaitForNotification();
  // op0's completion (cpu0 then busy with y) must end this wait.
  ASSERT_TRUE(r.exec->WaitForFinish(absl::Seconds(30)));
  helper.join();
  EXPECT_EQ(r.exec->owner_wakes(), 1) << "op0's completion did not wake the owner";
  ASSERT_TRUE(y_entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  // x's transfer and op1 run while y still holds cpu0.
  while (r.g.FindInstance(x) != nullptr) {
    ASSERT_TRUE(r.exec->WaitForFinish(absl::Seconds(30)));
    ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  }
  release_y.Notify();
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(r.exec->completed_ops(), 3);
  EXPECT_EQ(r.exec->completed_transfers(), 1);
}

// A device thread that drops a cancelled node (its instance failed while the
// node was queued) posts no event. When that leaves the device without work,
// an owner in WaitForFinishBatch waiting for more completions than will come
// must still be woken: the device signals it before it waits for work
// (MaybeWakeOwner). Without that the wait below would last its 10 minutes and
// the watchdog would fail the test.
TEST(ExecutorSetTest, BatchedWaitWakesWhenADroppedNodeLeavesTheDeviceIdle) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  TemplateBuilder b("two_roots");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("p", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("q", OpKind::kGeneric).Inputs({"$in"}).Output("y", DType::kF32, {"N"});
  const TemplateId two = *r.g.RegisterTemplate(*b.Build());
  const TemplateId single = *r.g.RegisterTemplate(Chain(1));
  r.Start();
  const InstanceId y = r.New(two, 8, /*prio=*/0);
  const InstanceId z = r.New(single, 8, /*prio=*/10);
  const NodeId p = r.g.FindInstance(y)->nodes[0].id, q = r.g.FindInstance(y)->nodes[1].id;
  const NodeId zn = r.g.FindInstance(z)->nodes[0].id;
  absl::Notification p_running, z_placed, p_applied;
  std::atomic<bool> q_ran{false};
  r.kernels.SetHook([&](const KernelCall& k) {
    if (k.node == p) {
      p_running.Notify();
      z_placed.WaitForNotification();
    }
    if (k.node == zn) p_applied.WaitForNotification();
    if (k.node == q) q_ran = true;
  });
  r.kernels.FailWhen([p](const KernelCall& k) { return k.node == p; }, absl::InternalError("p fails"));
  r.Place(y, {0});  // p and q both ready; p runs first (tie-break)
  ASSERT_TRUE(p_running.WaitForNotificationWithTimeout(absl::Seconds(60)));
  r.Place(z, {0});  // priority 10: runs after p, ahead of q
  z_placed.Notify();
  // p's failure; applying it fails y and cancels its queued q.
  ASSERT_TRUE(r.exec->WaitForFinish(absl::Seconds(60)));
  ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  p_applied.Notify();
  // One completion (z's) will come; q is dropped without an event.
  ASSERT_TRUE(r.exec->WaitForFinishBatch(absl::Minutes(10), 2));
  ASSERT_TRUE(r.exec->AdvanceTo(r.clock.Now(), &r.feedback).ok());
  EXPECT_FALSE(q_ran.load());
  std::map<uint64_t, InstanceState> states;
  for (const RetiredInstance& ri : r.g.TakeRetired()) states[ri.id.value()] = ri.state;
  EXPECT_EQ(states[y.value()], InstanceState::kFailed);
  EXPECT_EQ(states[z.value()], InstanceState::kDone);
  ASSERT_TRUE(r.exec->Dispatch(r.clock.Now()).ok());
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

// Payloads the owner no longer needs are freed on the thread of the device
// that produced them (as the direct loop frees its own tensors), not on the
// owner's thread: a busy device frees them before its next operator, an idle
// one once kGraveyardWakeBytes have piled up, and whatever is left when the
// executors stop is freed then (nothing leaks).
TEST(ExecutorSetTest, DroppedPayloadsAreFreedOnTheirDeviceThread) {
  Watchdog watchdog(absl::Minutes(2));
  struct Tracker {
    absl::Mutex mu;
    std::vector<std::thread::id> freed_on ABSL_GUARDED_BY(mu);
    int created ABSL_GUARDED_BY(mu) = 0;
    std::thread::id device;
  };
  struct Payload {
    Payload(Tracker* tr, absl::Notification* n) : t(tr), on_free(n) {}
    Payload(const Payload&) = delete;
    Tracker* t;
    absl::Notification* on_free;
    ~Payload() {
      absl::MutexLock l(&t->mu);
      t->freed_on.push_back(std::this_thread::get_id());
      if (on_free != nullptr && !on_free->HasBeenNotified()) on_free->Notify();
    }
  };
  Tracker tracker;
  absl::Notification big_freed;
  Rig r(1, Bytes::GiB(4));
  const TemplateId one = *r.g.RegisterTemplate(Chain(1));
  r.Start();
  r.kernels.SetHook([&](const KernelCall& c) {
    const bool big = c.outputs[0].bytes.count() >= ExecutorSet::kGraveyardWakeBytes;
    {
      absl::MutexLock l(&tracker.mu);
      tracker.device = std::this_thread::get_id();
      ++tracker.created;
    }
    c.outputs[0].kind = kHostBytesPayload + 100;  // opaque to the executors
    c.outputs[0].payload = std::make_shared<Payload>(&tracker, big ? &big_freed : nullptr);
  });
  auto freed = [&] {
    absl::MutexLock l(&tracker.mu);
    return tracker.freed_on;
  };
  auto all_on_device = [&](const std::vector<std::thread::id>& f) {
    for (std::thread::id id : f) EXPECT_EQ(id, tracker.device) << "freed off the device thread";
  };
  // A chain of 4, then another. The chain runs on the device without the
  // owner, so how many of a chain's intermediates the owner has applied (and
  // handed back) while the device is still inside that chain depends on
  // timing: the counts below are ranges where that race exists, exact where it
  // does not. What never varies: every payload is freed on the device thread.
  r.Place(r.New(r.chain, 16), {0});
  ASSERT_TRUE(r.Run().ok());
  std::vector<std::thread::id> f = freed();
  EXPECT_LE(f.size(), 3u) << "the chain's output lives until its instance is done";
  all_on_device(f);
  // Everything the first chain left is freed before the second chain's first
  // operator runs.
  r.Place(r.New(r.chain, 16), {0});
  ASSERT_TRUE(r.Run().ok());
  f = freed();
  EXPECT_GE(f.size(), 4u);
  EXPECT_LE(f.size(), 7u);
  all_on_device(f);
  // An idle device frees a big payload without being given more work, and
  // with it everything handed back before.
  r.Place(r.New(one, ExecutorSet::kGraveyardWakeBytes / 4), {0});
  ASSERT_TRUE(r.Run().ok());
  ASSERT_TRUE(big_freed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  f = freed();
  EXPECT_EQ(f.size(), 9u);
  all_on_device(f);
  // Handed back but not all freed yet (the last output at least waits for the
  // next operator or a big enough pile): the rest is freed when the executors
  // stop.
  r.Place(r.New(r.chain, 16), {0});
  ASSERT_TRUE(r.Run().ok());
  EXPECT_LE(freed().size(), 12u);
  r.exec.reset();
  absl::MutexLock l(&tracker.mu);
  EXPECT_EQ(tracker.created, 13);
  EXPECT_EQ(tracker.freed_on.size(), 13u);
  EXPECT_EQ(r.g.memory(DeviceId(0)).total(), Bytes(0));
}

// An output whose every reader ran on its device loses its payload there, on
// the device thread, as soon as the last reader finished, before the owner
// applies anything (the direct loop frees its tensors the same way); the
// accounting the GMG mirrors (the pool allocation, the stored buffer once
// applied) is unchanged until the GMG frees the tensor.
TEST(ExecutorSetTest, LocallyConsumedOutputsAreFreedOnTheDeviceThread) {
  Watchdog watchdog(absl::Minutes(2));
  struct Tracker {
    absl::Mutex mu;
    std::vector<std::pair<int, std::thread::id>> freed ABSL_GUARDED_BY(mu);  // (op, thread)
  };
  struct Payload {
    Payload(Tracker* tr, int o, absl::Notification* n) : t(tr), op(o), on_free(n) {}
    Payload(const Payload&) = delete;
    Tracker* t;
    int op;
    absl::Notification* on_free;
    ~Payload() {
      absl::MutexLock l(&t->mu);
      t->freed.push_back({op, std::this_thread::get_id()});
      if (on_free != nullptr) on_free->Notify();
    }
  };
  Tracker tracker;
  absl::Notification op2_freed;
  std::thread::id device;
  std::vector<int> freed_before_op3;
  Rig r(1);
  r.Start();
  const InstanceId inst = r.New(r.chain, 16);
  r.kernels.SetHook([&](const KernelCall& c) {
    device = std::this_thread::get_id();
    if (c.op_index == 3) {
      absl::MutexLock l(&tracker.mu);
      for (const auto& [op, tid] : tracker.freed) freed_before_op3.push_back(op);
    }
    c.outputs[0].kind = kHostBytesPayload + 100;  // opaque to the executors
    c.outputs[0].payload = std::make_shared<Payload>(&tracker, c.op_index, c.op_index == 2 ? &op2_freed : nullptr);
  });
  r.Place(inst, {0});
  // No AdvanceTo yet: the owner has applied nothing.
  ASSERT_TRUE(op2_freed.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(freed_before_op3, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.exec->completed_ops(), 0);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(4 * 16 * 4)) << "allocations stay until the GMG frees";
  {
    absl::MutexLock l(&tracker.mu);
    ASSERT_EQ(tracker.freed.size(), 3u);
    for (const auto& [op, tid] : tracker.freed) EXPECT_EQ(tid, device) << "op " << op << " freed off the device";
  }
  ASSERT_TRUE(r.Run().ok());
  for (const RetiredInstance& ri : r.g.TakeRetired()) EXPECT_EQ(ri.state, InstanceState::kDone) << ri.failure;
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
  r.exec.reset();
  absl::MutexLock l(&tracker.mu);
  EXPECT_EQ(tracker.freed.size(), 4u);
}

// A dependent handed over after its producer finished on the device, but
// before the owner applied that completion, reads the producer's output
// (payload included) from the device.
TEST(ExecutorSetTest, LocalDependentOfAnUnappliedCompletion) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  r.Start();
  InstanceId inst = r.New(r.chain, 16);
  const Instance* in = r.g.FindInstance(inst);
  const NodeId first = in->nodes[0].id, last = in->nodes[3].id;
  absl::Notification first_ran, last_ran;
  std::atomic<int> payload_seen{0};
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.op_index == 0) {
      auto hb = std::make_shared<HostBytes>();
      hb->data.assign(static_cast<size_t>(c.outputs[0].bytes.count()), std::byte{7});
      c.outputs[0].kind = kHostBytesPayload;
      c.outputs[0].payload = hb;
    } else if (c.op_index == 1 && c.inputs[0].kind == kHostBytesPayload &&
               static_cast<const HostBytes*>(c.inputs[0].payload.get())->data.front() == std::byte{7}) {
      ++payload_seen;
    }
    if (c.node == first) first_ran.Notify();
    if (c.node == last) last_ran.Notify();
  });
  std::vector<NodePlacement> p0 = {{first, DeviceId(0)}};
  auto issued = IssuePlacements(r.g, p0, 0, r.clock.Now());
  ASSERT_TRUE(issued.ok()) << issued.status();
  for (NodeId n : *issued) r.exec->NodeIssued(n);
  ASSERT_TRUE(first_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  while (r.exec->RunningNow()[0].valid()) absl::SleepFor(absl::Milliseconds(1));
  // op0 finished on the device; the GMG still has it issued.
  EXPECT_EQ(r.g.FindNode(first)->state, NodeState::kIssued);
  std::vector<NodePlacement> rest;
  for (int op = 1; op < 4; ++op) rest.push_back({in->nodes[op].id, DeviceId(0)});
  issued = IssuePlacements(r.g, rest, 0, r.clock.Now());
  ASSERT_TRUE(issued.ok()) << issued.status();
  for (NodeId n : *issued) r.exec->NodeIssued(n);
  ASSERT_TRUE(last_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(r.Run().ok());
  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kDone) << retired[0].failure;
  EXPECT_EQ(payload_seen.load(), 1);
  EXPECT_EQ(r.exec->completed_ops(), 4);
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

// A failure inside a locally driven chain fails its instance with the
// failing node's reason; its pending dependents never run; nothing leaks.
TEST(ExecutorSetTest, FailureInsideALocalChainFailsOnlyItsInstance) {
  Watchdog watchdog(absl::Minutes(2));
  constexpr int kLen = 8;
  Rig r(1);
  const TemplateId chain = *r.g.RegisterTemplate(Chain(kLen));
  r.Start();
  InstanceId bad = r.New(chain, 20);
  InstanceId good = r.New(chain, 21);
  const NodeId throws_at = r.g.FindInstance(bad)->nodes[3].id;
  r.kernels.ThrowWhen([=](const KernelCall& c) { return c.node == throws_at; }, "boom");
  std::atomic<int> bad_after{0};
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.instance == bad && c.op_index > 3) ++bad_after;
  });
  r.Place(bad, {0});
  r.Place(good, {0});
  ASSERT_TRUE(r.Run().ok());
  std::map<uint64_t, RetiredInstance> by_id;
  for (RetiredInstance& ri : r.g.TakeRetired()) by_id[ri.id.value()] = ri;
  ASSERT_EQ(by_id.size(), 2u);
  EXPECT_EQ(by_id[good.value()].state, InstanceState::kDone);
  EXPECT_EQ(by_id[bad.value()].state, InstanceState::kFailed);
  EXPECT_THAT(by_id[bad.value()].failure, HasSubstr("kernel threw: boom"));
  EXPECT_EQ(bad_after.load(), 0);
  EXPECT_EQ(r.exec->failed_nodes(), 1);
  EXPECT_EQ(r.exec->completed_ops(), kLen + 3);
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
  EXPECT_EQ(r.g.memory(DeviceId(0)).total(), Bytes(0));
}

// The device thread keeps its per-operator scratch (output buffers,
// allocations) across operators. What a failed kernel put in its outputs
// must still be let go, also when the next operator has fewer outputs and
// does not overwrite them all.
TEST(ExecutorSetTest, OutputsOfAFailedKernelAreNotKeptByTheNextOperator) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  TemplateBuilder b("two");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("t", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"}).Output("y", DType::kF32, {"N"});
  const TemplateId two = *r.g.RegisterTemplate(*b.Build());
  r.Start();
  const InstanceId bad = r.New(two, 8);
  const NodeId t = r.g.FindInstance(bad)->nodes[0].id;
  std::weak_ptr<void> kept[2];
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node != t) return;
    for (int i = 0; i < 2; ++i) {
      auto hb = std::make_shared<HostBytes>();
      hb->data.assign(8, std::byte{1});
      c.outputs[i].kind = kHostBytesPayload;
      c.outputs[i].payload = hb;
      kept[i] = hb;
    }
  });
  r.kernels.FailWhen([=](const KernelCall& c) { return c.node == t; }, absl::InternalError("t fails"));
  r.Place(bad, {0});
  r.clock.Advance(Duration::Micros(1));
  const InstanceId after = r.New(r.chain, 8);  // one output per op
  r.Place(after, {0});
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(r.exec->failed_nodes(), 1);
  EXPECT_EQ(r.exec->completed_ops(), 4);
  EXPECT_TRUE(kept[0].expired());
  EXPECT_TRUE(kept[1].expired());
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

// A producer's list of pending dependents names their item slots. A
// dependent dropped before the producer runs (its other producer failed)
// frees its slot, and the owner may hand another item into it before the
// producer finishes: that item, pending on the same producer and on one more,
// must be released once, by each producer's own entry, not also by the stale
// one (which would release it before its other producer ran, without that
// input).
TEST(ExecutorSetTest, AFreedDependentSlotReusedBeforeItsProducerRunsIsNotReleasedTwice) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  TemplateBuilder b("reuse");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("q", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("p", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("d", OpKind::kGeneric).Inputs({"p", "q"}).Output("x", DType::kF32, {"N"});
  b.Op("r", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("e", OpKind::kGeneric).Inputs({"p", "r"}).Output("x", DType::kF32, {"N"});
  const TemplateId tpl = *r.g.RegisterTemplate(*b.Build());
  r.Start();
  const InstanceId a = r.New(tpl, 8);
  const Instance* in = r.g.FindInstance(a);
  const NodeId q = in->nodes[0].id, e = in->nodes[4].id;
  const InstanceId hold = r.New(r.chain, 8);
  const NodeId hold0 = r.g.FindInstance(hold)->nodes[0].id;
  absl::Notification held, release, e_ran;
  std::atomic<bool> e_had_r{false};
  r.kernels.FailWhen([=](const KernelCall& c) { return c.node == q; }, absl::InternalError("q fails"));
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node == hold0) {
      held.Notify();
      release.WaitForNotification();
    } else if (c.instance == a && c.op_index == 3) {  // r: a payload for e
      auto hb = std::make_shared<HostBytes>();
      hb->data.assign(8, std::byte{3});
      c.outputs[0].kind = kHostBytesPayload;
      c.outputs[0].payload = hb;
    } else if (c.node == e) {
      e_had_r = c.inputs[1].kind == kHostBytesPayload && c.inputs[1].payload != nullptr;
      e_ran.Notify();
    }
  });
  auto issue = [&](std::initializer_list<int> ops) {
    std::vector<NodePlacement> p;
    for (int op : ops) p.push_back({in->nodes[op].id, DeviceId(0)});
    r.Issue(p);
  };
  // Ready times order the device's picks: q, the holding chain, p.
  r.exec->Pause();
  issue({0});
  r.clock.Advance(Duration::Micros(1));
  r.Place(hold, {0});
  r.clock.Advance(Duration::Micros(1));
  issue({1, 2});  // d pends on p and q
  r.exec->Resume();
  // q failed (d dropped, its slot freed); the device holds in the chain,
  // before p. r, then e (pending on p and r), take the freed slots.
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(30)));
  r.clock.Advance(Duration::Micros(1));
  issue({3, 4});
  release.Notify();
  // The owner applies nothing until e ran (q's failure would cancel it).
  ASSERT_TRUE(e_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(e_had_r.load()) << "e ran before its producer r finished";
  ASSERT_TRUE(r.Run().ok());
  std::map<uint64_t, RetiredInstance> by_id;
  for (RetiredInstance& ri : r.g.TakeRetired()) by_id[ri.id.value()] = ri;
  ASSERT_EQ(by_id.size(), 2u);
  EXPECT_EQ(by_id[hold.value()].state, InstanceState::kDone);
  EXPECT_EQ(by_id[a.value()].state, InstanceState::kFailed);
  EXPECT_THAT(by_id[a.value()].failure, HasSubstr("q fails"));
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

// On the fast path one clock read serves an operator boundary: the end of an
// operator is the start of the next one picked in the same critical section.
// A chain handed over at once therefore costs its device thread one read per
// operator plus the first start, and the GMG records each start at its
// predecessor's end.
TEST(ExecutorSetTest, AChainReadsTheClockOncePerOperatorBoundary) {
  Watchdog watchdog(absl::Minutes(2));
  constexpr int kLen = 16;
  // Counts the reads of threads other than the owner (this one).
  class CountingClock final : public Clock {
   public:
    explicit CountingClock(const Clock* inner) : inner_(inner), owner_(std::this_thread::get_id()) {}
    Timestamp Now() const override {
      if (std::this_thread::get_id() != owner_) reads_.fetch_add(1);
      return inner_->Now();
    }
    int64_t reads() const { return reads_.load(); }

   private:
    const Clock* inner_;
    std::thread::id owner_;
    mutable std::atomic<int64_t> reads_{0};
  };
  Rig r(1);
  const TemplateId chain = *r.g.RegisterTemplate(Chain(kLen));
  CountingClock clock(&r.clock);
  r.exec = std::make_unique<ExecutorSet>(&r.g, &clock, &r.kernels, &r.host);
  const InstanceId c = r.New(chain, 32);
  r.exec->Pause();  // the whole chain is handed over before its first start
  r.Place(c, {0});
  r.exec->Resume();
  ASSERT_TRUE(r.Run().ok());
  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kDone) << retired[0].failure;
  EXPECT_EQ(clock.reads(), kLen + 1);
  EXPECT_EQ(r.exec->fast_path_ops(), kLen - 1);
  std::vector<const Feedback*> ops(kLen, nullptr);
  for (const Feedback& f : r.feedback) ops[f.op] = &f;
  for (int k = 1; k < kLen; ++k) {
    ASSERT_NE(ops[k], nullptr);
    EXPECT_EQ(ops[k - 1]->end, ops[k]->start) << k;
  }
}

// A node that failed on its device stays in the device's live table until
// the owner drains its record. A dependent the owner hands over in between
// (its producer still running or queued as far as the GMG knows) must fail at
// once, not wait on the failed producer's slot: a waiting item would keep the
// device busy for ever, which a batched wait sees.
TEST(ExecutorSetTest, ADependentHandedAfterItsProducerFailedUnappliedFailsAtOnce) {
  Watchdog watchdog(absl::Minutes(2));
  Rig r(1);
  r.Start();
  const InstanceId a = r.New(r.chain, 8);
  const Instance* in = r.g.FindInstance(a);
  const NodeId first = in->nodes[0].id;
  absl::Notification first_ran;
  r.kernels.FailWhen([=](const KernelCall& c) { return c.node == first; }, absl::InternalError("op0 fails"));
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node == first) first_ran.Notify();
  });
  r.Issue({{first, DeviceId(0)}});
  ASSERT_TRUE(first_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  while (r.exec->RunningNow()[0].valid()) absl::SleepFor(absl::Milliseconds(1));
  // op0 failed on the device; the GMG still has it issued.
  EXPECT_EQ(r.g.FindNode(first)->state, NodeState::kIssued);
  std::vector<NodePlacement> rest;
  for (int op = 1; op < 4; ++op) rest.push_back({in->nodes[op].id, DeviceId(0)});
  r.Issue(rest);
  ASSERT_TRUE(r.Run().ok());

  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kFailed);
  EXPECT_THAT(retired[0].failure, HasSubstr("op0 fails"));
  // One more instance completes (handed over whole, so that only its last
  // completion is one the batch waits for); with nothing left on the device
  // a batch of two returns with that one completion at once.
  const InstanceId b = r.New(r.chain, 8);
  absl::Notification last_ran;
  const NodeId b_last = r.g.FindInstance(b)->nodes[3].id;
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.node == b_last) last_ran.Notify();
  });
  r.exec->Pause();
  r.Place(b, {0});
  r.exec->Resume();
  ASSERT_TRUE(last_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(r.exec->WaitForFinishBatch(absl::Seconds(5), 2)) << "the device still holds work";
  ASSERT_TRUE(r.Run().ok());
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

// A local input names its input slot and its producer's output in 16 bits
// (WorkItem::LocalInput). An operator reading its producer more often than
// that on the same device still gets every input: those past the limit come
// through the owner once the GMG has applied the producer, and the
// operator waits for them.
TEST(ExecutorSetTest, InputsPastTheLocalIndexLimitAllReachTheConsumer) {
  Watchdog watchdog(absl::Minutes(2));
  constexpr int kReads = 0x10000 + 2;
  Rig r(1);
  TemplateBuilder b("wide");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("p", OpKind::kGeneric).Inputs({"$in"}).Output("x", DType::kF32, {"N"});
  b.Op("c", OpKind::kGeneric)
      .Inputs(std::vector<std::string>(kReads, "p"))
      .Output("y", DType::kF32, {"N"});
  const TemplateId tpl = *r.g.RegisterTemplate(*b.Build());
  r.Start();
  const InstanceId a = r.New(tpl, 8);
  std::atomic<int> with_payload{-1};
  r.kernels.SetHook([&](const KernelCall& c) {
    if (c.op_index == 0) {
      auto hb = std::make_shared<HostBytes>();
      hb->data.assign(8, std::byte{5});
      c.outputs[0].kind = kHostBytesPayload;
      c.outputs[0].payload = hb;
      return;
    }
    with_payload = static_cast<int>(std::count_if(c.inputs.begin(), c.inputs.end(), [](const Buffer& in) {
      return in.kind == kHostBytesPayload && in.payload != nullptr;
    }));
  });
  r.Place(a, {0});
  ASSERT_TRUE(r.Run().ok());
  auto retired = r.g.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kDone) << retired[0].failure;
  EXPECT_EQ(with_payload.load(), kReads);
  EXPECT_EQ(r.exec->stored_tensors(), 0u);
  EXPECT_EQ(r.exec->pool(DeviceId(0)).used(), Bytes(0));
}

}  // namespace
}  // namespace slicesched::executor
