#include "slicesched/server/finetune_service.h"

#include "slicesched/common/strings.h"
#include "slicesched/server/services.h"

namespace slicesched {

v1::JobState ToProtoJobState(jobs::JobState s) {
  switch (s) {
    case jobs::JobState::kSubmitted:
    case jobs::JobState::kProfiling:
    case jobs::JobState::kQueued: return v1::JOB_STATE_QUEUED;
    case jobs::JobState::kRunning: return v1::JOB_STATE_RUNNING;
    case jobs::JobState::kPaused: return v1::JOB_STATE_PAUSED;
    case jobs::JobState::kCompleted: return v1::JOB_STATE_SUCCEEDED;
    case jobs::JobState::kFailed: return v1::JOB_STATE_FAILED;
    case jobs::JobState::kCancelled: return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

absl::StatusOr<std::vector<jobs::JobState>> FromProtoJobState(v1::JobState s) {
  using jobs::JobState;
  switch (s) {
    case v1::JOB_STATE_UNSPECIFIED: return std::vector<JobState>{};
    case v1::JOB_STATE_QUEUED: return std::vector<JobState>{JobState::kSubmitted, JobState::kProfiling, JobState::kQueued};
    case v1::JOB_STATE_RUNNING: return std::vector<JobState>{JobState::kRunning};
    case v1::JOB_STATE_PAUSED: return std::vector<JobState>{JobState::kPaused};
    case v1::JOB_STATE_SUCCEEDED: return std::vector<JobState>{JobState::kCompleted};
    case v1::JOB_STATE_FAILED: return std::vector<JobState>{JobState::kFailed};
    case v1::JOB_STATE_CANCELLED: return std::vector<JobState>{JobState::kCancelled};
    default: break;
  }
  return absl::InvalidArgumentError(StrCat("state: unknown value ", static_cast<int>(s)));
}

void JobToProto(const jobs::JobInfo& job, v1::Job* out) {
  out->set_id(job.id);
  out->set_name(job.name);
  out->set_tenant(job.tenant);
  out->set_state(ToProtoJobState(job.state));
  out->set_yaml(job.yaml);
  out->set_submitted_unix_ms(job.submitted_unix_ms);
  out->set_updated_unix_ms(job.updated_unix_ms);
  out->set_iterations_done(job.iterations_done);
  out->set_iterations_target(job.iterations_target);
  out->set_last_loss(job.last_loss);
  if (job.state == jobs::JobState::kRunning) {
    for (uint32_t d : job.plan.devices) out->add_devices(d);
    out->set_transfer_source_job(job.plan.partner);
  }
  out->set_message(job.message.empty() ? std::string(jobs::JobStateName(job.state)) : job.message);
}

grpc::Status FineTuneServiceImpl::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                                            v1::SubmitJobResponse* out) {
  if (req->yaml().size() > kMaxYamlBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        StrCat("yaml: ", req->yaml().size(), " bytes; a job description holds at most ", kMaxYamlBytes));
  }
  auto r = jobs_->Submit(req->yaml(), req->tenant(), req->validate_only());
  if (!r.ok()) return ToGrpc(r.status());
  out->set_job_id(r->job_id);
  for (const std::string& w : r->warnings) out->add_warnings(w);
  return grpc::Status::OK;
}

grpc::Status FineTuneServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                           v1::ListJobsResponse* out) {
  auto states = FromProtoJobState(req->state());
  if (!states.ok()) return ToGrpc(states.status());
  jobs::ListJobsQuery q;
  q.states = *std::move(states);
  q.tenant = req->tenant();
  q.page_size = req->page_size();
  q.page_token = req->page_token();
  auto page = jobs_->List(q);
  if (!page.ok()) return ToGrpc(page.status());
  for (const jobs::JobInfo& j : page->jobs) JobToProto(j, out->add_jobs());
  out->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status FineTuneServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::GetJobResponse* out) {
  if (req->job_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: must be set");
  auto job = jobs_->Get(req->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  JobToProto(*job, out->mutable_job());
  if (req->include_events()) {
    auto events = jobs_->Events(req->job_id());
    if (!events.ok()) return ToGrpc(events.status());
    for (const JobEvent& e : *events) {
      v1::JobEvent* pe = out->add_events();
      pe->set_job_id(e.job_id);
      pe->set_seq(e.seq);
      pe->set_time_unix_ms(e.time_unix_ms);
      pe->set_kind(e.kind);
      pe->set_details_json(e.details_json);
    }
  }
  return grpc::Status::OK;
}

grpc::Status FineTuneServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                                            v1::CancelJobResponse* out) {
  if (req->job_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job_id: must be set");
  auto job = jobs_->Cancel(req->job_id(), req->reason());
  if (!job.ok()) return ToGrpc(job.status());
  JobToProto(*job, out->mutable_job());
  return grpc::Status::OK;
}

}  // namespace slicesched
