// The gRPC face of the `sliced` daemon: Admin and Serving service
// implementations that only translate between protos and Master calls, and
// SlicedServer, which builds the grpc::Server the daemon (and the tests) run.
//
// Authorization of Admin calls (see docs/operations.md):
//   - peers on the unix socket are trusted (the socket's file permissions
//     guard it): every Admin call is allowed;
//   - TCP (TLS) peers: when listen.admin_token is set, every Admin call needs
//     the metadata `authorization: Bearer <token>` (UNAUTHENTICATED
//     otherwise); without a token, read-only Admin calls are allowed and
//     mutating ones (Drain) are refused with PERMISSION_DENIED.
//
// Serving.Generate streams one message per token as the master produces it
// (Master::Generate); a client that goes away (or cancels) has its request
// cancelled and its KV cache freed within one poll interval (100 ms).
//
// Admin.Timeline renders Master::Timeline() as structured events or as a
// Chrome trace (server/timeline.h).
//
// FineTune (finetune_service.h) is served when SlicedServer::Start is given
// a JobManager; Admin.Status then counts its jobs: jobs_running = running,
// jobs_queued = submitted + profiling + queued + paused. Batch
// (batch_service.h) is served when it is given a BatchManager.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/batch_service.h"
#include "slicesched/server/config.h"
#include "slicesched/server/finetune_service.h"
#include "slicesched/server/master.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {

// absl::Status -> grpc::Status, keeping the code and the message; a message
// longer than 2 KiB is cut there (clients cap the metadata that carries it).
grpc::Status ToGrpc(const absl::Status& s);

// The Admin authorization rule above. `peer` is ServerContext::peer() (a unix
// socket peer starts with "unix:"); `authorization` the metadata value or
// null when absent.
grpc::Status AuthorizeAdmin(std::string_view peer, const std::string* authorization,
                            std::string_view admin_token, bool mutating);

// v1.DeploymentSpec -> DeploymentConfig; INVALID_ARGUMENT naming the field
// ("spec.model.llama.hidden: ...") on bad input.
absl::StatusOr<DeploymentConfig> DeploymentFromProto(const v1::DeploymentSpec& spec);
void DeploymentToProto(const DeploymentConfig& d, v1::DeploymentSpec* out);

class AdminServiceImpl final : public v1::Admin::Service {
 public:
  // `jobs` may be null (no fine-tuning jobs: Status reports zero).
  AdminServiceImpl(Master* master, std::string admin_token, jobs::JobManager* jobs = nullptr)
      : master_(master), token_(std::move(admin_token)), jobs_(jobs) {}

  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest* req, v1::StatusResponse* out) override;
  grpc::Status Devices(grpc::ServerContext* ctx, const v1::DevicesRequest* req, v1::DevicesResponse* out) override;
  grpc::Status Estimators(grpc::ServerContext* ctx, const v1::EstimatorsRequest* req,
                          v1::EstimatorsResponse* out) override;
  grpc::Status DumpGmg(grpc::ServerContext* ctx, const v1::DumpGmgRequest* req, v1::GmgDump* out) override;
  grpc::Status Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req, v1::DrainResponse* out) override;
  grpc::Status Timeline(grpc::ServerContext* ctx, const v1::TimelineRequest* req,
                        v1::TimelineResponse* out) override;

 private:
  grpc::Status Authorize(grpc::ServerContext* ctx, bool mutating) const;
  Master* master_;
  const std::string token_;
  jobs::JobManager* jobs_;
};

class ServingServiceImpl final : public v1::Serving::Service {
 public:
  explicit ServingServiceImpl(Master* master) : master_(master) {}

  grpc::Status RegisterDeployment(grpc::ServerContext* ctx, const v1::RegisterDeploymentRequest* req,
                                  v1::RegisterDeploymentResponse* out) override;
  grpc::Status ListDeployments(grpc::ServerContext* ctx, const v1::ListDeploymentsRequest* req,
                               v1::ListDeploymentsResponse* out) override;
  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req, v1::SubmitResponse* out) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::InstanceEvent>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelRequest* req, v1::CancelResponse* out) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

 private:
  Master* master_;
};

struct ServerOptions {
  std::string unix_socket;   // absolute path; empty = none
  std::string tcp_address;   // "host:port"; empty = none
  std::string tls_cert_pem;  // PEM text (not paths); required with tcp_address
  std::string tls_key_pem;
  std::string admin_token;
  int max_receive_message_bytes = 4 << 20;
  size_t max_batch_input_bytes = BatchServiceImpl::kDefaultMaxInputBytes;
  bool reflection = true;    // grpc.reflection.v1alpha.ServerReflection
};

// Options from the config's `listen:` section, reading the TLS files
// (errors name listen.tls.cert / listen.tls.key).
absl::StatusOr<ServerOptions> ServerOptionsFromConfig(const ListenConfig& listen);

class SlicedServer {
 public:
  // Creates the socket's directory, replaces a stale socket file, registers
  // the services, the default health checking service and (when enabled)
  // reflection, and starts listening. With `jobs` (not owned; must outlive
  // the server) the FineTune service is registered too.
  // With `batches` (and `batch_runner`, both not owned) the Batch service too.
  static absl::StatusOr<std::unique_ptr<SlicedServer>> Start(Master* master, const ServerOptions& options,
                                                             jobs::JobManager* jobs = nullptr,
                                                             jobs::BatchManager* batches = nullptr,
                                                             BatchRunner* batch_runner = nullptr);
  ~SlicedServer();

  // Health status of "" and every slicesched.v1 service name.
  void SetServing(bool serving);
  // Stops accepting calls; in-flight calls get until `grace` to finish.
  void Shutdown(absl::Duration grace);
  grpc::Server* server() { return server_.get(); }

 private:
  SlicedServer(Master* master, const ServerOptions& options, jobs::JobManager* jobs, jobs::BatchManager* batches,
               BatchRunner* batch_runner);
  ServerOptions options_;
  AdminServiceImpl admin_;
  ServingServiceImpl serving_;
  FineTuneServiceImpl finetune_;
  const bool has_finetune_;
  BatchServiceImpl batch_;
  const bool has_batch_;
  std::unique_ptr<grpc::Server> server_;
  bool shut_down_ = false;
};

}  // namespace slicesched
