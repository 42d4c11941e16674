#include "slicesched/server/batch_service.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <utility>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/server/services.h"

namespace slicesched {

v1::BatchState ToProtoBatchState(std::string_view state) {
  if (state == jobs::kBatchInProgress) return v1::BATCH_STATE_IN_PROGRESS;
  if (state == jobs::kBatchCompleted) return v1::BATCH_STATE_COMPLETED;
  if (state == jobs::kBatchExpired) return v1::BATCH_STATE_EXPIRED;
  if (state == jobs::kBatchCancelled) return v1::BATCH_STATE_CANCELLED;
  if (state == jobs::kBatchFailed) return v1::BATCH_STATE_FAILED;
  return v1::BATCH_STATE_UNSPECIFIED;
}

std::optional<BatchModelInfo> BatchModelInfoOf(Master* master, std::string_view name) {
  auto deployments = master->ListDeployments();
  if (!deployments.ok()) return std::nullopt;
  for (const DeploymentInfo& d : *deployments) {
    if (d.spec.name != name) continue;
    auto devices = master->Devices();
    if (!devices.ok() || d.kv_bytes_per_token <= 0) return std::nullopt;
    int64_t room = 0;
    for (const DeviceInfo& dev : *devices) {
      room = std::max<int64_t>(room, dev.spec.memory.count() - dev.memory.weights.count());
    }
    int max_slots = 1;
    for (const auto& [partition, slots] : d.partitions) max_slots = std::max(max_slots, slots);
    BatchModelInfo info;
    info.vocab = d.spec.model.vocab;
    info.max_context_tokens = room * max_slots / d.kv_bytes_per_token;
    if (d.tokenizer != nullptr) {
      info.has_tokenizer = true;
      info.encode = [t = d.tokenizer](std::string_view text) { return t->Encode(text); };
    }
    return info;
  }
  return std::nullopt;
}

absl::StatusOr<MetricsSnapshot::Batches> BatchMetrics(jobs::BatchManager* batches, const BatchRunner* runner) {
  MetricsSnapshot::Batches m;
  SLICESCHED_ASSIGN_OR_RETURN(auto counts, batches->store()->CountBatchesByState());
  for (std::string_view state : {jobs::kBatchInProgress, jobs::kBatchCompleted, jobs::kBatchExpired,
                                 jobs::kBatchCancelled, jobs::kBatchFailed}) {
    int64_t n = 0;
    for (const auto& [s, c] : counts) {
      if (s == state) n = c;
    }
    m.by_state.emplace_back(std::string(state), n);
  }
  if (runner != nullptr) {
    const BatchRunnerStats st = runner->stats();
    m.requests_ok = st.requests_done - st.requests_failed;
    m.requests_error = st.requests_failed;
    m.tokens = st.tokens;
    m.in_flight = st.in_flight;
  }
  return m;
}

void BatchToProto(const StoredBatch& b, int64_t now_unix_ms, v1::BatchJob* out) {
  out->set_id(b.id);
  out->set_state(ToProtoBatchState(b.state));
  out->set_deployment(b.deployment);
  out->set_tenant(b.tenant);
  out->set_total(b.total);
  out->set_rejected(b.rejected);
  out->set_succeeded(b.succeeded);
  out->set_failed(b.failed);
  out->set_prompt_tokens(b.prompt_tokens);
  out->set_completion_tokens(b.completion_tokens);
  out->set_completion_window_s(b.completion_window_s);
  out->set_deadline_unix_ms(b.deadline_unix_ms);
  out->set_created_unix_ms(b.created_unix_ms);
  out->set_updated_unix_ms(b.updated_unix_ms);
  out->set_finished_unix_ms(b.finished_unix_ms);
  out->set_message(b.message);
  out->set_metadata_json(b.metadata_json);
  const jobs::BatchProgress p = jobs::ProgressOf(b, now_unix_ms);
  out->set_tokens_per_second(p.tokens_per_second);
  out->set_eta_s(p.eta_s);
}

grpc::Status BatchServiceImpl::Submit(grpc::ServerContext*, grpc::ServerReader<v1::SubmitBatchChunk>* reader,
                                      v1::SubmitBatchResponse* out) {
  jobs::BatchSubmit submit;
  v1::SubmitBatchChunk chunk;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      submit.deployment = chunk.deployment();
      submit.strict = chunk.strict();
      submit.completion_window = chunk.completion_window();
      submit.tenant = chunk.tenant().empty() ? "default" : chunk.tenant();
      submit.metadata_json = chunk.metadata_json().empty() ? "{}" : chunk.metadata_json();
      submit.validate_only = chunk.validate_only();
      first = false;
    }
    if (submit.jsonl.size() + chunk.data().size() > max_input_bytes_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("data: the input file is longer than ", max_input_bytes_,
                                 " bytes; split it into several batches"));
    }
    submit.jsonl += chunk.data();
  }
  if (first) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "data: no input file was sent");
  if (runner_ == nullptr && !submit.validate_only) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "batches cannot run on this daemon: its devices execute no real operators (virtual "
                        "devices, or a build without LibTorch), so there are no tokens to generate");
  }
  auto r = batches_->Submit(submit);
  if (!r.ok()) return ToGrpc(r.status());
  out->set_accepted(r->accepted);
  out->set_rejected(static_cast<int64_t>(r->rejected.size()));
  for (size_t i = 0; i < r->rejected.size() && i < kMaxBatchErrorsListed; ++i) {
    out->add_rejected_lines(r->rejected[i].message);
  }
  if (r->batch_id != 0) {
    auto b = batches_->Get(r->batch_id);
    if (!b.ok()) return ToGrpc(b.status());
    BatchToProto(*b, batches_->Now(), out->mutable_batch());
    runner_->Wake();
  }
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::Get(grpc::ServerContext*, const v1::GetBatchRequest* req, v1::BatchJob* out) {
  if (req->batch_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "batch_id: must be set");
  auto b = batches_->Get(req->batch_id());
  if (!b.ok()) return ToGrpc(b.status());
  BatchToProto(*b, batches_->Now(), out);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::List(grpc::ServerContext*, const v1::ListBatchesRequest* req,
                                    v1::ListBatchesResponse* out) {
  BatchFilter filter;
  switch (req->state()) {
    case v1::BATCH_STATE_UNSPECIFIED: break;
    case v1::BATCH_STATE_IN_PROGRESS: filter.states = {std::string(jobs::kBatchInProgress)}; break;
    case v1::BATCH_STATE_COMPLETED: filter.states = {std::string(jobs::kBatchCompleted)}; break;
    case v1::BATCH_STATE_EXPIRED: filter.states = {std::string(jobs::kBatchExpired)}; break;
    case v1::BATCH_STATE_CANCELLED: filter.states = {std::string(jobs::kBatchCancelled)}; break;
    case v1::BATCH_STATE_FAILED: filter.states = {std::string(jobs::kBatchFailed)}; break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("state: unknown value ", static_cast<int>(req->state())));
  }
  const std::string& token = req->page_token();
  if (!token.empty()) {
    const auto r = std::from_chars(token.data(), token.data() + token.size(), filter.after_id);
    if (r.ec != std::errc() || r.ptr != token.data() + token.size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, StrCat("page_token: '", token, "' is not one we gave"));
    }
  }
  const int64_t page = req->page_size() == 0 ? 100 : std::min<int64_t>(req->page_size(), 1000);
  filter.limit = page + 1;
  auto list = batches_->List(filter);
  if (!list.ok()) return ToGrpc(list.status());
  const int64_t now = batches_->Now();
  for (int64_t i = 0; i < static_cast<int64_t>(list->size()) && i < page; ++i) {
    BatchToProto((*list)[static_cast<size_t>(i)], now, out->add_batches());
  }
  if (static_cast<int64_t>(list->size()) > page) {
    out->set_next_page_token(std::to_string((*list)[static_cast<size_t>(page - 1)].id));
  }
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::Cancel(grpc::ServerContext*, const v1::CancelBatchRequest* req, v1::BatchJob* out) {
  if (req->batch_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "batch_id: must be set");
  auto b = batches_->Cancel(req->batch_id(), req->reason().empty() ? "cancelled by the user" : req->reason());
  if (!b.ok()) return ToGrpc(b.status());
  if (runner_ != nullptr) runner_->Wake();
  BatchToProto(*b, batches_->Now(), out);
  return grpc::Status::OK;
}

grpc::Status BatchServiceImpl::Results(grpc::ServerContext* ctx, const v1::BatchResultsRequest* req,
                                       grpc::ServerWriter<v1::BatchResultsChunk>* writer) {
  if (req->batch_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "batch_id: must be set");
  // Pages of requests from SQLite, one chunk each: memory stays bounded
  // whatever the batch's size.
  constexpr int64_t kPage = 1000;
  int64_t after = -1;
  bool more = true;
  while (more) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    int64_t next = after;
    auto lines = batches_->ResultLines(req->batch_id(), after, kPage, &next, &more);
    if (!lines.ok()) return ToGrpc(lines.status());
    after = next;
    if (lines->empty()) continue;
    v1::BatchResultsChunk chunk;
    std::string* data = chunk.mutable_data();
    for (const std::string& l : *lines) *data += l;
    chunk.set_lines(static_cast<int64_t>(lines->size()));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  return grpc::Status::OK;
}

}  // namespace slicesched
