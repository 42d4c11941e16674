// The batch runner: runs the requests of in_progress batches
// (jobs/batch_manager.h) as offline Generate requests of the master, so they
// enter the GMG through the same admission and scheduling as any offline
// request and only fill the time online serving leaves idle.
//
// At most `max_inflight` batch requests are in the master at once (the rest
// wait in SQLite, so a batch of 100,000 requests costs the GMG nothing until
// it runs); batches are served earliest deadline first, then in submit
// order. Each request runs with the deadline of its batch (submit time +
// completion window), which the scheduler's offline aging respects
// (sched/slice_scheduler.h: work within offline_aging of its deadline goes
// first), at priority 1 within the offline class when it has one (ahead of
// offline work without a deadline), and with a seed of its own (BatchRequestSeed),
// so a request that runs again after a crash samples the same tokens.
//
// A request counts as done when its result is stored (BatchManager::Record).
// Generation failures become error results ("generation_failed"); a request
// the master refuses for good (unknown deployment, prompt too long) becomes
// an error result too; a refusal that may pass (draining, a full queue)
// leaves the request to the next step. A batch whose requests all have
// results is completed; one past its deadline expires, and its in-flight
// requests are cancelled, as are those of a cancelled batch.
//
// Stop() cancels the in-flight requests without recording them: after a
// restart they run again.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "slicesched/jobs/batch_manager.h"
#include "slicesched/server/master.h"

namespace slicesched {

struct BatchRunnerOptions {
  int max_inflight = 16;  // batch requests in the master at once
  absl::Duration poll = absl::Milliseconds(250);  // longest wait between steps
};

// Counters since start, for metrics.
struct BatchRunnerStats {
  uint64_t requests_done = 0;    // results recorded (ok or error)
  uint64_t requests_failed = 0;  // of which errors
  uint64_t tokens = 0;           // generated tokens recorded
  uint64_t requeued = 0;         // in-flight requests the master ended without a result
  uint32_t in_flight = 0;
};

class BatchRunner {
 public:
  BatchRunner(Master* master, jobs::BatchManager* batches, BatchRunnerOptions options = {});
  ~BatchRunner();  // Stop()

  // Runs Step() on a thread of its own until Stop().
  void Start();
  void Stop();
  // Wakes the thread now (a batch was submitted or cancelled).
  void Wake();

  // One pass: records finished requests, finishes, expires and cancels
  // batches, and tops the master up with pending requests. Start()'s thread
  // calls it; tests may drive it directly instead.
  absl::Status Step();

  BatchRunnerStats stats() const;

  // Steps completed so far, and a wait for a later one: true once more than
  // `after` steps have completed, false when `timeout` passed first. For
  // callers that watch a batch progress (tests, the demo) without sleeping.
  uint64_t steps() const;
  bool AwaitStepAfter(uint64_t after, absl::Duration timeout) const;

 private:
  struct InFlight {
    uint64_t batch = 0;
    int64_t index = 0;
    BatchRequest request;
    std::shared_ptr<GenerationRecord> record;
    std::shared_ptr<const jobs::Tokenizer> tokenizer;  // its deployment's, to decode the answer
  };
  using TokenizerMap = std::map<std::string, std::shared_ptr<const jobs::Tokenizer>>;

  void Run();
  absl::Status StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Records the result of a finished request; false when it must run again.
  absl::StatusOr<bool> Collect(const InFlight& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Starts pending requests of `b`; false when the master refused for now.
  absl::StatusOr<bool> Fill(const StoredBatch& b, int* free_slots, const TokenizerMap* tokenizers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  void CancelInFlight(uint64_t batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);

  Master* const master_;
  jobs::BatchManager* const batches_;
  const BatchRunnerOptions options_;

  // Step's own state (one Step at a time: step_mu_).
  absl::Mutex step_mu_;
  std::map<std::pair<uint64_t, int64_t>, InFlight> in_flight_ ABSL_GUARDED_BY(step_mu_);
  std::map<uint64_t, int64_t> cursor_ ABSL_GUARDED_BY(step_mu_);  // batch -> last index started

  mutable absl::Mutex mu_;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  BatchRunnerStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace slicesched
