// The Batch gRPC service (proto/slicesched/v1/batch.proto) on the
// BatchManager and the BatchRunner: it only translates between protos and
// their calls.
//
// Submit reads the streamed input file (at most max_input_bytes, else
// INVALID_ARGUMENT naming the limit), validates and stores it in one
// transaction, and wakes the runner. Without a runner (the devices execute
// no real operators, so there are no tokens) Submit answers
// FAILED_PRECONDITION; Get, List, Cancel and Results still work.
//
// State mapping: in_progress, completed, expired, cancelled, failed ->
// BATCH_STATE_IN_PROGRESS, _COMPLETED, _EXPIRED, _CANCELLED, _FAILED.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "slicesched/jobs/batch_manager.h"
#include "slicesched/server/batch_runner.h"
#include "slicesched/server/master.h"
#include "slicesched/server/metrics.h"
#include "slicesched/v1/batch.grpc.pb.h"

namespace slicesched {

v1::BatchState ToProtoBatchState(std::string_view state);

// What the batch parser needs of the master's deployment `name`: its
// vocabulary and the longest context (prompt + generated tokens) whose KV
// cache, spread over its widest partition, fits beside the weights of the
// roomiest device (Generate's admission check). Nothing when unknown.
std::optional<BatchModelInfo> BatchModelInfoOf(Master* master, std::string_view name);
void BatchToProto(const StoredBatch& b, int64_t now_unix_ms, v1::BatchJob* out);

// The batch part of the metrics (server/metrics.h): batches per state (every
// state, 0 included) and, with a runner, its counters since start.
absl::StatusOr<MetricsSnapshot::Batches> BatchMetrics(jobs::BatchManager* batches, const BatchRunner* runner);

class BatchServiceImpl final : public v1::Batch::Service {
 public:
  static constexpr size_t kDefaultMaxInputBytes = size_t{256} << 20;

  // `batches` may be null (the service is then not registered); `runner`
  // may be null (see above). Neither is owned.
  BatchServiceImpl(jobs::BatchManager* batches, BatchRunner* runner, size_t max_input_bytes = kDefaultMaxInputBytes)
      : batches_(batches), runner_(runner), max_input_bytes_(max_input_bytes) {}

  grpc::Status Submit(grpc::ServerContext* ctx, grpc::ServerReader<v1::SubmitBatchChunk>* reader,
                      v1::SubmitBatchResponse* out) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetBatchRequest* req, v1::BatchJob* out) override;
  grpc::Status List(grpc::ServerContext* ctx, const v1::ListBatchesRequest* req,
                    v1::ListBatchesResponse* out) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelBatchRequest* req, v1::BatchJob* out) override;
  grpc::Status Results(grpc::ServerContext* ctx, const v1::BatchResultsRequest* req,
                       grpc::ServerWriter<v1::BatchResultsChunk>* writer) override;

 private:
  jobs::BatchManager* batches_;
  BatchRunner* runner_;
  const size_t max_input_bytes_;
};

}  // namespace slicesched
