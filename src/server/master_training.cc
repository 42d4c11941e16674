// The master's fine-tuning side: training steps on the real backend.
#include "master_impl.h"

namespace slicesched {

// ---------------------------------------------------------------------------
// Fine-tuning
// ---------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<InstanceRecord>> Master::SubmitTrainStep(TrainStepArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new training steps");
  if (args.job == nullptr || args.batch == nullptr) return absl::InvalidArgumentError("job, batch: required");
  for (auto [field, v] : {std::pair<const char*, int64_t>{"rows", args.rows}, {"tokens", args.tokens},
                          {"rank", args.rank}, {"head_outputs", args.head_outputs}}) {
    if (v < 1 || v > options_.max_binding_value) {
      return absl::InvalidArgumentError(StrCat(field, ": ", v, " is outside 1..", options_.max_binding_value));
    }
  }
  if (args.devices.empty()) return absl::InvalidArgumentError("devices: at least one device is required");
  for (size_t i = 0; i < args.partners.size(); ++i) {
    if (args.partners[i] == nullptr || args.partners[i] == args.job) {
      return absl::InvalidArgumentError(StrCat("partners: ", i, " is null or the step's own job"));
    }
  }
  if (!args.partners.empty() && args.micro_index >= 0) {
    return absl::InvalidArgumentError(StrCat("micro_index: ", args.micro_index,
                                             " on a joint step; concurrent micro-batches are single-job only"));
  }
  // (The batch is complete only to the real backend; without one the step
  // is refused below: no backend runs training operators.)
  if (const RealBackendRegistration* registered = RegisteredRealBackend(); registered != nullptr) {
    SLICESCHED_RETURN_IF_ERROR(registered->check_train_step(args));
  }
  absl::StatusOr<std::shared_ptr<InstanceRecord>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<std::shared_ptr<InstanceRecord>> {
      auto dep = im.deployments.find(args.deployment);
      if (dep == im.deployments.end()) {
        return absl::NotFoundError(StrCat("deployment: no deployment '", args.deployment, "'"));
      }
      if (im.real == nullptr) {
        return absl::FailedPreconditionError(StrCat(
            "deployment: the daemon's backend (", backend_name_,
            ") runs no real operators; fine-tuning needs devices with backend 'cpu' in a build with LibTorch"));
      }
      const size_t n = im.gmg.accelerators().size();
      std::vector<DeviceId> allowed;
      for (uint32_t d : args.devices) {
        if (d >= n) return absl::InvalidArgumentError(StrCat("devices: ", d, " is not a device (the cluster has ", n, ")"));
        allowed.emplace_back(static_cast<uint16_t>(d));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId tid, im.gmg.templates().FindByName(dep->second.train_template));
      const Timestamp now = clock_.Now();
      InstanceSpec spec = LlamaTrainStep(tid, args.rows, args.tokens, args.rank, args.head_outputs,
                                         PriorityClass::kOffline, now,
                                         1 + static_cast<int64_t>(args.partners.size()));
      spec.priority = args.priority;
      spec.tenant = TenantId(kOfflineTenantBase);
      spec.label = args.label;
      spec.allowed_devices = std::move(allowed);
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) return Annotate(id.status(), "train step");
      if (absl::Status r = im.real->SetTrainRequest(args, *id); !r.ok()) {
        (void)im.gmg.CancelInstance(*id, "its training request could not be registered", now);
        return r;
      }
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(tid)->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      std::shared_ptr<InstanceRecord> record = t.record;
      im.live.emplace(id->value(), std::move(t));
      return record;
    }();
  }));
  return result;
}

absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>> Master::BackboneWeights(const std::string& deployment) {
  absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    if (!im.deployments.contains(deployment)) {
      result = absl::NotFoundError(StrCat("deployment: no deployment '", deployment, "'"));
      return;
    }
    if (im.real != nullptr) {
      std::shared_ptr<const executor::LlamaWeights> w = im.real->Weights(deployment);
      result = w != nullptr ? absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>>(std::move(w))
                            : absl::NotFoundError(StrCat("deployment: '", deployment, "' has no loaded weights"));
      return;
    }
    result = absl::FailedPreconditionError(StrCat("deployment: the daemon's backend (", backend_name_,
                                                  ") holds no real weights"));
  }));
  return result;
}

}  // namespace slicesched
