#include "slicesched/server/batch_runner.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

std::string FinishReason(GenerationEnd end) { return end == GenerationEnd::kStop ? "stop" : "length"; }

// A refusal of Generate that no retry can fix: the request gets an error
// result. Anything else (draining, a full queue, a stopped master) waits.
bool RefusedForGood(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsNotFound(s) || absl::IsOutOfRange(s) ||
         (absl::IsResourceExhausted(s) && absl::StrContains(s.message(), "KV cache"));
}

}  // namespace

BatchRunner::BatchRunner(Master* master, jobs::BatchManager* batches, BatchRunnerOptions options)
    : master_(master), batches_(batches), options_(options) {}

BatchRunner::~BatchRunner() { Stop(); }

void BatchRunner::Start() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Run(); });
}

void BatchRunner::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    wake_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&step_mu_);
  for (auto& [key, f] : in_flight_) (void)master_->CancelGeneration(f.record->id());
  in_flight_.clear();
  cursor_.clear();
}

void BatchRunner::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

BatchRunnerStats BatchRunner::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

uint64_t BatchRunner::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

bool BatchRunner::AwaitStepAfter(uint64_t after, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto later = [this, after]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return steps_ > after; };
  return mu_.AwaitWithTimeout(absl::Condition(&later), timeout);
}

void BatchRunner::Run() {
  while (true) {
    if (absl::Status s = Step(); !s.ok()) spdlog::warn("batch runner: {}", s.ToString());
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&wake_), options_.poll);
    wake_ = false;
    if (stop_) return;
  }
}

absl::StatusOr<bool> BatchRunner::Collect(const InFlight& f) {
  bool done = false;
  GenerationEnd end = GenerationEnd::kNone;
  std::string message;
  const std::vector<GeneratedToken> tokens = f.record->WaitFrom(0, absl::ZeroDuration(), &done, &end, &message);
  StoredBatchResult r;
  r.index = f.index;
  r.prompt_tokens = static_cast<int64_t>(f.request.prompt_tokens.size());
  if (end == GenerationEnd::kLength || end == GenerationEnd::kStop) {
    jobs::CompletionResult c;
    for (const GeneratedToken& t : tokens) c.tokens.push_back(t.token);
    c.finish_reason = FinishReason(end);
    if (f.tokenizer != nullptr) {
      absl::StatusOr<std::string> text = f.tokenizer->Decode(c.tokens);
      if (text.ok()) {
        c.text = *std::move(text);
        // A stop string longer than one token cuts the text where it
        // first appears (token_ids keep every generated token).
        for (const std::string& stop : f.request.stop_text) {
          if (const size_t at = c.text.find(stop); at != std::string::npos) {
            c.text.resize(at);
            c.finish_reason = "stop";
          }
        }
      }
    }
    c.request_id = StrCat("cmpl-", f.batch, "-", f.index);
    c.created_unix_s = batches_->Now() / 1000;
    r.ok = true;
    r.completion_tokens = static_cast<int64_t>(c.tokens.size());
    r.body_json = jobs::CompletionBody(f.request, c);
  } else if (end == GenerationEnd::kError) {
    r.ok = false;
    r.body_json = jobs::BatchErrorBody("generation_failed", message);
  } else {
    // Cancelled by the master (drain, shutdown) rather than by us: run again.
    return false;
  }
  absl::Status s = batches_->Record(f.batch, r);
  if (absl::IsFailedPrecondition(s) || absl::IsAlreadyExists(s)) return true;  // batch over / already stored
  SLICESCHED_RETURN_IF_ERROR(s);
  absl::MutexLock lock(&mu_);
  ++stats_.requests_done;
  if (!r.ok) ++stats_.requests_failed;
  stats_.tokens += static_cast<uint64_t>(r.completion_tokens);
  return true;
}

void BatchRunner::CancelInFlight(uint64_t batch) {
  for (auto it = in_flight_.lower_bound({batch, std::numeric_limits<int64_t>::min()});
       it != in_flight_.end() && it->first.first == batch;) {
    (void)master_->CancelGeneration(it->second.record->id());
    it = in_flight_.erase(it);
  }
  cursor_.erase(batch);
}

absl::StatusOr<bool> BatchRunner::Fill(const StoredBatch& b, int* free_slots, const TokenizerMap* tokenizers) {
  auto [cur, inserted] = cursor_.emplace(b.id, -1);
  const int64_t fetch = *free_slots + static_cast<int64_t>(in_flight_.size());
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<StoredBatchRequest> pending, batches_->Pending(b.id, cur->second, fetch));
  for (const StoredBatchRequest& p : pending) {
    if (*free_slots <= 0) break;
    if (in_flight_.contains({b.id, p.index})) {
      cur->second = p.index;
      continue;
    }
    absl::StatusOr<BatchRequest> req = DecodeBatchRequest(p.request_json);
    if (!req.ok()) {
      (void)batches_->Record(b.id, StoredBatchResult{.index = p.index,
                                                     .ok = false,
                                                     .body_json = jobs::BatchErrorBody("invalid_request",
                                                                                       std::string(req.status().message()))});
      cur->second = p.index;
      continue;
    }
    GenerateArgs args;
    args.deployment = req->model;
    args.prompt = req->prompt_tokens;
    args.max_tokens = static_cast<uint32_t>(std::min<int64_t>(req->max_tokens, UINT32_MAX));
    args.temperature = req->temperature;
    args.top_p = req->top_p;
    args.seed = BatchRequestSeed(*req);
    args.priority_class = PriorityClass::kOffline;
    args.stop_tokens = req->stop_tokens;
    args.client_tag = StrCat(kBatchClientTagPrefix, b.id, "/", req->custom_id);
    if (b.deadline_unix_ms > 0) {
      const int64_t left = std::max<int64_t>(b.deadline_unix_ms - batches_->Now(), 1);
      args.deadline_ms = static_cast<uint32_t>(std::min<int64_t>(left, UINT32_MAX));
      args.priority = 1;  // ahead of offline work without a deadline
    }
    absl::StatusOr<std::shared_ptr<GenerationRecord>> rec = master_->Generate(std::move(args));
    if (!rec.ok()) {
      if (!RefusedForGood(rec.status())) return false;
      (void)batches_->Record(b.id, StoredBatchResult{.index = p.index,
                                                     .ok = false,
                                                     .body_json = jobs::BatchErrorBody(
                                                         "invalid_request", std::string(rec.status().message())),
                                                     .prompt_tokens = static_cast<int64_t>(req->prompt_tokens.size())});
      cur->second = p.index;
      continue;
    }
    (*rec)->OnDone([this] { Wake(); });
    auto tok = tokenizers->find(req->model);
    in_flight_.emplace(std::make_pair(b.id, p.index),
                       InFlight{b.id, p.index, *std::move(req), *rec,
                                tok == tokenizers->end() ? nullptr : tok->second});
    cur->second = p.index;
    --*free_slots;
  }
  return true;
}

absl::Status BatchRunner::Step() {
  absl::Status s;
  {
    absl::MutexLock step(&step_mu_);
    s = StepLocked();
  }
  absl::MutexLock lock(&mu_);
  ++steps_;
  return s;
}

absl::Status BatchRunner::StepLocked() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<StoredBatch> active, batches_->Active());
  std::set<uint64_t> active_ids;
  for (const StoredBatch& b : active) active_ids.insert(b.id);

  // 1. Finished requests, and requests of batches that are over.
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& f = it->second;
    if (!active_ids.contains(f.batch)) {
      (void)master_->CancelGeneration(f.record->id());
      it = in_flight_.erase(it);
      continue;
    }
    bool done = false;
    GenerationEnd end = GenerationEnd::kNone;
    std::string message;
    (void)f.record->WaitFrom(std::numeric_limits<size_t>::max(), absl::ZeroDuration(), &done, &end, &message);
    if (!done) {
      ++it;
      continue;
    }
    SLICESCHED_ASSIGN_OR_RETURN(bool recorded, Collect(f));
    if (!recorded) {
      int64_t& cur = cursor_[f.batch];
      cur = std::min(cur, f.index - 1);
      absl::MutexLock lock(&mu_);
      ++stats_.requeued;
    }
    it = in_flight_.erase(it);
  }
  for (auto it = cursor_.begin(); it != cursor_.end();) {
    it = active_ids.contains(it->first) ? std::next(it) : cursor_.erase(it);
  }

  // 2. Batches that are over: expired, or complete.
  const int64_t now = batches_->Now();
  std::vector<StoredBatch> running;
  for (const StoredBatch& b : active) {
    SLICESCHED_ASSIGN_OR_RETURN(StoredBatch fresh, batches_->Get(b.id));
    if (fresh.deadline_unix_ms > 0 && now >= fresh.deadline_unix_ms) {
      CancelInFlight(b.id);
      const std::string why = StrCat("the completion window of ", fresh.completion_window_s, " s passed with ",
                                     fresh.total - fresh.succeeded - fresh.failed, " request(s) not done");
      (void)batches_->Finish(b.id, jobs::kBatchExpired, why);
      spdlog::info("batch {} expired: {}", b.id, why);
      continue;
    }
    if (fresh.succeeded + fresh.failed >= fresh.total) {
      CancelInFlight(b.id);
      (void)batches_->Finish(b.id, jobs::kBatchCompleted,
                             StrCat(fresh.succeeded, " succeeded, ", fresh.failed, " failed"));
      spdlog::info("batch {} completed: {} succeeded, {} failed, {} tokens", b.id, fresh.succeeded, fresh.failed,
                   fresh.completion_tokens);
      continue;
    }
    running.push_back(std::move(fresh));
  }

  // 3. Top the master up, earliest deadline first.
  int free_slots = options_.max_inflight - static_cast<int>(in_flight_.size());
  TokenizerMap tokenizers;
  if (free_slots > 0 && !running.empty()) {
    auto deployments = master_->ListDeployments();
    if (deployments.ok()) {
      for (const DeploymentInfo& d : *deployments) {
        if (d.tokenizer != nullptr) tokenizers.emplace(d.spec.name, d.tokenizer);
      }
    }
  }
  for (const StoredBatch& b : running) {
    if (free_slots <= 0) break;
    SLICESCHED_ASSIGN_OR_RETURN(bool more, Fill(b, &free_slots, &tokenizers));
    if (!more) break;
  }
  absl::MutexLock lock(&mu_);
  stats_.in_flight = static_cast<uint32_t>(in_flight_.size());
  return absl::OkStatus();
}

}  // namespace slicesched
