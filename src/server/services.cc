#include "slicesched/server/services.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/match.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/dtype.h"
#include "slicesched/gmg/llama.h"
#include "spdlog/spdlog.h"

namespace slicesched {
namespace {

constexpr size_t kMaxLabelBytes = 256;
// Longest error message ToGrpc passes on (see there).
constexpr size_t kMaxErrorMessageBytes = 2048;
constexpr int kMaxBindings = 16;
constexpr int kMaxCheckpoints = 1024;

v1::InstanceState ToProto(InstanceState s) {
  switch (s) {
    case InstanceState::kPending: return v1::INSTANCE_STATE_PENDING;
    case InstanceState::kRunning: return v1::INSTANCE_STATE_RUNNING;
    case InstanceState::kDone: return v1::INSTANCE_STATE_DONE;
    case InstanceState::kFailed: return v1::INSTANCE_STATE_FAILED;
    case InstanceState::kCancelled: return v1::INSTANCE_STATE_CANCELLED;
  }
  return v1::INSTANCE_STATE_UNSPECIFIED;
}

v1::ServingState ToProto(ServingStateKind s) {
  switch (s) {
    case ServingStateKind::kStarting: return v1::SERVING_STATE_STARTING;
    case ServingStateKind::kServing: return v1::SERVING_STATE_SERVING;
    case ServingStateKind::kDraining: return v1::SERVING_STATE_DRAINING;
    case ServingStateKind::kDrained: return v1::SERVING_STATE_DRAINED;
  }
  return v1::SERVING_STATE_UNSPECIFIED;
}

int64_t TimeNs(Timestamp t) {
  return t == Timestamp::Never() || t == Timestamp::Infinite() ? 0 : t.nanos();
}
int64_t SnapNs(int64_t ns) {
  return ns == Timestamp::Never().nanos() || ns == Timestamp::Infinite().nanos() ? 0 : ns;
}

void FillEvent(uint64_t id, const InstanceUpdate& u, v1::InstanceEvent* e) {
  e->set_instance_id(id);
  e->set_state(ToProto(u.state));
  e->set_time_ns(TimeNs(u.time));
  e->set_ops_done(u.ops_done);
  e->set_ops_total(u.ops_total);
  for (uint64_t c : u.produced_checkpoints) e->add_produced_checkpoints(c);
  e->set_message(u.message);
}

void FillMemory(uint32_t device, const DeviceMemory& m, v1::DeviceMemory* out) {
  out->set_device(device);
  out->set_weights_bytes(m.weights.count());
  out->set_activations_bytes(m.activations.count());
  out->set_workspace_bytes(m.workspace.count());
  out->set_checkpoints_bytes(m.checkpoints.count());
}

void FillDevice(const DeviceInfo& d, v1::Device* out) {
  out->set_id(d.spec.id.value());
  out->set_name(d.spec.name);
  out->set_type(d.spec.type);
  out->set_backend(d.backend_used);
  out->set_memory_bytes(d.spec.memory.count());
}

void FillFactor(const CalibrationFactorView& f, v1::CalibrationFactor* out) {
  out->set_factor(f.factor);
  out->set_raw(f.raw);
  out->set_weight(f.weight);
  out->set_samples(static_cast<uint64_t>(f.samples));
}

void FillCalibration(const MasterStatus& st, v1::Calibration* out) {
  for (size_t d = 0; d < st.calibration.devices.size(); ++d) {
    v1::DeviceCalibration* dc = out->add_devices();
    dc->set_device(static_cast<uint32_t>(d));
    FillFactor(st.calibration.devices[d], dc->mutable_speed());
    if (d < st.calibration.drift.size()) FillFactor(st.calibration.drift[d], dc->mutable_drift());
    if (d < st.device_activity.size()) {
      const MasterStatus::DeviceActivity& a = st.device_activity[d];
      dc->set_name(a.name);
      dc->set_operators(a.operators);
      dc->set_busy_seconds(a.busy_seconds);
    }
  }
  FillFactor(st.calibration.overlap, out->mutable_overlap());
  FillFactor(st.calibration.transfer_overlap, out->mutable_transfer_overlap());
}

absl::StatusOr<std::string> ReadFile(const std::string& path, std::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat(field, ": cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(StrCat(field, ": '", path, "' is empty"));
  return ss.str();
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // The message travels in the trailing metadata, which clients cap (8 KiB
  // by default): a longer one, e.g. an error quoting a 64 KiB name, reaches
  // the client as RESOURCE_EXHAUSTED "received initial metadata size exceeds
  // limit" instead of the error.
  std::string message(s.message());
  if (message.size() > kMaxErrorMessageBytes) {
    const size_t cut = message.size() - kMaxErrorMessageBytes;
    message.resize(kMaxErrorMessageBytes);
    message += StrCat("... (", cut, " more bytes)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), message);
}

grpc::Status AuthorizeAdmin(std::string_view peer, const std::string* authorization, std::string_view admin_token,
                            bool mutating) {
  if (peer.starts_with("unix:")) return grpc::Status::OK;
  if (!admin_token.empty()) {
    if (authorization == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "Admin calls need 'authorization: Bearer <token>'");
    }
    if (*authorization != StrCat("Bearer ", admin_token)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong admin token");
    }
    return grpc::Status::OK;
  }
  if (mutating) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "mutating Admin calls over TCP need listen.admin_token to be configured; use the unix socket");
  }
  return grpc::Status::OK;
}

absl::StatusOr<DeploymentConfig> DeploymentFromProto(const v1::DeploymentSpec& spec) {
  DeploymentConfig d;
  d.name = spec.name();
  if (d.name.empty()) return absl::InvalidArgumentError("spec.name: must not be empty");
  switch (spec.model().source_case()) {
    case v1::ModelSpec::kPreset: {
      d.model_preset = spec.model().preset();
      auto dims = LlamaPreset(d.model_preset);
      if (!dims.ok()) return absl::InvalidArgumentError(StrCat("spec.model.preset: ", dims.status().message()));
      d.model = *dims;
      break;
    }
    case v1::ModelSpec::kLlama: {
      const v1::LlamaModel& m = spec.model().llama();
      d.model.name = m.name().empty() ? d.name : m.name();
      d.model.layers = m.layers();
      d.model.hidden = m.hidden();
      d.model.heads = m.heads();
      d.model.kv_heads = m.kv_heads() == 0 ? m.heads() : m.kv_heads();
      d.model.ffn = m.ffn();
      d.model.vocab = m.vocab();
      d.model.fusion = m.fusion() == 0 ? 8 : m.fusion();
      if (!m.dtype().empty()) {
        auto dt = ParseDType(m.dtype());
        if (!dt.ok()) return absl::InvalidArgumentError(StrCat("spec.model.llama.dtype: ", dt.status().message()));
        d.model.dtype = *dt;
      }
      if (absl::Status v = d.model.Validate(); !v.ok()) {
        return absl::InvalidArgumentError(StrCat("spec.model.llama: ", v.message()));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("spec.model: set 'preset' or 'llama'");
  }
  switch (spec.weights().source_case()) {
    case v1::WeightsSpec::kSeed:
      d.weights.kind = WeightsConfig::Kind::kSeed;
      d.weights.seed = spec.weights().seed();
      break;
    case v1::WeightsSpec::kSafetensorsPath: {
      const std::string& p = spec.weights().safetensors_path();
      if (p.empty() || p.front() != '/') {
        return absl::InvalidArgumentError(StrCat("spec.weights.safetensors_path: must be an absolute path, got '", p, "'"));
      }
      std::error_code ec;
      if (!std::filesystem::exists(p, ec)) {
        return absl::InvalidArgumentError(StrCat("spec.weights.safetensors_path: '", p, "' does not exist"));
      }
      d.weights.kind = WeightsConfig::Kind::kSafetensors;
      d.weights.safetensors_path = p;
      break;
    }
    default:
      return absl::InvalidArgumentError("spec.weights: set 'seed' or 'safetensors_path'");
  }
  switch (spec.role()) {
    case v1::DEPLOYMENT_ROLE_ONLINE: d.role = DeploymentRole::kOnline; break;
    case v1::DEPLOYMENT_ROLE_OFFLINE: d.role = DeploymentRole::kOffline; break;
    default:
      return absl::InvalidArgumentError("spec.role: must be DEPLOYMENT_ROLE_ONLINE or DEPLOYMENT_ROLE_OFFLINE");
  }
  for (const std::string& p : spec.partitions()) {
    if (std::find(d.partitions.begin(), d.partitions.end(), p) != d.partitions.end()) {
      return absl::InvalidArgumentError(StrCat("spec.partitions: '", p, "' is listed twice"));
    }
    d.partitions.push_back(p);
  }
  if (const std::string& t = spec.tokenizer_path(); !t.empty()) {
    if (t.front() != '/') {
      return absl::InvalidArgumentError(StrCat("spec.tokenizer_path: must be an absolute path, got '", t, "'"));
    }
    d.tokenizer = t;
  }
  return d;
}

void DeploymentToProto(const DeploymentConfig& d, v1::DeploymentSpec* out) {
  out->set_name(d.name);
  out->set_tokenizer_path(d.tokenizer);
  if (!d.model_preset.empty()) {
    out->mutable_model()->set_preset(d.model_preset);
  } else {
    v1::LlamaModel* m = out->mutable_model()->mutable_llama();
    m->set_name(d.model.name);
    m->set_layers(d.model.layers);
    m->set_hidden(d.model.hidden);
    m->set_heads(d.model.heads);
    m->set_kv_heads(d.model.kv_heads);
    m->set_ffn(d.model.ffn);
    m->set_vocab(d.model.vocab);
    m->set_dtype(std::string(ToStd(DTypeName(d.model.dtype))));
    m->set_fusion(d.model.fusion);
  }
  if (d.weights.kind == WeightsConfig::Kind::kSeed) {
    out->mutable_weights()->set_seed(d.weights.seed);
  } else {
    out->mutable_weights()->set_safetensors_path(d.weights.safetensors_path);
  }
  out->set_role(d.role == DeploymentRole::kOnline ? v1::DEPLOYMENT_ROLE_ONLINE : v1::DEPLOYMENT_ROLE_OFFLINE);
  for (const std::string& p : d.partitions) out->add_partitions(p);
}

// ---------------------------------------------------------------------------
// Admin
// ---------------------------------------------------------------------------

grpc::Status AdminServiceImpl::Authorize(grpc::ServerContext* ctx, bool mutating) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  std::string value;
  if (it != md.end()) value.assign(it->second.data(), it->second.size());
  return AuthorizeAdmin(ctx->peer(), it == md.end() ? nullptr : &value, token_, mutating);
}

grpc::Status AdminServiceImpl::Status(grpc::ServerContext* ctx, const v1::StatusRequest*, v1::StatusResponse* out) {
  if (grpc::Status a = Authorize(ctx, false); !a.ok()) return a;
  auto st = master_->Status();
  if (!st.ok()) return ToGrpc(st.status());
  out->set_version(st->version);
  out->set_state(ToProto(st->state));
  out->set_started_unix_ms(st->started_unix_ms);
  out->set_uptime_ms(st->uptime_ms);
  out->set_num_devices(st->num_devices);
  for (const std::string& d : st->deployments) out->add_deployments(d);
  out->set_live_instances(st->live_instances);
  out->set_queued_online(st->queued_online);
  out->set_queued_offline(st->queued_offline);
  if (jobs_ != nullptr) {
    const jobs::JobCounts c = jobs_->Counts();
    out->set_jobs_running(c.running);
    out->set_jobs_queued(c.submitted + c.profiling + c.queued + c.paused);
  }
  out->set_policy(st->policy);
  out->set_state_dir(st->state_dir);
  FillCalibration(*st, out->mutable_calibration());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Devices(grpc::ServerContext* ctx, const v1::DevicesRequest*, v1::DevicesResponse* out) {
  if (grpc::Status a = Authorize(ctx, false); !a.ok()) return a;
  auto devices = master_->Devices();
  if (!devices.ok()) return ToGrpc(devices.status());
  for (const DeviceInfo& d : *devices) {
    v1::DeviceStatus* s = out->add_devices();
    FillDevice(d, s->mutable_device());
    FillMemory(d.spec.id.value(), d.memory, s->mutable_memory());
    s->set_queue_length(d.queue_length);
    s->set_running_node(d.running_node);
    s->set_busy_fraction(d.busy_fraction);
    s->set_busy_fraction_offline(d.busy_fraction_offline);
    s->set_healthy(true);
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Estimators(grpc::ServerContext* ctx, const v1::EstimatorsRequest* req,
                                          v1::EstimatorsResponse* out) {
  if (grpc::Status a = Authorize(ctx, false); !a.ok()) return a;
  auto v = master_->Estimators();
  if (!v.ok()) return ToGrpc(v.status());
  for (const OpEstimator::KeyStats& k : v->ops) {
    if (!req->device_type().empty() && k.device_type != req->device_type()) continue;
    v1::OpEstimate* e = out->add_ops();
    e->set_device_type(k.device_type);
    e->set_op_key(StrCat(k.template_name, ":", k.op_name));
    for (const std::string& f : k.feature_names) e->add_features(f);
    for (double c : k.coeffs) e->add_coefficients(c);
    e->set_samples(static_cast<uint64_t>(k.samples));
    e->set_mape_percent(k.mape_pct);
  }
  auto devices = master_->Devices();
  if (!devices.ok()) return ToGrpc(devices.status());
  auto id_of = [&](const std::string& name) -> uint32_t {
    for (const DeviceInfo& d : *devices) {
      if (d.spec.name == name) return d.spec.id.value();
    }
    return 0;
  };
  auto type_of = [&](const std::string& name) -> std::string {
    for (const DeviceInfo& d : *devices) {
      if (d.spec.name == name) return d.spec.type;
    }
    return "";
  };
  for (const TransferEstimator::PairStats& p : v->transfers) {
    if (!req->device_type().empty() && type_of(p.src) != req->device_type() &&
        type_of(p.dst) != req->device_type()) {
      continue;
    }
    v1::TransferEstimate* e = out->add_transfers();
    e->set_src_device(id_of(p.src));
    e->set_dst_device(id_of(p.dst));
    e->set_alpha_ns_per_byte(p.alpha_ns_per_byte);
    e->set_c_ns(p.c_ns);
    e->set_samples(static_cast<uint64_t>(p.samples));
    e->set_mape_percent(p.mape_pct);
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::DumpGmg(grpc::ServerContext* ctx, const v1::DumpGmgRequest*, v1::GmgDump* out) {
  if (grpc::Status a = Authorize(ctx, false); !a.ok()) return a;
  auto view = master_->DumpGmg();
  if (!view.ok()) return ToGrpc(view.status());
  const GmgSnapshot& snap = view->snapshot;
  out->set_taken_at_ns(TimeNs(snap.taken_at));
  for (const DeviceInfo& d : view->devices) {
    FillDevice(d, out->add_devices());
    FillMemory(d.spec.id.value(), d.memory, out->add_memory());
  }
  for (size_t i = 0; i < snap.instances.size(); ++i) {
    const GmgSnapshot::Instance& si = snap.instances[i];
    v1::Instance* inst = out->add_instances();
    inst->set_id(si.id);
    if (si.template_id < view->template_names.size()) inst->set_template_name(view->template_names[si.template_id]);
    inst->set_priority_class(std::string(ToStd(PriorityClassName(static_cast<PriorityClass>(si.priority_class)))));
    inst->set_priority(si.priority);
    inst->set_arrival_ns(SnapNs(si.arrival_ns));
    inst->set_deadline_ns(SnapNs(si.deadline_ns));
    inst->set_state(view->instances[i].state);
    inst->set_label(view->instances[i].label);
  }
  for (size_t n = 0; n < snap.nodes.size(); ++n) {
    const GmgSnapshot::Node& sn = snap.nodes[n];
    const GmgView::NodeExtra& extra = view->nodes[n];
    v1::Node* node = out->add_nodes();
    node->set_id(sn.id);
    if (sn.instance < snap.instances.size()) node->set_instance(snap.instances[sn.instance].id);
    node->set_op(extra.op);
    node->set_kind(extra.kind);
    node->set_state(static_cast<v1::NodeState>(static_cast<int>(sn.state) + 1));
    node->set_device(sn.device == 0xffff ? -1 : sn.device);
    node->set_dst_device(sn.op_index < 0 && sn.dst_device != 0xffff ? sn.dst_device : -1);
    node->set_issue_ns(SnapNs(sn.issue_ns));
    node->set_ready_ns(SnapNs(sn.ready_ns));
    node->set_start_ns(SnapNs(sn.start_ns));
    node->set_end_ns(TimeNs(extra.end));
    node->set_predicted_start_ns(TimeNs(extra.predicted_start));
    node->set_predicted_end_ns(SnapNs(sn.predicted_end_ns));
    if (n + 1 < snap.pred_offsets.size()) {
      for (uint32_t k = snap.pred_offsets[n]; k < snap.pred_offsets[n + 1]; ++k) {
        const uint32_t p = snap.preds[k];
        if (p < snap.nodes.size()) node->add_preds(snap.nodes[p].id);
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Drain(grpc::ServerContext* ctx, const v1::DrainRequest* req, v1::DrainResponse* out) {
  if (grpc::Status a = Authorize(ctx, true); !a.ok()) return a;
  absl::Duration timeout = absl::Milliseconds(req->timeout_ms());
  if (req->wait() && req->timeout_ms() == 0) {
    const auto left = ctx->deadline() - std::chrono::system_clock::now();
    timeout = ctx->deadline() == std::chrono::system_clock::time_point::max()
                  ? absl::Minutes(10)
                  : absl::FromChrono(std::chrono::duration_cast<std::chrono::milliseconds>(left)) -
                        absl::Milliseconds(50);
  }
  auto r = master_->Drain(req->wait(), std::max(timeout, absl::ZeroDuration()));
  if (!r.ok()) return ToGrpc(r.status());
  out->set_state(ToProto(r->state));
  out->set_remaining_instances(r->remaining_instances);
  out->set_remaining_jobs(0);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Timeline(grpc::ServerContext* ctx, const v1::TimelineRequest* req,
                                        v1::TimelineResponse* out) {
  if (grpc::Status a = Authorize(ctx, false); !a.ok()) return a;
  if (req->since_ns() < 0 || req->until_ns() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "since_ns/until_ns: must not be negative");
  }
  if (req->until_ns() != 0 && req->until_ns() < req->since_ns()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "until_ns: precedes since_ns");
  }
  const v1::TimelineFormat format = req->format();
  if (format != v1::TIMELINE_FORMAT_UNSPECIFIED && format != v1::TIMELINE_FORMAT_STRUCTURED &&
      format != v1::TIMELINE_FORMAT_CHROME_TRACE) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        StrCat("format: unknown value ", static_cast<int>(format)));
  }
  const Timestamp since = req->since_ns() == 0 ? Timestamp::Never() : Timestamp::FromNanos(req->since_ns());
  const Timestamp until = req->until_ns() == 0 ? Timestamp::Infinite() : Timestamp::FromNanos(req->until_ns());
  auto view = master_->Timeline(since, until, req->max_events() == 0 ? 10000 : req->max_events());
  if (!view.ok()) return ToGrpc(view.status());
  out->set_truncated(view->result.truncated);
  if (format == v1::TIMELINE_FORMAT_CHROME_TRACE) {
    out->set_chrome_trace_json(ChromeTraceJson(view->result.events, view->device_names, view->now));
    return grpc::Status::OK;
  }
  for (const TimelineEntry& e : view->result.events) {
    v1::TimelineEvent* ev = out->add_events();
    ev->set_node_id(e.node_id);
    ev->set_instance_id(e.instance_id);
    ev->set_name(e.name);
    ev->set_priority_class(std::string(ToStd(PriorityClassName(e.priority_class))));
    ev->set_device(e.device);
    ev->set_dst_device(e.dst_device);
    ev->set_start_ns(TimeNs(e.start));
    ev->set_end_ns(TimeNs(e.end));
    ev->set_predicted_end_ns(TimeNs(e.predicted_end));
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------

grpc::Status ServingServiceImpl::RegisterDeployment(grpc::ServerContext*, const v1::RegisterDeploymentRequest* req,
                                                    v1::RegisterDeploymentResponse* out) {
  auto spec = DeploymentFromProto(req->spec());
  if (!spec.ok()) return ToGrpc(spec.status());
  auto info = master_->RegisterDeployment(*std::move(spec), req->replace());
  if (!info.ok()) return ToGrpc(info.status());
  out->set_name(info->spec.name);
  out->set_prefill_template(info->prefill_template);
  out->set_decode_template(info->decode_template);
  for (const auto& [name, slots] : info->partitions) {
    v1::Partition* p = out->add_partitions();
    p->set_name(name);
    p->set_num_slots(slots);
  }
  out->set_weight_bytes(info->weight_bytes);
  out->set_kv_bytes_per_token(info->kv_bytes_per_token);
  return grpc::Status::OK;
}

grpc::Status ServingServiceImpl::ListDeployments(grpc::ServerContext*, const v1::ListDeploymentsRequest*,
                                                 v1::ListDeploymentsResponse* out) {
  auto list = master_->ListDeployments();
  if (!list.ok()) return ToGrpc(list.status());
  for (const DeploymentInfo& info : *list) {
    v1::Deployment* d = out->add_deployments();
    DeploymentToProto(info.spec, d->mutable_spec());
    v1::RegisterDeploymentResponse* i = d->mutable_info();
    i->set_name(info.spec.name);
    i->set_prefill_template(info.prefill_template);
    i->set_decode_template(info.decode_template);
    for (const auto& [name, slots] : info.partitions) {
      v1::Partition* p = i->add_partitions();
      p->set_name(name);
      p->set_num_slots(slots);
    }
    i->set_weight_bytes(info.weight_bytes);
    i->set_kv_bytes_per_token(info.kv_bytes_per_token);
    d->set_created_unix_ms(info.created_unix_ms);
  }
  return grpc::Status::OK;
}

grpc::Status ServingServiceImpl::Submit(grpc::ServerContext*, const v1::SubmitRequest* req, v1::SubmitResponse* out) {
  SubmitArgs args;
  if (req->template_name().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "template_name: must not be empty");
  }
  args.template_name = req->template_name();
  if (req->bindings_size() > kMaxBindings) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, StrCat("bindings: at most ", kMaxBindings, " entries"));
  }
  for (const auto& [sym, value] : req->bindings()) {
    if (sym.empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bindings: empty symbol name");
    args.bindings.emplace_back(sym, value);
  }
  std::sort(args.bindings.begin(), args.bindings.end());  // map order is unspecified
  switch (req->priority_class()) {
    case v1::PRIORITY_CLASS_UNSPECIFIED:
    case v1::PRIORITY_CLASS_ONLINE: args.priority_class = PriorityClass::kOnline; break;
    case v1::PRIORITY_CLASS_OFFLINE: args.priority_class = PriorityClass::kOffline; break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("priority_class: unknown value ", static_cast<int>(req->priority_class())));
  }
  args.priority = req->priority();
  args.deadline_ms = req->deadline_ms();
  if (req->checkpoints_size() > kMaxCheckpoints) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, StrCat("checkpoints: at most ", kMaxCheckpoints));
  }
  for (const v1::CheckpointBinding& c : req->checkpoints()) {
    if (c.name().empty() || c.checkpoint_id() == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "checkpoints: each needs a name and a checkpoint_id");
    }
    args.checkpoints.emplace_back(c.name(), c.checkpoint_id());
  }
  if (req->label().size() > kMaxLabelBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, StrCat("label: longer than ", kMaxLabelBytes, " bytes"));
  }
  args.label = req->label();
  auto r = master_->Submit(std::move(args));
  if (!r.ok()) return ToGrpc(r.status());
  out->set_instance_id(r->instance_id);
  out->set_arrival_ns(r->arrival.nanos());
  return grpc::Status::OK;
}

grpc::Status ServingServiceImpl::Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                       grpc::ServerWriter<v1::InstanceEvent>* writer) {
  if (req->instance_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "instance_id: must be set");
  auto rec = master_->FindInstance(req->instance_id());
  if (!rec.ok()) return ToGrpc(rec.status());
  // The first message reports the current state, then every change.
  InstanceUpdate last = (*rec)->Last();
  size_t next = 0;
  {
    bool closed = false;
    std::vector<InstanceUpdate> all = (*rec)->WaitFrom(0, absl::ZeroDuration(), &closed);
    next = all.size();
    if (!all.empty()) last = all.back();
    v1::InstanceEvent e;
    FillEvent(req->instance_id(), last, &e);
    if (!writer->Write(e)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    if (IsTerminalInstanceState(last.state)) return grpc::Status::OK;
    if (closed) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is shutting down");
  }
  while (!ctx->IsCancelled()) {
    bool closed = false;
    std::vector<InstanceUpdate> more = (*rec)->WaitFrom(next, absl::Milliseconds(100), &closed);
    next += more.size();
    for (const InstanceUpdate& u : more) {
      v1::InstanceEvent e;
      FillEvent(req->instance_id(), u, &e);
      if (!writer->Write(e)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      if (IsTerminalInstanceState(u.state)) return grpc::Status::OK;
    }
    if (closed) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is shutting down");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
}

grpc::Status ServingServiceImpl::Cancel(grpc::ServerContext*, const v1::CancelRequest* req, v1::CancelResponse* out) {
  if (req->instance_id() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "instance_id: must be set");
  auto st = master_->Cancel(req->instance_id());
  if (!st.ok()) return ToGrpc(st.status());
  out->set_state(ToProto(*st));
  return grpc::Status::OK;
}

namespace {

v1::FinishReason ToProto(GenerationEnd e) {
  switch (e) {
    case GenerationEnd::kNone: return v1::FINISH_REASON_UNSPECIFIED;
    case GenerationEnd::kLength: return v1::FINISH_REASON_LENGTH;
    case GenerationEnd::kStop: return v1::FINISH_REASON_STOP;
    case GenerationEnd::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case GenerationEnd::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

constexpr int kMaxPromptTokens = 1 << 16;
constexpr int kMaxStopTokens = 64;

}  // namespace

grpc::Status ServingServiceImpl::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                          grpc::ServerWriter<v1::GenerateResponse>* writer) {
  GenerateArgs args;
  if (req->deployment().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "deployment: must be set");
  args.deployment = req->deployment();
  if (req->prompt_token_ids_size() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids: at least one token is required");
  }
  if (req->prompt_token_ids_size() > kMaxPromptTokens) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        StrCat("prompt_token_ids: at most ", kMaxPromptTokens, " tokens"));
  }
  args.prompt.assign(req->prompt_token_ids().begin(), req->prompt_token_ids().end());
  if (req->max_tokens() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "max_tokens: must be at least 1");
  args.max_tokens = req->max_tokens();
  const v1::SamplingParams& sp = req->sampling();
  if (!(sp.temperature() >= 0.0f)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sampling.temperature: must be >= 0");
  }
  if (!(sp.top_p() >= 0.0f && sp.top_p() <= 1.0f)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p: must be within [0, 1]");
  }
  args.temperature = sp.temperature();
  args.top_p = sp.top_p() == 0.0f ? 1.0 : sp.top_p();
  args.seed = sp.seed();
  args.top_k = sp.top_k();
  switch (req->priority_class()) {
    case v1::PRIORITY_CLASS_UNSPECIFIED: break;
    case v1::PRIORITY_CLASS_ONLINE: args.priority_class = PriorityClass::kOnline; break;
    case v1::PRIORITY_CLASS_OFFLINE: args.priority_class = PriorityClass::kOffline; break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          StrCat("priority_class: unknown value ", static_cast<int>(req->priority_class())));
  }
  args.priority = req->priority();
  args.ttft_ms = req->slo().ttft_ms();
  args.deadline_ms = req->slo().deadline_ms();
  if (req->stop_token_ids_size() > kMaxStopTokens) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, StrCat("stop_token_ids: at most ", kMaxStopTokens));
  }
  args.stop_tokens.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  if (req->client_tag().size() > kMaxLabelBytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        StrCat("client_tag: longer than ", kMaxLabelBytes, " bytes"));
  }
  args.client_tag = req->client_tag();

  auto rec = master_->Generate(std::move(args));
  if (!rec.ok()) return ToGrpc(rec.status());
  const std::shared_ptr<GenerationRecord>& r = *rec;
  auto cancel = [&](const char* why) {
    const absl::Status s = master_->CancelGeneration(r->id());
    if (!s.ok()) spdlog::warn("generate {}: cancel after '{}': {}", r->id(), why, s.ToString());
  };
  size_t next = 0;
  while (true) {
    if (ctx->IsCancelled()) {
      cancel("the client cancelled");
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request");
    }
    bool done = false;
    GenerationEnd end = GenerationEnd::kNone;
    std::string message;
    std::vector<GeneratedToken> more = r->WaitFrom(next, absl::Milliseconds(100), &done, &end, &message);
    for (const GeneratedToken& t : more) {
      v1::GenerateResponse m;
      m.set_request_id(r->id());
      m.set_token_id(static_cast<uint32_t>(t.token));
      m.set_index(t.index);
      m.set_time_from_arrival_ms(static_cast<double>((t.time - r->arrival()).nanos()) / 1e6);
      m.set_finish_reason(ToProto(t.end));
      if (t.index == 0) m.set_queue_ms(t.queue_ms);
      if (!writer->Write(m)) {
        cancel("the client went away");
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    next += more.size();
    if (!done) continue;
    // A request that ends without a final token (it failed, or was cancelled
    // between tokens) ends the stream with a status that says why.
    switch (end) {
      case GenerationEnd::kLength:
      case GenerationEnd::kStop: return grpc::Status::OK;
      case GenerationEnd::kCancelled:
        if (!more.empty() && more.back().end == GenerationEnd::kCancelled) return grpc::Status::OK;
        return grpc::Status(grpc::StatusCode::CANCELLED, StrCat("generation cancelled: ", message));
      case GenerationEnd::kError:
      case GenerationEnd::kNone:
        return grpc::Status(grpc::StatusCode::INTERNAL, StrCat("generation failed after ", next, " tokens: ", message));
    }
  }
}

// ---------------------------------------------------------------------------
// SlicedServer
// ---------------------------------------------------------------------------

absl::StatusOr<ServerOptions> ServerOptionsFromConfig(const ListenConfig& listen) {
  ServerOptions o;
  o.unix_socket = listen.unix_socket;
  o.tcp_address = listen.tcp_address;
  o.admin_token = listen.admin_token;
  if (!o.tcp_address.empty()) {
    SLICESCHED_ASSIGN_OR_RETURN(o.tls_cert_pem, ReadFile(listen.tls_cert, "listen.tls.cert"));
    SLICESCHED_ASSIGN_OR_RETURN(o.tls_key_pem, ReadFile(listen.tls_key, "listen.tls.key"));
  }
  return o;
}

SlicedServer::SlicedServer(Master* master, const ServerOptions& options, jobs::JobManager* jobs,
                           jobs::BatchManager* batches, BatchRunner* batch_runner)
    : options_(options),
      admin_(master, options.admin_token, jobs),
      serving_(master),
      finetune_(jobs),
      has_finetune_(jobs != nullptr),
      batch_(batches, batch_runner, options.max_batch_input_bytes),
      has_batch_(batches != nullptr) {}

SlicedServer::~SlicedServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<SlicedServer>> SlicedServer::Start(Master* master, const ServerOptions& options,
                                                                   jobs::JobManager* jobs, jobs::BatchManager* batches,
                                                                   BatchRunner* batch_runner) {
  if (options.unix_socket.empty() && options.tcp_address.empty()) {
    return absl::InvalidArgumentError("listen: no unix socket and no TCP address");
  }
  std::unique_ptr<SlicedServer> s(new SlicedServer(master, options, jobs, batches, batch_runner));
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.unix_socket.empty()) {
    const std::filesystem::path sock(options.unix_socket);
    std::error_code ec;
    std::filesystem::create_directories(sock.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          StrCat("listen.unix_socket: cannot create ", sock.parent_path().string(), ": ", ec.message()));
    }
    struct stat st {};
    if (::lstat(options.unix_socket.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::FailedPreconditionError(
            StrCat("listen.unix_socket: '", options.unix_socket, "' exists and is not a socket"));
      }
      std::filesystem::remove(sock, ec);  // stale socket of an earlier run
    }
    builder.AddListeningPort("unix:" + options.unix_socket, grpc::InsecureServerCredentials());
  }
  if (!options.tcp_address.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({options.tls_key_pem, options.tls_cert_pem});
    builder.AddListeningPort(options.tcp_address, grpc::SslServerCredentials(ssl));
  }
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.RegisterService(&s->admin_);
  builder.RegisterService(&s->serving_);
  if (s->has_finetune_) builder.RegisterService(&s->finetune_);
  if (s->has_batch_) builder.RegisterService(&s->batch_);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(StrCat("could not listen on ",
                                         options.unix_socket.empty() ? "" : "unix:" + options.unix_socket,
                                         options.unix_socket.empty() || options.tcp_address.empty() ? "" : " and ",
                                         options.tcp_address, " (see the gRPC log above)"));
  }
  s->SetServing(true);
  return s;
}

void SlicedServer::SetServing(bool serving) {
  if (server_ == nullptr || server_->GetHealthCheckService() == nullptr) return;
  grpc::HealthCheckServiceInterface* h = server_->GetHealthCheckService();
  for (const char* name : {"", "slicesched.v1.Serving", "slicesched.v1.Admin"}) h->SetServingStatus(name, serving);
  if (has_finetune_) h->SetServingStatus("slicesched.v1.FineTune", serving);
  if (has_batch_) h->SetServingStatus("slicesched.v1.Batch", serving);
}

void SlicedServer::Shutdown(absl::Duration grace) {
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  if (!options_.unix_socket.empty()) {
    std::error_code ec;
    std::filesystem::remove(options_.unix_socket, ec);
  }
}

}  // namespace slicesched
