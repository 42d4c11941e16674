// The master's admin and observability side: status, devices, the GMG dump,
// drain, timeline and metrics.
#include "master_impl.h"

namespace slicesched {

// ---------------------------------------------------------------------------
// Admin
// ---------------------------------------------------------------------------

namespace {

std::string BackendUsed(const DeviceSpec& d, bool real) {
  if (real) return StrCat(DeviceBackendName(d.backend), " (LibTorch)");
  if (d.backend == DeviceBackend::kVirtual) return "virtual";
  return StrCat("virtual (configured: ", DeviceBackendName(d.backend), ")");
}

}  // namespace

absl::StatusOr<MasterStatus> Master::Status() {
  MasterStatus st;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    st.version = options_.version;
    st.started_unix_ms = started_unix_ms_;
    st.uptime_ms = clock_.Now().nanos() / 1000000;
    st.num_devices = static_cast<uint32_t>(im.gmg.accelerators().size());
    for (const auto& [name, d] : im.deployments) st.deployments.push_back(name);
    st.live_instances = im.gmg.num_instances();
    for (const auto& [id, inst] : im.gmg.instances()) {
      const bool queued = std::all_of(inst->nodes.begin(), inst->nodes.end(),
                                      [](const OpNode& n) { return n.state == NodeState::kUnscheduled; });
      if (!queued) continue;
      (inst->spec.priority_class == PriorityClass::kOnline ? st.queued_online : st.queued_offline) += 1;
    }
    st.policy = std::string(im.scheduler.name());
    st.backend = backend_name_;
    st.state_dir = config_.state_dir;
    st.calibration = im.calibration.View();
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      st.device_activity.push_back({.name = d.name,
                                    .operators = im.ops_done[d.id.value()],
                                    .busy_seconds = static_cast<double>(im.busy_ns[d.id.value()]) / 1e9});
    }
    if (!draining_.load()) {
      st.state = ServingStateKind::kServing;
    } else {
      st.state = im.live.empty() ? ServingStateKind::kDrained : ServingStateKind::kDraining;
    }
  }));
  return st;
}

absl::StatusOr<std::vector<DeviceInfo>> Master::Devices() {
  std::vector<DeviceInfo> out;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    const Timestamp now = clock_.Now();
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      DeviceInfo info;
      info.spec = d;
      info.backend_used = BackendUsed(d, im.has_tokens);
      info.memory = im.gmg.memory(d.id);
      info.queue_length = static_cast<uint32_t>(std::max(0, im.gmg.outstanding_compute(d.id)));
      info.running_node = im.gmg.running_compute(d.id).valid() ? im.gmg.running_compute(d.id).value() : 0;
      if (!im.busy_samples.empty()) {
        const Impl::BusySample& b = im.busy_samples.front();
        const int64_t span = now.nanos() - b.time.nanos();
        const int64_t busy = im.busy_ns[d.id.value()] - b.busy_ns[d.id.value()];
        const int64_t offline = im.busy_offline_ns[d.id.value()] - b.busy_offline_ns[d.id.value()];
        if (span > 0) {
          info.busy_fraction = std::clamp(static_cast<double>(busy) / static_cast<double>(span), 0.0, 1.0);
          info.busy_fraction_offline =
              std::clamp(static_cast<double>(offline) / static_cast<double>(span), 0.0, info.busy_fraction);
        }
      }
      out.push_back(std::move(info));
    }
  }));
  return out;
}

absl::StatusOr<GmgView> Master::DumpGmg() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, Devices());
  GmgView view;
  view.devices = std::move(devices);
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    im.gmg.SnapshotInto(clock_.Now(), &view.snapshot);
    for (const auto& tpl : im.gmg.templates().all()) {
      auto id = im.gmg.templates().FindByName(tpl->name());
      if (!id.ok()) continue;
      if (view.template_names.size() <= id->value()) view.template_names.resize(id->value() + 1);
      view.template_names[id->value()] = tpl->name();
    }
    for (const GmgSnapshot::Node& sn : view.snapshot.nodes) {
      GmgView::NodeExtra extra;
      const OpNode* node = im.gmg.FindNode(NodeId(sn.id));
      if (node != nullptr) {
        extra.kind = std::string(ToStd(OpKindName(node->kind)));
        extra.end = node->times.end;
        extra.predicted_start = node->times.predicted_start;
        extra.op = "transfer";
        if (node->op_index >= 0) {
          const Instance* inst = im.gmg.FindInstance(node->instance);
          if (inst != nullptr && inst->tpl != nullptr) {
            extra.op = inst->tpl->ops()[static_cast<size_t>(node->op_index)].name;
          }
        }
      }
      view.nodes.push_back(std::move(extra));
    }
    for (const GmgSnapshot::Instance& si : view.snapshot.instances) {
      const Instance* inst = im.gmg.FindInstance(InstanceId(si.id));
      GmgView::InstanceExtra extra;
      if (inst != nullptr) {
        extra.state = std::string(ToStd(InstanceStateName(inst->state)));
        extra.label = inst->spec.label;
      }
      view.instances.push_back(std::move(extra));
    }
  }));
  return view;
}

absl::StatusOr<EstimatorView> Master::Estimators() {
  EstimatorView v;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    v.ops = impl_->ops.Stats();
    v.transfers = impl_->transfers.Stats();
  }));
  return v;
}

absl::Status Master::SaveEstimators() {
  std::vector<EstimatorSnapshot> snaps;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { snaps = impl_->LearnedState(); }));
  return store_->PutEstimators(snaps);
}

absl::StatusOr<DrainResult> Master::Drain(bool wait, absl::Duration timeout) {
  if (!draining_.exchange(true)) spdlog::info("draining: no new deployments or instances are admitted");
  const absl::Time deadline = absl::Now() + timeout;
  DrainResult r;
  while (true) {
    SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { r.remaining_instances = impl_->live.size(); }));
    if (r.remaining_instances == 0 || !wait || absl::Now() >= deadline) break;
    // Bounded polling of the loop; completions arrive in real time.
    absl::SleepFor(std::min(absl::Milliseconds(10), deadline - absl::Now()));
  }
  if (r.remaining_instances == 0) {
    r.state = ServingStateKind::kDrained;
    SLICESCHED_RETURN_IF_ERROR(SaveEstimators());
    spdlog::info("drained; estimator state saved to {}", store_->path());
  } else {
    r.state = ServingStateKind::kDraining;
  }
  return r;
}

// ---------------------------------------------------------------------------
// Observability (Timeline, Metrics)
// ---------------------------------------------------------------------------

double Master::PredictedNs(bool transfer, DeviceId device, DeviceId dst, TemplateId tpl, int op,
                           std::span<const int64_t> attrs, Bytes bytes, bool overlapped) {
  Impl& im = *impl_;
  if (transfer) {
    return im.transfers.PredictLinkNs(device, dst, bytes.count()) *
           (overlapped ? im.calibration.transfer_overlap_factor() : 1.0);
  }
  const int key = im.ctx.OpKey(im.gmg.accelerators().device(device).type, tpl.value(), op);
  return im.ops.PredictNs(key, attrs) * im.calibration.device_factor(device) *
         (overlapped ? im.calibration.overlap_factor() : 1.0);
}

TimelineEntry Master::TimelineEntryOf(const Feedback& f, bool* class_known) {
  Impl& im = *impl_;
  const bool transfer = f.kind == Feedback::Kind::kTransfer;
  TimelineEntry e;
  e.node_id = f.node.value();
  e.instance_id = f.instance.value();
  e.device = f.device.value();
  e.dst_device = transfer ? f.dst.value() : -1;
  e.start = f.start;
  e.end = f.end;
  e.name = "transfer";
  if (!transfer) {
    const GraphTemplate* tpl = im.gmg.templates().Find(f.tpl);
    e.name = tpl != nullptr && f.op >= 0 && f.op < tpl->num_ops() ? tpl->ops()[static_cast<size_t>(f.op)].name
                                                                    : StrCat("op", f.op);
  }
  const double predicted = PredictedNs(transfer, f.device, f.dst, f.tpl, f.op, f.attrs, f.bytes, f.overlapped);
  if (std::isfinite(predicted) && predicted >= 0) {
    e.predicted_end = f.start + Duration::Nanos(static_cast<int64_t>(predicted));
  }
  const Instance* inst = im.gmg.FindInstance(f.instance);
  *class_known = inst != nullptr;
  if (inst != nullptr) {
    e.priority_class = inst->spec.priority_class;
    e.label = inst->spec.label;
  }
  return e;
}

void Master::ObserveRetired(const RetiredInstance& r) {
  MasterObserved& o = *impl_->obs;
  o.retired_class[r.id.value()] = r.priority_class;
  MetricsSnapshot::ClassStats& c = o.classes[r.priority_class == PriorityClass::kOffline ? 1 : 0];
  const bool done = r.state == InstanceState::kDone;
  if (done) {
    ++c.done;
    c.latency.Observe((r.finished - r.arrival).ToSecondsF());
  } else if (r.state == InstanceState::kFailed) {
    ++c.failed;
  } else {
    ++c.cancelled;
  }
  if (r.priority_class == PriorityClass::kOnline && r.deadline != Timestamp::Never() &&
      r.deadline != Timestamp::Infinite()) {
    ++o.slo_total;
    if (done && r.finished <= r.deadline) ++o.slo_met;
  }
}

void Master::FlushTimeline() {
  MasterObserved& o = *impl_->obs;
  for (auto& [e, known] : o.pending) {
    if (!known) {
      auto it = o.retired_class.find(e.instance_id);
      if (it != o.retired_class.end()) e.priority_class = it->second;
    }
    o.timeline.Add(std::move(e));
  }
  o.pending.clear();
  o.retired_class.clear();
}

void Master::ObserveSchedule(const ScheduleStats* stats, std::chrono::steady_clock::duration took) {
  MasterObserved& o = *impl_->obs;
  o.schedule_call.Observe(std::chrono::duration<double>(took).count());
  if (stats != nullptr) {
    o.schedule_rounds += static_cast<uint64_t>(stats->rounds);
    o.whatif_runs += static_cast<uint64_t>(stats->whatif_runs);
    o.simulated_ops += static_cast<uint64_t>(stats->simulated_ops);
    o.whatif_seconds += stats->whatif_seconds;
    o.issued_nodes += static_cast<uint64_t>(stats->issued_nodes);
  }
  for (double us : impl_->scheduler.round_latency_us()) o.schedule_round.Observe(us / 1e6);
  impl_->scheduler.ClearRoundRecords();  // observed; a daemon must not keep them forever
}

absl::StatusOr<TimelineView> Master::Timeline(Timestamp since, Timestamp until, size_t max_events) {
  if (max_events == 0) return absl::InvalidArgumentError("max_events: must be at least 1");
  TimelineView view;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    view.now = clock_.Now();
    const Timestamp end = std::min(until, view.now);
    std::vector<TimelineEntry> running;
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      view.device_names.push_back(d.name);
      for (const NodeId id : {im.gmg.running_compute(d.id), im.gmg.active_transfer(d.id)}) {
        if (!id.valid()) continue;
        const OpNode* n = im.gmg.FindNode(id);
        if (n == nullptr || n->state != NodeState::kRunning) continue;
        const bool transfer = n->kind == OpKind::kTransfer;
        if (transfer && n->device != d.id) continue;  // listed once, at its source
        const Instance* inst = im.gmg.FindInstance(n->instance);
        TimelineEntry e;
        e.node_id = id.value();
        e.instance_id = n->instance.value();
        e.device = n->device.value();
        e.start = n->times.start;
        e.name = "transfer";
        if (inst != nullptr) {
          e.priority_class = inst->spec.priority_class;
          e.label = inst->spec.label;
        }
        Bytes bytes;
        TemplateId tpl;
        if (transfer) {
          e.dst_device = n->dst_device.value();
          const OpNode* producer = im.gmg.FindNode(n->src_node);
          if (producer != nullptr && static_cast<size_t>(n->src_output) < producer->outputs.size()) {
            bytes = producer->outputs[static_cast<size_t>(n->src_output)].bytes;
          }
        } else if (inst != nullptr && inst->tpl != nullptr) {
          e.name = inst->tpl->ops()[static_cast<size_t>(n->op_index)].name;
          tpl = inst->tpl->id();
        }
        const bool overlapped = transfer ? im.gmg.running_compute(n->device).valid()
                                         : im.gmg.active_transfer(n->device).valid();
        const double predicted =
            transfer || tpl.valid()
                ? PredictedNs(transfer, n->device, n->dst_device, tpl, n->op_index, n->attrs, bytes, overlapped)
                : -1;
        if (std::isfinite(predicted) && predicted >= 0) {
          e.predicted_end = e.start + Duration::Nanos(static_cast<int64_t>(predicted));
        }
        running.push_back(std::move(e));
      }
    }
    view.result = im.obs->timeline.Query(since, end, max_events, running);
  }));
  return view;
}

absl::StatusOr<MetricsSnapshot> Master::Metrics() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, Devices());
  SLICESCHED_ASSIGN_OR_RETURN(MasterStatus status, Status());
  MetricsSnapshot m;
  m.version = status.version;
  m.uptime_seconds = static_cast<double>(status.uptime_ms) / 1000.0;
  m.live_instances = status.live_instances;
  m.queued_online = status.queued_online;
  m.queued_offline = status.queued_offline;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    const MasterObserved& o = *im.obs;
    for (const DeviceInfo& d : devices) {
      MetricsSnapshot::Device md;
      md.name = d.spec.name;
      md.type = d.spec.type;
      md.busy_ratio = d.busy_fraction;
      md.busy_seconds_total = static_cast<double>(im.busy_ns[d.spec.id.value()]) / 1e9;
      md.busy_batch_seconds_total = static_cast<double>(im.busy_batch_ns[d.spec.id.value()]) / 1e9;
      md.queue_length = d.queue_length;
      md.memory_used_bytes = d.memory.total().count();
      md.memory_capacity_bytes = d.spec.memory.count();
      m.devices.push_back(std::move(md));
    }
    for (int c = 0; c < 2; ++c) m.classes[c] = o.classes[c];
    m.slo_total = o.slo_total;
    m.slo_met = o.slo_met;
    m.op_mape_pct = im.learner.op_error().mape_pct();
    m.op_observations = static_cast<uint64_t>(im.learner.op_error().n);
    m.transfer_mape_pct = im.learner.transfer_error().mape_pct();
    m.transfer_observations = static_cast<uint64_t>(im.learner.transfer_error().n);
    for (const OpEstimator::KeyStats& k : im.ops.Stats()) {
      if (k.samples == 0) continue;
      m.op_keys.push_back({.device_type = k.device_type,
                           .op_key = StrCat(k.template_name, ":", k.op_name),
                           .mape_pct = k.mape_pct,
                           .samples = static_cast<uint64_t>(k.samples)});
    }
    m.schedule_call = o.schedule_call;
    m.schedule_round = o.schedule_round;
    m.schedule_rounds = o.schedule_rounds;
    m.whatif_runs = o.whatif_runs;
    m.simulated_ops = o.simulated_ops;
    m.whatif_seconds = o.whatif_seconds;
    m.issued_nodes = o.issued_nodes;
  }));
  return m;
}

}  // namespace slicesched
