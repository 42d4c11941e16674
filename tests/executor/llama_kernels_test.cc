// Real LibTorch execution of the Llama GMG operators through the ExecutorSet:
// a tiny Llama prefill placed "pp2" on two CPU devices and decode steps
// attached to its KV checkpoints must generate exactly the tokens of a direct
// call sequence of the operators. Torch-free TU (public executor headers).
#include "slicesched/executor/kernels/llama_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/cpu_allocator.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sim/simulator.h"
#include "cuda_or_skip.h"
#include "reconstruction_check.h"

namespace slicesched::executor {
namespace {

using ::testing::HasSubstr;

AcceleratorSet Devices(int n) {
  std::vector<DeviceSpec> devs(n);
  for (int d = 0; d < n; ++d) {
    devs[d].name = "cpu" + std::to_string(d);
    devs[d].type = "cpu";
    devs[d].memory = Bytes::GiB(1);
    devs[d].backend = DeviceBackend::kCpu;
  }
  return *AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)});
}

std::vector<int64_t> Prompt(int64_t n, int64_t vocab) {
  std::vector<int64_t> out;
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out.push_back(static_cast<int64_t>(x % static_cast<uint64_t>(vocab)));
  }
  return out;
}

double MaxAbsLora(const TaskAdapters& a) {
  double m = 0;
  for (const LoraLayer& l : a.layers) {
    for (float f : l.q_b.ToFloat()) m = std::max(m, static_cast<double>(f < 0 ? -f : f));
  }
  return m;
}

// Sampling parameters of generation step `step` (0: the prefill).
SamplingParams StepParams(const SamplingParams& base, int step) {
  SamplingParams p = base;
  p.seed = base.seed + static_cast<uint64_t>(step);
  return p;
}

// The reference: the operators called directly, one KvCache per group.
std::vector<int64_t> DirectGenerate(const LlamaWeights& w, const std::vector<int64_t>& prompt,
                                    int decode_steps, const SamplingParams& base) {
  std::vector<KvCache> caches(static_cast<size_t>(w.num_groups()));
  std::vector<int64_t> out;
  Tensor tokens = Tensor::FromInt64(prompt, {1, static_cast<int64_t>(prompt.size())});
  int64_t pos = 0;
  for (int step = 0; step <= decode_steps; ++step) {
    auto h = Embedding(w, tokens);
    EXPECT_TRUE(h.ok()) << h.status();
    Tensor x = *h;
    for (int64_t g = 0; g < w.num_groups(); ++g) {
      auto y = FusedLayers(w, g, x, &caches[g], pos);
      EXPECT_TRUE(y.ok()) << y.status();
      x = *y;
    }
    pos += tokens.shape()[1];
    auto logits = LmHead(w, x);
    EXPECT_TRUE(logits.ok()) << logits.status();
    auto t = Sample(*logits, StepParams(base, step));
    EXPECT_TRUE(t.ok()) << t.status();
    const int64_t tok = t->ToInt64().at(0);
    out.push_back(tok);
    const std::vector<int64_t> next = {tok};
    tokens = Tensor::FromInt64(next, {1, 1});
  }
  return out;
}

class LlamaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dims = LlamaPreset("tiny");
    ASSERT_TRUE(dims.ok()) << dims.status();
    dims_ = *dims;
    auto w = LlamaWeights::FromSeed(dims_, 1234);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *w;
    auto t = BuildLlamaTemplates(dims_);
    ASSERT_TRUE(t.ok()) << t.status();
    tpl_ = *t;
    gmg_ = std::make_unique<GlobalMappingGraph>(Devices(2));
    pre_ = *gmg_->RegisterTemplate(tpl_.prefill);
    dec_ = *gmg_->RegisterTemplate(tpl_.decode);
    auto chunked = BuildLlamaChunkedPrefill(dims_, 3);
    ASSERT_TRUE(chunked.ok()) << chunked.status();
    pre_c3_ = *gmg_->RegisterTemplate(*chunked);
    for (uint16_t d = 0; d < 2; ++d) {
      for (const OpSpec& op : tpl_.prefill->ops()) {
        if (op.weight_key.empty()) continue;
        ASSERT_TRUE(gmg_->LoadWeights(DeviceId(d), op.weight_key, op.weight_bytes).ok());
      }
    }
    auto runner = LlamaKernelRunner::Create(weights_, dims_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    runner_->SetTokenSink([this](InstanceId inst, const Tensor& t) {
      absl::MutexLock l(&mu_);
      sampled_[inst.value()] = t.ToInt64();
      sampler_cache_ = CachingCpuAllocatorStatsOfThisThread();  // the device thread's
    });
    exec_ = std::make_unique<ExecutorSet>(gmg_.get(), &clock_, runner_.get(), &transfers_);
    for (uint16_t d = 0; d < 2; ++d) baseline_.push_back(exec_->pool(DeviceId(d)).used());
  }
  void TearDown() override { exec_.reset(); }

  const CandidatePartition& Partition(const GraphTemplate& t, const std::string& name) {
    for (const CandidatePartition& p : t.partitions()) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no partition " << name;
    return t.partitions().front();
  }

  // Issues `inst` by partition pp2 on devices (0, 1) and runs it until it
  // retires; checks the GMG's invariants after every step.
  // With `pieces_across`, a chunked prefill's operators run instead on
  // device (piece % 2), whatever their group: each piece hands the cache of
  // the pieces before it to the other device, as SliceScheduler may place
  // them. Any other instance then runs on device 0.
  absl::StatusOr<RetiredInstance> Run(InstanceId inst, bool pieces_across = false) {
    const DeviceId slots[2] = {DeviceId(0), DeviceId(1)};
    const Instance* in = gmg_->FindInstance(inst);
    absl::StatusOr<std::vector<NodeId>> issued;
    if (pieces_across) {
      std::vector<NodePlacement> pl;
      for (int op : in->tpl->topo_order()) {
        const std::string& name = in->tpl->op(op).name;
        const size_t c = name.rfind('c');
        const int piece = c != std::string::npos && c > 0 && name != "sample" ? std::atoi(name.c_str() + c + 1) : 0;
        pl.push_back({in->nodes[op].id, DeviceId(static_cast<uint16_t>(piece % 2))});
      }
      issued = IssuePlacements(*gmg_, pl, 0, clock_.Now());
    } else {
      issued = IssueByPartition(*gmg_, inst, Partition(*in->tpl, "pp2"), slots, 0, clock_.Now());
    }
    if (!issued.ok()) return issued.status();
    for (NodeId n : *issued) exec_->NodeIssued(n);
    if (absl::Status s = exec_->Dispatch(clock_.Now()); !s.ok()) return s;
    std::vector<Feedback> feedback;
    for (;;) {
      for (RetiredInstance& r : gmg_->TakeRetired()) {
        if (r.id == inst) return r;
      }
      if (!exec_->WaitForCompletion(absl::Seconds(60))) {
        return absl::DeadlineExceededError("no completion within 60 s");
      }
      if (absl::Status s = exec_->AdvanceTo(clock_.Now(), &feedback); !s.ok()) return s;
      if (absl::Status s = gmg_->VerifyInvariants(); !s.ok()) return s;
    }
  }

  std::vector<int64_t> Sampled(InstanceId inst) {
    absl::MutexLock l(&mu_);
    return sampled_[inst.value()];
  }

  // Prefill of `prompt` then `decode_steps` decode steps, each attached to
  // the prefill's KV checkpoints; returns the generated tokens and leaves the
  // checkpoints in *kv.
  // chunks 3: the prefill in three pieces (pre_c3_), placed by partition or,
  // with pieces_across, piece by piece on alternating devices.
  std::vector<int64_t> Generate(const std::vector<int64_t>& prompt, int decode_steps,
                                const SamplingParams& base, std::vector<CheckpointId>* kv, int chunks = 1,
                                bool pieces_across = false) {
    std::vector<int64_t> out;
    const int64_t s = static_cast<int64_t>(prompt.size());
    InstanceSpec ps;
    if (chunks == 3) {
      ps = LlamaChunkedPrefill(pre_c3_, 3, s, PriorityClass::kOnline, clock_.Now());
    } else {
      ps.template_id = pre_;
      ps.bindings = {{"B", 1}, {"S", s}};
      ps.priority_class = PriorityClass::kOnline;
      ps.arrival = clock_.Now();
    }
    auto pid = gmg_->Instantiate(ps);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return out;
    runner_->SetRequest(*pid, LlamaRequest{Tensor::FromInt64(prompt, {1, s}), StepParams(base, 0)});
    auto r = Run(*pid, pieces_across);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    EXPECT_EQ(r->state, InstanceState::kDone) << r->failure;
    runner_->EraseRequest(*pid);
    *kv = r->produced;
    EXPECT_EQ(kv->size(), static_cast<size_t>(dims_.num_groups()));
    std::vector<int64_t> tok = Sampled(*pid);
    EXPECT_EQ(tok.size(), 1u);
    if (tok.size() != 1) return out;
    out.push_back(tok[0]);
    for (int step = 1; step <= decode_steps; ++step) {
      InstanceSpec ds;
      ds.template_id = dec_;
      ds.bindings = {{"B", 1}, {"C", s + step - 1}};
      ds.priority_class = PriorityClass::kOnline;
      ds.arrival = clock_.Now();
      for (size_t k = 0; k < kv->size(); ++k) ds.checkpoints.emplace_back(StrCat("kv", k), (*kv)[k]);
      auto did = gmg_->Instantiate(ds);
      EXPECT_TRUE(did.ok()) << did.status();
      if (!did.ok()) return out;
      const std::vector<int64_t> last = {out.back()};
      runner_->SetRequest(*did, LlamaRequest{Tensor::FromInt64(last, {1, 1}), StepParams(base, step)});
      auto dr = Run(*did, pieces_across);
      EXPECT_TRUE(dr.ok()) << dr.status();
      if (!dr.ok()) return out;
      EXPECT_EQ(dr->state, InstanceState::kDone) << dr->failure;
      runner_->EraseRequest(*did);
      tok = Sampled(*did);
      EXPECT_EQ(tok.size(), 1u);
      if (tok.size() != 1) return out;
      out.push_back(tok[0]);
    }
    return out;
  }

  // Releases the checkpoints and checks that every buffer went back.
  void ReleaseAndCheckBaseline(const std::vector<CheckpointId>& kv) {
    for (CheckpointId k : kv) ASSERT_TRUE(gmg_->ReleaseCheckpoint(k).ok());
    ASSERT_TRUE(exec_->Dispatch(clock_.Now()).ok());
    EXPECT_TRUE(gmg_->VerifyInvariants().ok()) << gmg_->VerifyInvariants();
    EXPECT_EQ(exec_->stored_tensors(), 0u);
    for (uint16_t d = 0; d < 2; ++d) {
      EXPECT_EQ(exec_->pool(DeviceId(d)).used(), baseline_[d]) << "device " << d;
      EXPECT_EQ(gmg_->memory(DeviceId(d)).checkpoints, Bytes(0));
      EXPECT_EQ(gmg_->memory(DeviceId(d)).activations, Bytes(0));
    }
  }

  LlamaDims dims_;
  std::shared_ptr<const LlamaWeights> weights_;
  LlamaTemplates tpl_;
  std::unique_ptr<GlobalMappingGraph> gmg_;
  TemplateId pre_, dec_, pre_c3_;
  SteadyClock clock_;
  std::unique_ptr<LlamaKernelRunner> runner_;
  LlamaTransferBackend transfers_;
  std::unique_ptr<ExecutorSet> exec_;
  std::vector<Bytes> baseline_;
  absl::Mutex mu_;
  std::map<uint64_t, std::vector<int64_t>> sampled_;
  CpuCacheStats sampler_cache_;  // as of the last sampled token
};

TEST_F(LlamaKernelsTest, Pp2PrefillAndGreedyDecodeMatchDirectOps) {
  const std::vector<int64_t> prompt = Prompt(7, dims_.vocab);
  const SamplingParams greedy;  // temperature 0
  std::vector<CheckpointId> kv;
  const std::vector<int64_t> got = Generate(prompt, 5, greedy, &kv);
  const std::vector<int64_t> want = DirectGenerate(*weights_, prompt, 5, greedy);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(got, want);
  EXPECT_GT(exec_->completed_transfers(), 0);  // g0 -> g1 crossed devices
  EXPECT_EQ(exec_->failed_nodes(), 0);
  // The GMG's accounting of the grown checkpoints matches the real caches:
  // 7 prompt tokens + 5 decode steps (the last sampled token is not cached).
  for (size_t g = 0; g < kv.size(); ++g) {
    const Checkpoint* c = gmg_->FindCheckpoint(kv[g]);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->device, DeviceId(static_cast<uint16_t>(g)));
    EXPECT_EQ(c->bytes.count(), dims_.fusion * dims_.KvBytesPerTokenPerLayer() * 12);
  }
  EXPECT_EQ(runner_->num_requests(), 0u);
  ReleaseAndCheckBaseline(kv);
}

// The same executors on two logical devices sharing GPU 0: the operators
// read the weights' copy there, the KV caches and activations stay on the
// GPU, and the tokens equal the direct computation on the CPU (f32). The
// weights' copy accounts for the allocator's growth at placement; after a
// first generation has run (cuBLAS keeps a workspace per stream from the
// caching allocator), the pools account for what it holds, with the caches
// held and after they are released, up to its rounding. Skipped without a
// usable GPU (tools/gpu-check runs it on one).
class CudaLlamaKernelsTest : public LlamaKernelsTest {
 protected:
  void SetUp() override {
    SLICESCHED_CUDA_OR_SKIP(0);
    LlamaKernelsTest::SetUp();
    const CudaAllocatorStats before = Allocator();
    const std::vector<TensorDevice> placement = {TensorDevice::Cuda(0), TensorDevice::Cuda(0)};
    ASSERT_TRUE(runner_->Place(placement).ok());
    transfers_.Place(placement);
    const MemoryReconciliation placed =
        ReconcileDeviceMemory({.resident_bytes = runner_->ResidentOn(0).count()}, Allocator(), before);
    EXPECT_TRUE(placed.agrees()) << "the weights' copy: " << placed.ToString();
  }
  static CudaAllocatorStats Allocator() {
    auto now = QueryCudaAllocator(0);
    EXPECT_TRUE(now.ok()) << now.status();
    return now.ok() ? *now : CudaAllocatorStats{};
  }
  void ExpectPoolsAgreeWithTheAllocatorSince(const CudaAllocatorStats& baseline) {
    DeviceMemoryAccount ours;
    for (uint16_t d = 0; d < 2; ++d) ours.pool_bytes += exec_->pool(DeviceId(d)).used().count();
    const MemoryReconciliation r = ReconcileDeviceMemory(ours, Allocator(), baseline);
    EXPECT_TRUE(r.agrees()) << r.ToString();
  }
};

TEST_F(CudaLlamaKernelsTest, Pp2PrefillAndGreedyDecodeMatchTheCpu) {
  EXPECT_EQ(runner_->WeightsOn(DeviceId(1)).device(), TensorDevice::Cuda(0));
  EXPECT_EQ(runner_->ResidentOn(0), weights_->TotalBytes());
  const std::vector<int64_t> prompt = Prompt(7, dims_.vocab);
  const SamplingParams greedy;
  const std::vector<int64_t> want = DirectGenerate(*weights_, prompt, 5, greedy);
  std::vector<CheckpointId> kv;
  EXPECT_EQ(Generate(prompt, 5, greedy, &kv), want);  // also the libraries' warm-up
  ReleaseAndCheckBaseline(kv);
  const CudaAllocatorStats warm = Allocator();
  EXPECT_EQ(Generate(prompt, 5, greedy, &kv), want);
  EXPECT_GT(exec_->completed_transfers(), 0);
  EXPECT_EQ(exec_->failed_nodes(), 0);
  ExpectPoolsAgreeWithTheAllocatorSince(warm);
  ReleaseAndCheckBaseline(kv);
  ExpectPoolsAgreeWithTheAllocatorSince(warm);
}

// A prefill in pieces computes what the one-piece prefill does: each piece
// attends to the cache of the pieces before it, and the last piece retains
// the whole cache, on which decode steps go on.
TEST_F(LlamaKernelsTest, ChunkedPrefillMatchesDirectOpsByPartitionAndPieceByPiece) {
  const std::vector<int64_t> prompt = Prompt(11, dims_.vocab);  // pieces 4, 4, 3
  const SamplingParams greedy;
  const std::vector<int64_t> want = DirectGenerate(*weights_, prompt, 4, greedy);
  for (const bool across : {false, true}) {
    SCOPED_TRACE(across ? "pieces on alternating devices" : "pp2 partition");
    const int64_t moved_before = exec_->completed_transfers();
    std::vector<CheckpointId> kv;
    EXPECT_EQ(Generate(prompt, 4, greedy, &kv, 3, across), want);
    EXPECT_GT(exec_->completed_transfers(), moved_before);
    EXPECT_EQ(exec_->failed_nodes(), 0);
    ASSERT_EQ(kv.size(), static_cast<size_t>(dims_.num_groups()));
    for (size_t g = 0; g < kv.size(); ++g) {
      const Checkpoint* c = gmg_->FindCheckpoint(kv[g]);
      ASSERT_NE(c, nullptr);
      // The last piece (2) ran on device 0 when placed piece by piece.
      EXPECT_EQ(c->device, DeviceId(static_cast<uint16_t>(across ? 0 : g)));
      EXPECT_EQ(c->bytes.count(), dims_.fusion * dims_.KvBytesPerTokenPerLayer() * (11 + 4));
    }
    ReleaseAndCheckBaseline(kv);
  }
}

TEST_F(LlamaKernelsTest, DeviceThreadsTakeTensorMemoryFromTheirCache) {
  const std::vector<int64_t> prompt = Prompt(5, dims_.vocab);
  const SamplingParams greedy;
  std::vector<CheckpointId> kv;
  const std::vector<int64_t> got = Generate(prompt, 3, greedy, &kv);
  EXPECT_EQ(got, DirectGenerate(*weights_, prompt, 3, greedy));
  CpuCacheStats s;
  {
    absl::MutexLock l(&mu_);
    s = sampler_cache_;
  }
  // The thread that sampled (device 1, which also ran group 1 and the head
  // four times) opted in and reused the blocks its operators freed.
  EXPECT_TRUE(s.enabled);
  EXPECT_GT(s.misses, 0);
  EXPECT_GT(s.hits, s.misses);
  EXPECT_FALSE(CachingCpuAllocatorStatsOfThisThread().enabled);  // not the test's thread
  ReleaseAndCheckBaseline(kv);
}

TEST_F(LlamaKernelsTest, NucleusSamplingWithPerStepSeedsMatchesDirectOps) {
  const std::vector<int64_t> prompt = Prompt(7, dims_.vocab);
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.9;
  p.seed = 42;
  std::vector<CheckpointId> kv;
  const std::vector<int64_t> got = Generate(prompt, 5, p, &kv);
  EXPECT_EQ(got, DirectGenerate(*weights_, prompt, 5, p));
  ReleaseAndCheckBaseline(kv);
}

TEST_F(LlamaKernelsTest, MissingRequestFailsTheInstanceCleanly) {
  InstanceSpec ps;
  ps.template_id = pre_;
  ps.bindings = {{"B", 1}, {"S", 3}};
  ps.arrival = clock_.Now();
  auto id = gmg_->Instantiate(ps);
  ASSERT_TRUE(id.ok()) << id.status();
  auto r = Run(*id);  // no SetRequest: the embedding cannot find $tokens
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, InstanceState::kFailed);
  EXPECT_THAT(r->failure, HasSubstr("no Llama request registered"));
  ReleaseAndCheckBaseline(r->produced);
}

TEST_F(LlamaKernelsTest, WrongTokenShapeAndOutOfVocabularyComeBackAsStatus) {
  for (int c = 0; c < 2; ++c) {
    InstanceSpec ps;
    ps.template_id = pre_;
    ps.bindings = {{"B", 1}, {"S", 3}};
    ps.arrival = clock_.Now();
    auto id = gmg_->Instantiate(ps);
    ASSERT_TRUE(id.ok()) << id.status();
    const std::vector<int64_t> bad = c == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 2, 100000};
    runner_->SetRequest(*id, LlamaRequest{Tensor::FromInt64(bad, {1, static_cast<int64_t>(bad.size())}), {}});
    auto r = Run(*id);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state, InstanceState::kFailed);
    EXPECT_THAT(r->failure, HasSubstr(c == 0 ? "the instance expects [1,3]" : "outside the vocabulary"));
    runner_->EraseRequest(*id);
    ReleaseAndCheckBaseline(r->produced);
  }
}

bool BitEqual(const TaskAdapters& a, const TaskAdapters& b) {
  const auto na = a.NamedTensors(), nb = b.NamedTensors();
  if (na.size() != nb.size()) return false;
  for (size_t i = 0; i < na.size(); ++i) {
    if (na[i].second.shape() != nb[i].second.shape() ||
        na[i].second.ToFloat() != nb[i].second.ToFloat()) {
      return false;
    }
  }
  return true;
}

// A micro-batch of `rows` rows of 5 tokens; class = last token mod 3.
TrainBatch MicroBatch(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids = Prompt(rows * 5 + static_cast<int64_t>(seed), vocab);
  ids.erase(ids.begin(), ids.begin() + static_cast<int64_t>(seed));
  std::vector<int64_t> cls;
  for (int64_t b = 0; b < rows; ++b) cls.push_back(ids[static_cast<size_t>(b * 5 + 4)] % 3);
  TrainBatch batch;
  batch.tokens = Tensor::FromInt64(ids, {rows, 5});
  batch.labels = *LastPositionLabels(cls, 5);
  return batch;
}

// Four micro-batches of a fine-tuning job through "<name>/train" placed pp2
// on two devices (gradient accumulation 2: two AdamW steps) leave the job in
// exactly the state of the direct operator calls.
TEST_F(LlamaKernelsTest, Pp2TrainingIterationsMatchDirectOps) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok()) << tid.status();
  AdamWOptions adamw;
  adamw.lr = 1e-2;
  auto init = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7, adamw);
  ASSERT_TRUE(init.ok()) << init.status();
  auto job = std::make_shared<LlamaTrainJob>();
  {
    absl::MutexLock l(&job->mu);
    job->state = *init;
  }
  job->accumulation = 2;
  TaskState direct = *init;
  SetIntraOpThreadsForThisThread(1);  // as on the device threads
  std::vector<double> direct_losses;
  for (int it = 0; it < 4; ++it) {
    const TrainBatch batch = MicroBatch(2, dims_.vocab, static_cast<uint64_t>(it));
    auto id =
        gmg_->Instantiate(LlamaTrainStep(*tid, 2, 5, 4, 3, PriorityClass::kOffline, clock_.Now()));
    ASSERT_TRUE(id.ok()) << id.status();
    runner_->SetTrainRequest(*id, LlamaTrainRequest{job, batch});
    auto r = Run(*id);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->state, InstanceState::kDone) << r->failure;
    EXPECT_TRUE(r->produced.empty());
    runner_->EraseRequest(*id);

    auto loss = AccumulateMicroBatch(*weights_, direct, batch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    direct_losses.push_back(static_cast<float>(*loss));
    if (direct.accumulated == 2) {
      ASSERT_TRUE(AdamWStep(direct).ok());
    }
  }
  absl::MutexLock l(&job->mu);
  EXPECT_EQ(job->losses, direct_losses);
  EXPECT_EQ(job->state.step, 2);
  EXPECT_EQ(job->state.accumulated, 0);
  EXPECT_TRUE(BitEqual(job->state.params, direct.params));
  EXPECT_TRUE(BitEqual(job->state.m, direct.m));
  EXPECT_TRUE(BitEqual(job->state.v, direct.v));
  EXPECT_GT(MaxAbsLora(job->state.params), 0.0);
  // f0 -> f1, b1 -> b0 and b0's gradients -> the optimizer crossed devices.
  EXPECT_GE(exec_->completed_transfers(), 3);
  EXPECT_EQ(exec_->failed_nodes(), 0);
  EXPECT_EQ(runner_->num_requests(), 0u);
  ReleaseAndCheckBaseline({});
}

// Data parallelism: the micro-batches of an iteration carry their
// micro_index and may finish in any order; the job's state must be
// bit-identical to one sequential stream (gradients folded in index order).
// Here each iteration's second micro-batch runs to completion before its
// first: after it, nothing is accumulated yet (it is parked).
TEST_F(LlamaKernelsTest, MicroBatchesFinishingOutOfOrderAccumulateLikeOneStream) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok()) << tid.status();
  AdamWOptions adamw;
  adamw.lr = 1e-2;
  auto init = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7, adamw);
  ASSERT_TRUE(init.ok()) << init.status();
  auto job = std::make_shared<LlamaTrainJob>();
  {
    absl::MutexLock l(&job->mu);
    job->state = *init;
  }
  job->accumulation = 2;
  TaskState direct = *init;
  SetIntraOpThreadsForThisThread(1);
  std::vector<double> direct_losses;
  for (int it = 0; it < 4; ++it) {
    auto loss = AccumulateMicroBatch(*weights_, direct, MicroBatch(2, dims_.vocab, static_cast<uint64_t>(it)));
    ASSERT_TRUE(loss.ok()) << loss.status();
    direct_losses.push_back(static_cast<float>(*loss));
    if (direct.accumulated == 2) {
      ASSERT_TRUE(AdamWStep(direct).ok());
    }
  }
  for (int k : {1, 0, 3, 2}) {
    auto id = gmg_->Instantiate(LlamaTrainStep(*tid, 2, 5, 4, 3, PriorityClass::kOffline, clock_.Now()));
    ASSERT_TRUE(id.ok()) << id.status();
    runner_->SetTrainRequest(*id, LlamaTrainRequest{.job = job,
                                                    .batch = MicroBatch(2, dims_.vocab, static_cast<uint64_t>(k)),
                                                    .micro_index = k});
    auto r = Run(*id);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->state, InstanceState::kDone) << r->failure;
    runner_->EraseRequest(*id);
    absl::MutexLock l(&job->mu);
    if (k % 2 == 1) {  // parked: its predecessor has not finished
      EXPECT_EQ(job->pending.size(), 1u);
      EXPECT_EQ(job->state.accumulated, 0);
      EXPECT_EQ(job->state.step, k / 2);
    } else {
      EXPECT_TRUE(job->pending.empty());
      EXPECT_EQ(job->state.step, k / 2 + 1);
    }
  }
  {
    absl::MutexLock l(&job->mu);
    EXPECT_EQ(job->losses, direct_losses);
    EXPECT_EQ(job->state.step, 2);
    EXPECT_EQ(job->state.accumulated, 0);
    EXPECT_TRUE(BitEqual(job->state.params, direct.params));
    EXPECT_TRUE(BitEqual(job->state.m, direct.m));
    EXPECT_TRUE(BitEqual(job->state.v, direct.v));
  }
  // An index already accumulated fails the instance, naming it.
  auto id = gmg_->Instantiate(LlamaTrainStep(*tid, 2, 5, 4, 3, PriorityClass::kOffline, clock_.Now()));
  ASSERT_TRUE(id.ok()) << id.status();
  runner_->SetTrainRequest(*id, LlamaTrainRequest{.job = job, .batch = MicroBatch(2, dims_.vocab, 0), .micro_index = 1});
  auto r = Run(*id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, InstanceState::kFailed);
  EXPECT_THAT(r->failure, HasSubstr("micro-batch 1 was already accumulated (the job expects micro-batch 4 next)"));
  runner_->EraseRequest(*id);
  absl::MutexLock l(&job->mu);
  EXPECT_EQ(job->state.step, 2);
}

TEST(AccumulateInOrderTest, ParksOutOfOrderGradientsAndRejectsDuplicates) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok()) << dims.status();
  auto init = TaskState::Init(*dims, LoraConfig{4, 8.0}, 3, 7);
  ASSERT_TRUE(init.ok()) << init.status();
  LlamaTrainJob job;
  job.accumulation = 3;
  absl::MutexLock l(&job.mu);
  job.state = *init;
  TaskAdapters g = init->params;  // any gradient of the right shapes
  ASSERT_TRUE(AccumulateInOrder(job, 2, g, 0.5).ok());
  EXPECT_EQ(job.state.accumulated, 0);
  absl::Status dup = AccumulateInOrder(job, 2, g, 0.5);
  EXPECT_EQ(dup.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dup.message(), HasSubstr("micro-batch 2 is already waiting"));
  ASSERT_TRUE(AccumulateInOrder(job, 0, g, 0.25).ok());
  EXPECT_EQ(job.state.accumulated, 1);  // 2 still waits for 1
  ASSERT_TRUE(AccumulateInOrder(job, 1, g, 0.375).ok());
  EXPECT_EQ(job.state.step, 1);  // 0, 1, 2 folded in, one AdamW step
  EXPECT_EQ(job.state.accumulated, 0);
  EXPECT_TRUE(job.pending.empty());
  EXPECT_EQ(job.losses, (std::vector<double>{0.25, 0.375, 0.5}));
}

// Rows of `a` (slot 0) then rows of `b` (slot 1), same token count.
TrainBatch Mixed(const TrainBatch& a, const TrainBatch& b) {
  std::vector<int64_t> tokens = a.tokens.ToInt64(), labels = a.labels.ToInt64();
  const std::vector<int64_t> tb = b.tokens.ToInt64(), lb = b.labels.ToInt64();
  tokens.insert(tokens.end(), tb.begin(), tb.end());
  labels.insert(labels.end(), lb.begin(), lb.end());
  const int64_t ra = a.tokens.shape()[0], rb = b.tokens.shape()[0], s = a.tokens.shape()[1];
  TrainBatch m;
  m.tokens = Tensor::FromInt64(tokens, {ra + rb, s});
  m.labels = Tensor::FromInt64(labels, {ra + rb, s});
  m.row_task.assign(static_cast<size_t>(ra), 0);
  m.row_task.insert(m.row_task.end(), static_cast<size_t>(rb), 1);
  return m;
}

// Spatial joint training through the same "<name>/train" template (T = 2,
// B and NC summed over the two jobs), placed pp2: four mixed micro-batches
// (gradient accumulation 2: two joint steps) leave each job in exactly the
// state of the direct operator calls (ShareLora, AccumulateJointMicroBatch,
// JointOptimizerStep): a shared adapter, each its own head, moments and losses.
TEST_F(LlamaKernelsTest, Pp2JointTrainingMatchesDirectJointOps) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok()) << tid.status();
  AdamWOptions adamw;
  adamw.lr = 1e-2;
  auto init_a = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7, adamw);
  auto init_b = TaskState::Init(dims_, LoraConfig{4, 8.0}, 4, 11, adamw);
  ASSERT_TRUE(init_a.ok() && init_b.ok());
  TaskState da = *init_a, db = *init_b;
  {
    TaskState* both[] = {&da, &db};
    ASSERT_TRUE(ShareLora(both).ok());
  }
  std::shared_ptr<LlamaTrainJob> jobs[2] = {std::make_shared<LlamaTrainJob>(), std::make_shared<LlamaTrainJob>()};
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    jobs[t]->state = t == 0 ? da : db;
    jobs[t]->accumulation = 2;
  }
  SetIntraOpThreadsForThisThread(1);  // as on the device threads
  std::vector<double> direct_losses[2];
  for (int it = 0; it < 4; ++it) {
    const TrainBatch batch = Mixed(MicroBatch(2, dims_.vocab, static_cast<uint64_t>(it)),
                                   MicroBatch(2, dims_.vocab, static_cast<uint64_t>(it + 10)));
    auto id = gmg_->Instantiate(
        LlamaTrainStep(*tid, 4, 5, 4, 3 + 4, PriorityClass::kOffline, clock_.Now(), /*tasks=*/2));
    ASSERT_TRUE(id.ok()) << id.status();
    runner_->SetTrainRequest(*id, LlamaTrainRequest{.job = jobs[0], .batch = batch, .partners = {jobs[1]}});
    auto r = Run(*id);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->state, InstanceState::kDone) << r->failure;
    runner_->EraseRequest(*id);

    TaskState* both[] = {&da, &db};
    auto loss = AccumulateJointMicroBatch(*weights_, both, batch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    for (int t = 0; t < 2; ++t) direct_losses[t].push_back(static_cast<float>((*loss)[static_cast<size_t>(t)]));
    if (da.accumulated == 2) {
      ASSERT_TRUE(JointOptimizerStep(both).ok());
    }
  }
  const TaskState* direct[2] = {&da, &db};
  TaskState got[2];
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    got[t] = jobs[t]->state;
    EXPECT_EQ(jobs[t]->losses, direct_losses[t]) << "job " << t;
  }
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(got[t].step, 2) << t;
    EXPECT_EQ(got[t].accumulated, 0) << t;
    EXPECT_TRUE(BitEqual(got[t].params, direct[t]->params)) << t;
    EXPECT_TRUE(BitEqual(got[t].m, direct[t]->m)) << t;
    EXPECT_TRUE(BitEqual(got[t].v, direct[t]->v)) << t;
  }
  // One adapter, two heads.
  for (size_t l = 0; l < got[0].params.layers.size(); ++l) {
    EXPECT_EQ(got[0].params.layers[l].q_b.MaxAbsDiff(got[1].params.layers[l].q_b), 0.0);
    EXPECT_EQ(got[0].params.layers[l].v_a.MaxAbsDiff(got[1].params.layers[l].v_a), 0.0);
  }
  EXPECT_EQ(got[0].params.head_outputs(), 3);
  EXPECT_EQ(got[1].params.head_outputs(), 4);
  EXPECT_GT(MaxAbsLora(got[0].params), 0.0);
  EXPECT_EQ(exec_->failed_nodes(), 0);
  EXPECT_EQ(runner_->num_requests(), 0u);
  ReleaseAndCheckBaseline({});
}

// A joint micro-batch carries only the rows of the jobs still accumulating
// (gradient accumulation 1 for A, 2 for B): a slot without rows accumulates
// nothing, and the joint step waits until every job has its own count.
TEST_F(LlamaKernelsTest, JointStepWaitsForEveryJobsAccumulation) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok()) << tid.status();
  auto init_a = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7);
  auto init_b = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 11);
  ASSERT_TRUE(init_a.ok() && init_b.ok());
  TaskState* both[] = {&*init_a, &*init_b};
  ASSERT_TRUE(ShareLora(both).ok());
  std::shared_ptr<LlamaTrainJob> jobs[2] = {std::make_shared<LlamaTrainJob>(), std::make_shared<LlamaTrainJob>()};
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    jobs[t]->state = t == 0 ? *init_a : *init_b;
    jobs[t]->accumulation = t == 0 ? 1 : 2;
  }
  auto run = [&](const TrainBatch& batch, int64_t rows) {
    auto id = gmg_->Instantiate(
        LlamaTrainStep(*tid, rows, 5, 4, 6, PriorityClass::kOffline, clock_.Now(), /*tasks=*/2));
    ASSERT_TRUE(id.ok()) << id.status();
    runner_->SetTrainRequest(*id, LlamaTrainRequest{.job = jobs[0], .batch = batch, .partners = {jobs[1]}});
    auto r = Run(*id);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->state, InstanceState::kDone) << r->failure;
    runner_->EraseRequest(*id);
  };
  run(Mixed(MicroBatch(2, dims_.vocab, 0), MicroBatch(2, dims_.vocab, 1)), 4);
  auto position = [&](int t) {
    absl::MutexLock l(&jobs[t]->mu);
    return std::pair<int64_t, int64_t>{jobs[t]->state.step, jobs[t]->state.accumulated};
  };
  EXPECT_EQ(position(0), (std::pair<int64_t, int64_t>{0, 1}));  // full, waits for B
  EXPECT_EQ(position(1), (std::pair<int64_t, int64_t>{0, 1}));
  // B's rows only.
  TrainBatch only_b = MicroBatch(2, dims_.vocab, 2);
  only_b.row_task = {1, 1};
  run(only_b, 2);
  EXPECT_EQ(position(0), (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_EQ(position(1), (std::pair<int64_t, int64_t>{1, 0}));
  TaskState got[2];
  size_t losses[2] = {0, 0};
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    got[t] = jobs[t]->state;
    losses[t] = jobs[t]->losses.size();
  }
  EXPECT_EQ(losses[0], 1u);
  EXPECT_EQ(losses[1], 2u);
  EXPECT_EQ(got[0].params.layers[0].q_a.MaxAbsDiff(got[1].params.layers[0].q_a), 0.0);
  EXPECT_EQ(got[0].params.layers[0].q_b.MaxAbsDiff(got[1].params.layers[0].q_b), 0.0);
}

// Ordered accumulation of concurrent micro-batches (micro_index) is for
// single-job requests: a joint request carrying one fails its optimizer_step
// with an error naming it, and neither job accumulates anything.
TEST_F(LlamaKernelsTest, JointRequestWithMicroIndexFailsCleanly) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok()) << tid.status();
  auto init_a = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7);
  auto init_b = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 11);
  ASSERT_TRUE(init_a.ok() && init_b.ok());
  TaskState* both[] = {&*init_a, &*init_b};
  ASSERT_TRUE(ShareLora(both).ok());
  std::shared_ptr<LlamaTrainJob> jobs[2] = {std::make_shared<LlamaTrainJob>(), std::make_shared<LlamaTrainJob>()};
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    jobs[t]->state = t == 0 ? *init_a : *init_b;
  }
  auto id = gmg_->Instantiate(
      LlamaTrainStep(*tid, 4, 5, 4, 6, PriorityClass::kOffline, clock_.Now(), /*tasks=*/2));
  ASSERT_TRUE(id.ok()) << id.status();
  runner_->SetTrainRequest(*id, LlamaTrainRequest{.job = jobs[0],
                                                  .batch = Mixed(MicroBatch(2, dims_.vocab, 0),
                                                                 MicroBatch(2, dims_.vocab, 1)),
                                                  .micro_index = 0,
                                                  .partners = {jobs[1]}});
  auto r = Run(*id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, InstanceState::kFailed);
  EXPECT_THAT(r->failure, HasSubstr("micro_index 0 on a joint request of 2 jobs"));
  runner_->EraseRequest(*id);
  for (int t = 0; t < 2; ++t) {
    absl::MutexLock l(&jobs[t]->mu);
    EXPECT_EQ(jobs[t]->state.step, 0) << t;
    EXPECT_EQ(jobs[t]->state.accumulated, 0) << t;
    EXPECT_TRUE(jobs[t]->pending.empty()) << t;
    EXPECT_TRUE(jobs[t]->losses.empty()) << t;
  }
  ReleaseAndCheckBaseline(r->produced);
}

TEST_F(LlamaKernelsTest, TrainingInstanceWithMismatchedRankFailsCleanly) {
  auto tpl = BuildLlamaTrainTemplate(dims_);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto tid = gmg_->RegisterTemplate(*tpl);
  ASSERT_TRUE(tid.ok());
  auto init = TaskState::Init(dims_, LoraConfig{4, 8.0}, 3, 7);
  ASSERT_TRUE(init.ok());
  auto job = std::make_shared<LlamaTrainJob>();
  {
    absl::MutexLock l(&job->mu);
    job->state = *init;
  }
  auto id = gmg_->Instantiate(
      LlamaTrainStep(*tid, 2, 5, /*rank=*/8, 3, PriorityClass::kOffline, clock_.Now()));
  ASSERT_TRUE(id.ok()) << id.status();
  runner_->SetTrainRequest(*id, LlamaTrainRequest{job, MicroBatch(2, dims_.vocab, 0)});
  auto r = Run(*id);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state, InstanceState::kFailed);
  EXPECT_THAT(r->failure, HasSubstr("LoRA rank R = 8"));
  runner_->EraseRequest(*id);
  absl::MutexLock l(&job->mu);
  EXPECT_EQ(job->state.step, 0);
  EXPECT_EQ(job->state.accumulated, 0);
  ReleaseAndCheckBaseline(r->produced);
}

// The real kernels, except that the seeded "hold" nodes stop inside their
// kernel until the test releases them: a deterministic instant at which that
// node is running (the kernel itself then runs unchanged).
class HoldingRunner final : public KernelRunner {
 public:
  explicit HoldingRunner(KernelRunner* inner) : inner_(inner) {}
  // Before the node can run.
  void Hold(NodeId n) {
    absl::MutexLock l(&mu_);
    holds_.emplace(n.value(), std::make_unique<Gate>());
  }
  bool held(NodeId n) {
    absl::MutexLock l(&mu_);
    return holds_.contains(n.value());
  }
  // Waits until `n` (held, and running by the GMG) is inside its kernel.
  void AwaitEntered(NodeId n) { GateOf(n)->entered.WaitForNotification(); }
  void Release(NodeId n) { GateOf(n)->release.Notify(); }
  // Lets every held kernel go: a failed assertion returns early, and the
  // executors' threads must finish their kernels before they can join.
  void ReleaseAll() {
    absl::MutexLock l(&mu_);
    for (auto& [node, gate] : holds_) {
      if (!gate->release.HasBeenNotified()) gate->release.Notify();
    }
  }

  absl::Status Run(const KernelCall& call) override {
    Gate* g = nullptr;
    {
      absl::MutexLock l(&mu_);
      auto it = holds_.find(call.node.value());
      if (it != holds_.end()) g = it->second.get();
    }
    if (g != nullptr) {
      g->entered.Notify();
      g->release.WaitForNotification();
    }
    return inner_->Run(call);
  }

 private:
  struct Gate {
    absl::Notification entered, release;
  };
  Gate* GateOf(NodeId n) {
    absl::MutexLock l(&mu_);
    return holds_.at(n.value()).get();
  }
  KernelRunner* inner_;
  absl::Mutex mu_;
  std::map<uint64_t, std::unique_ptr<Gate>> holds_ ABSL_GUARDED_BY(mu_);
};

using Buf = StoredBuf;

// The executors' acceptance check: at seeded instants of a real run on 4 CPU devices
// (tiny Llama prefills placed pp2 on four different device pairs, decode
// steps on their KV checkpoints, LoRA training micro-batches; transfers
// between devices), paused, the simulator's reconstruction from the GMG
// snapshot names the same running operator on every device as the executors
// run, and the same resident buffers (operator outputs by producer, output
// and device; checkpoints by device) as the executors' tensor and checkpoint
// stores hold. The instants: seeded nodes held inside their kernel (so that
// node is running for sure, with whatever else runs elsewhere), and seeded
// owner steps.
TEST(LlamaSnapshotTest, SimulatorReconstructionMatchesTheExecutorsOnFourDevices) {
  constexpr int kDevices = 4;
  constexpr int kConversations = 4;
  constexpr int kRounds = 4;  // prefill round, then decode rounds
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok()) << dims.status();
  auto weights = LlamaWeights::FromSeed(*dims, 77);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto tpl = BuildLlamaTemplates(*dims);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto train_tpl = BuildLlamaTrainTemplate(*dims);
  ASSERT_TRUE(train_tpl.ok()) << train_tpl.status();
  GlobalMappingGraph g(Devices(kDevices));
  const TemplateId pre = *g.RegisterTemplate(tpl->prefill);
  const TemplateId dec = *g.RegisterTemplate(tpl->decode);
  const TemplateId train = *g.RegisterTemplate(*train_tpl);
  for (uint16_t d = 0; d < kDevices; ++d) {
    for (const GraphTemplate* t : {tpl->prefill.get(), train_tpl->get()}) {
      for (const OpSpec& op : t->ops()) {
        if (op.weight_key.empty() || g.HasWeights(DeviceId(d), op.weight_key)) continue;
        ASSERT_TRUE(g.LoadWeights(DeviceId(d), op.weight_key, op.weight_bytes).ok());
      }
    }
  }
  auto llama = LlamaKernelRunner::Create(*weights, *dims);
  ASSERT_TRUE(llama.ok()) << llama.status();
  absl::Mutex mu;
  std::map<uint64_t, int64_t> sampled;
  (*llama)->SetTokenSink([&](InstanceId inst, const Tensor& t) {
    absl::MutexLock l(&mu);
    sampled[inst.value()] = t.ToInt64().at(0);
  });
  HoldingRunner kernels(llama->get());
  auto init = TaskState::Init(*dims, LoraConfig{4, 8.0}, 3, 7);
  ASSERT_TRUE(init.ok()) << init.status();
  auto job = std::make_shared<LlamaTrainJob>();
  {
    absl::MutexLock l(&job->mu);
    job->state = *init;
  }
  SteadyClock clock;
  LlamaTransferBackend transfers;
  ExecutorSet exec(&g, &clock, &kernels, &transfers);
  absl::Cleanup release_holds = [&kernels] { kernels.ReleaseAll(); };
  OpEstimator op_est;
  TransferEstimator xfer_est(g.accelerators());
  SimContext ctx(&g.templates(), &op_est, &xfer_est);

  std::mt19937_64 hold_rng(20261130);  // which nodes are held (deterministic)
  std::mt19937_64 step_rng(5);         // which owner steps are looked at
  int holds_total = 0;
  int instants = 0, held_instants = 0;
  size_t max_resident = 0;
  bool saw_transfer_copy = false, saw_checkpoint = false;
  // Pauses the executors and compares the reconstruction with them.
  auto check = [&](const std::string& where) {
    std::vector<Feedback> fb;
    std::set<Buf> in_exec;
    ExpectReconstructionMatches(exec, g, ctx, clock, &fb, where, &in_exec);
    max_resident = std::max(max_resident, in_exec.size());
    for (const Buf& b : in_exec) {
      if (std::get<1>(b) < 0) {
        saw_checkpoint = true;
        continue;
      }
      const OpNode* p = g.FindNode(NodeId(std::get<0>(b)));
      if (p != nullptr && p->device.value() != std::get<2>(b)) saw_transfer_copy = true;
    }
    ++instants;
    exec.Resume();
  };

  struct Conv {
    std::vector<CheckpointId> kv;
    int64_t context = 0;
    int64_t last = 0;
  };
  std::vector<Conv> convs(kConversations);
  // pp2 slot pairs: every device hosts a first and a second half.
  const DeviceId pairs[kConversations][2] = {{DeviceId(0), DeviceId(1)},
                                             {DeviceId(2), DeviceId(3)},
                                             {DeviceId(1), DeviceId(2)},
                                             {DeviceId(3), DeviceId(0)}};
  for (int round = 0; round < kRounds; ++round) {
    std::vector<InstanceId> ids;
    std::vector<NodeId> issued;
    auto issue = [&](InstanceId id, const DeviceId* slots) {
      const Instance* in = g.FindInstance(id);
      const CandidatePartition* pp2 = nullptr;
      for (const CandidatePartition& p : in->tpl->partitions()) {
        if (p.name == "pp2") pp2 = &p;
      }
      ASSERT_NE(pp2, nullptr);
      auto n = IssueByPartition(g, id, *pp2, std::span<const DeviceId>(slots, 2), 0, clock.Now());
      ASSERT_TRUE(n.ok()) << n.status();
      issued.insert(issued.end(), n->begin(), n->end());
      ids.push_back(id);
    };
    for (int c = 0; c < kConversations; ++c) {
      InstanceSpec spec;
      std::vector<int64_t> tokens;
      if (round == 0) {
        tokens = Prompt(6 + c, dims->vocab);
        spec.template_id = pre;
        spec.bindings = {{"B", 1}, {"S", static_cast<int64_t>(tokens.size())}};
        spec.priority_class = PriorityClass::kOnline;
        spec.arrival = clock.Now();
      } else {
        tokens = {convs[c].last};
        spec = LlamaDecodeStep(dec, convs[c].context, convs[c].kv, PriorityClass::kOnline, clock.Now());
      }
      auto id = g.Instantiate(spec);
      ASSERT_TRUE(id.ok()) << id.status();
      (*llama)->SetRequest(*id, LlamaRequest{Tensor::FromInt64(tokens, {1, static_cast<int64_t>(tokens.size())}),
                                             SamplingParams{}});
      issue(*id, pairs[c]);
      if (HasFatalFailure()) return;
    }
    {
      // One training micro-batch per round, pp2 on (3, 1).
      const DeviceId slots[2] = {DeviceId(3), DeviceId(1)};
      auto id = g.Instantiate(LlamaTrainStep(train, 2, 5, 4, 3, PriorityClass::kOffline, clock.Now()));
      ASSERT_TRUE(id.ok()) << id.status();
      (*llama)->SetTrainRequest(*id, LlamaTrainRequest{job, MicroBatch(2, dims->vocab, static_cast<uint64_t>(round))});
      issue(*id, slots);
      if (HasFatalFailure()) return;
    }
    // Seeded holds: three compute nodes of this round.
    std::vector<NodeId> compute;
    for (InstanceId id : ids) {
      for (const OpNode& n : g.FindInstance(id)->nodes) compute.push_back(n.id);
    }
    std::vector<NodeId> holds;
    for (int h = 0; h < 3; ++h) {
      const NodeId n = compute[hold_rng() % compute.size()];
      if (kernels.held(n)) continue;
      kernels.Hold(n);
      holds.push_back(n);
      ++holds_total;
    }
    for (NodeId n : issued) exec.NodeIssued(n);
    ASSERT_TRUE(exec.Dispatch(clock.Now()).ok());
    std::vector<Feedback> fb;
    std::set<uint64_t> released;
    std::map<uint64_t, RetiredInstance> retired;
    while (retired.size() < ids.size()) {
      // A held node the GMG shows running is inside (or entering) its
      // kernel: wait for it there, look, let it go.
      bool progressed = false;
      for (NodeId n : holds) {
        if (released.contains(n.value())) continue;
        const OpNode* on = g.FindNode(n);
        ASSERT_NE(on, nullptr);
        if (on->state != NodeState::kRunning) continue;
        kernels.AwaitEntered(n);
        check(StrCat("round ", round, ", node ", n.value(), " held"));
        if (HasFatalFailure()) return;
        ++held_instants;
        released.insert(n.value());
        kernels.Release(n);
        progressed = true;
      }
      if (progressed) continue;
      ASSERT_TRUE(exec.WaitForCompletion(absl::Seconds(60)));
      ASSERT_TRUE(exec.AdvanceTo(clock.Now(), &fb).ok());
      if (step_rng() % 3 == 0) {
        check(StrCat("round ", round, ", step"));
        if (HasFatalFailure()) return;
      }
      for (RetiredInstance& r : g.TakeRetired()) retired.emplace(r.id.value(), std::move(r));
    }
    for (NodeId n : holds) EXPECT_TRUE(released.contains(n.value())) << "hold " << n.value() << " never ran";
    for (int c = 0; c < kConversations; ++c) {
      const RetiredInstance& r = retired.at(ids[c].value());
      ASSERT_EQ(r.state, InstanceState::kDone) << r.failure;
      if (round == 0) {
        convs[c].kv = r.produced;
        convs[c].context = 6 + c;
      } else {
        ++convs[c].context;
      }
      absl::MutexLock l(&mu);
      convs[c].last = sampled.at(ids[c].value());
    }
    ASSERT_EQ(retired.at(ids.back().value()).state, InstanceState::kDone) << retired.at(ids.back().value()).failure;
    for (InstanceId id : ids) (*llama)->EraseRequest(id);
    check(StrCat("after round ", round));  // idle: only the KV checkpoints stay
    if (HasFatalFailure()) return;
  }
  for (const Conv& c : convs) {
    for (CheckpointId k : c.kv) ASSERT_TRUE(g.ReleaseCheckpoint(k).ok());
  }
  ASSERT_TRUE(exec.Dispatch(clock.Now()).ok());
  check("all released");
  EXPECT_TRUE(exec.StoredBuffers().empty());
  EXPECT_EQ(held_instants, holds_total);
  EXPECT_GE(holds_total, kRounds * 2);
  EXPECT_GE(instants, held_instants + kRounds);
  // The instants saw what the test is about.
  EXPECT_TRUE(saw_checkpoint);
  EXPECT_TRUE(saw_transfer_copy);
  EXPECT_GT(max_resident, static_cast<size_t>(kConversations * 2));
  EXPECT_GT(exec.completed_transfers(), 0);
  EXPECT_EQ(exec.failed_nodes(), 0);
}

// A tensor payload is the tensor's own shared state, not a wrapper around it:
// the buffer, the buffer the transfer backend shared it into and the handles
// read from either all hold the one tensor (one owner count), and it is freed
// only once the last of them lets go, whichever buffer goes first.
TEST(LlamaPayloadTest, ATensorReadThroughTwoBuffersIsFreedOnlyAfterBoth) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  Buffer a;
  SetTensorPayload(a, Tensor::FromFloat(values, {1, 3}));
  ASSERT_EQ(a.kind, kTensorPayload);
  const std::weak_ptr<void> state = a.payload;
  EXPECT_EQ(state.use_count(), 1);  // the buffer alone: no wrapper owns it

  Buffer b;
  TransferCall call;
  call.from = &a;
  call.to = &b;
  LlamaTransferBackend transfers;
  ASSERT_TRUE(transfers.Send(call).ok());
  ASSERT_EQ(b.kind, kTensorPayload);
  Tensor first = TensorPayloadOf(a);
  EXPECT_EQ(state.use_count(), 3);  // a, b and the handle

  a = Buffer();  // the producer's copy goes first
  EXPECT_EQ(first.ToFloat(), values);
  Tensor second = TensorPayloadOf(b);
  b = Buffer();
  EXPECT_EQ(second.ToFloat(), values);
  first = Tensor();
  EXPECT_FALSE(state.expired());
  EXPECT_EQ(second.ToFloat(), values);
  second = Tensor();
  EXPECT_TRUE(state.expired());
}

TEST(LlamaPayloadTest, OtherPayloadKindsReadAsNoTensor) {
  Buffer kv;
  SetKvCachePayload(kv, std::make_shared<KvCache>());
  EXPECT_FALSE(TensorPayloadOf(kv).defined());
  EXPECT_FALSE(TensorPayloadOf(Buffer()).defined());
  Buffer t;
  SetTensorPayload(t, Tensor());  // an undefined tensor: no state to hold
  EXPECT_FALSE(TensorPayloadOf(t).defined());
  EXPECT_EQ(KvCachePayloadOf(t), nullptr);
}

TEST(LlamaKernelRunnerTest, RejectsDimsThatDoNotMatchTheWeights) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto w = LlamaWeights::FromSeed(*dims, 1);
  ASSERT_TRUE(w.ok());
  LlamaDims other = *dims;
  other.fusion = 1;
  auto r = LlamaKernelRunner::Create(*w, other);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("do not match"));
}

}  // namespace
}  // namespace slicesched::executor
