// The FineTune gRPC service (proto/slicesched/v1/finetune.proto) on the
// JobManager: it only translates between protos and JobManager calls.
//
// State mapping (jobs::JobState -> v1::JobState), see job_manager.h:
//   submitted, profiling, queued -> JOB_STATE_QUEUED   (Job.message tells which)
//   running                      -> JOB_STATE_RUNNING
//   paused                       -> JOB_STATE_PAUSED
//   completed                    -> JOB_STATE_SUCCEEDED
//   failed                       -> JOB_STATE_FAILED
//   cancelled                    -> JOB_STATE_CANCELLED
// A ListJobs filter on JOB_STATE_QUEUED therefore matches all three waiting
// states.
//
// Errors: SubmitJob with bad YAML answers INVALID_ARGUMENT whose message has
// a count line, then every error as "<job>:LINE:COL: FIELD: MESSAGE", one
// per line. Unknown job ids answer NOT_FOUND; a page token used with other
// filters INVALID_ARGUMENT.
#pragma once

#include <cstddef>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "slicesched/jobs/job_manager.h"
#include "slicesched/v1/finetune.grpc.pb.h"

namespace slicesched {

v1::JobState ToProtoJobState(jobs::JobState s);
// The internal states a v1 state stands for; empty for UNSPECIFIED (= any).
// InvalidArgument for a value outside the enum.
absl::StatusOr<std::vector<jobs::JobState>> FromProtoJobState(v1::JobState s);
void JobToProto(const jobs::JobInfo& job, v1::Job* out);

class FineTuneServiceImpl final : public v1::FineTune::Service {
 public:
  static constexpr size_t kMaxYamlBytes = 1 << 20;

  explicit FineTuneServiceImpl(jobs::JobManager* jobs) : jobs_(jobs) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* out) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req, v1::ListJobsResponse* out) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::GetJobResponse* out) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* out) override;

 private:
  jobs::JobManager* jobs_;  // not owned
};

}  // namespace slicesched
