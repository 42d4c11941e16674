// The master's serving side: deployments, raw instances and Generate.
#include "master_impl.h"

namespace slicesched {

using master_internal::SameModel;
using master_internal::ValidDeploymentName;

// ---------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------

namespace {

// The deployment's tokenizer (none when spec.tokenizer is empty); its pieces
// must fit the model's vocabulary.
absl::StatusOr<std::shared_ptr<const jobs::Tokenizer>> LoadDeploymentTokenizer(const DeploymentConfig& spec) {
  std::shared_ptr<const jobs::Tokenizer> tokenizer;
  if (!spec.tokenizer.empty()) {
    auto t = jobs::Tokenizer::Load(spec.tokenizer);
    if (!t.ok()) return absl::InvalidArgumentError(StrCat("spec.tokenizer: ", t.status().message()));
    if ((*t)->vocab_size() > spec.model.vocab) {
      return absl::InvalidArgumentError(StrCat("spec.tokenizer: ", spec.tokenizer, " has ", (*t)->vocab_size(),
                                               " pieces, more than the model's vocabulary of ", spec.model.vocab));
    }
    tokenizer = *std::move(t);
  }
  return tokenizer;
}

// The partitions of `prefill` the deployment enables: those spec.partitions
// names (each must exist and fit the `num_devices` devices), or, when it
// names none, every one that fits.
absl::StatusOr<std::vector<const CandidatePartition*>> EnabledPartitions(const DeploymentConfig& spec,
                                                                         const GraphTemplate& prefill,
                                                                         size_t num_devices) {
  std::vector<const CandidatePartition*> enabled;
  for (const CandidatePartition& p : prefill.partitions()) {
    const bool wanted = spec.partitions.empty() ||
                        std::find(spec.partitions.begin(), spec.partitions.end(), p.name) != spec.partitions.end();
    if (wanted && (static_cast<size_t>(p.num_slots) <= num_devices || !spec.partitions.empty())) {
      enabled.push_back(&p);
    }
  }
  std::vector<std::string> offered;
  for (const CandidatePartition& p : prefill.partitions()) offered.push_back(p.name);
  for (const std::string& name : spec.partitions) {
    auto it = std::find_if(enabled.begin(), enabled.end(), [&](const CandidatePartition* p) { return p->name == name; });
    if (it == enabled.end()) {
      return absl::InvalidArgumentError(StrCat("spec.partitions: the model has no partition '", name,
                                               "' (it offers: ", absl::StrJoin(offered, ", "), ")"));
    }
    if (static_cast<size_t>((*it)->num_slots) > num_devices) {
      return absl::InvalidArgumentError(StrCat("spec.partitions: '", name, "' needs ", (*it)->num_slots,
                                               " devices but the cluster has ", num_devices));
    }
  }
  if (enabled.empty()) return absl::InvalidArgumentError("spec.partitions: no partition fits the cluster");
  return enabled;
}

// The weights to load: one replica per aligned device group of every enabled
// partition, each (device, weight key) not resident yet once.
struct WeightPlan {
  std::vector<std::pair<DeviceId, const OpSpec*>> loads;  // into `prefill`'s ops
  int64_t weight_bytes = 0;                              // one replica
};

// Checks capacity before anything is loaded.
absl::StatusOr<WeightPlan> PlanWeights(const GlobalMappingGraph& gmg, const GraphTemplate& prefill,
                                       const std::vector<const CandidatePartition*>& enabled) {
  const size_t num_devices = gmg.accelerators().size();
  WeightPlan plan;
  std::vector<int64_t> extra(num_devices, 0);
  std::set<std::pair<uint16_t, std::string>> planned;
  std::set<std::string> seen_keys;
  for (const OpSpec& op : prefill.ops()) {
    if (!op.weight_key.empty() && seen_keys.insert(op.weight_key).second) plan.weight_bytes += op.weight_bytes.count();
  }
  for (const CandidatePartition* p : enabled) {
    const size_t groups = num_devices / static_cast<size_t>(p->num_slots);
    for (size_t g = 0; g < groups; ++g) {
      for (int op = 0; op < prefill.num_ops(); ++op) {
        const OpSpec& spec_op = prefill.ops()[static_cast<size_t>(op)];
        if (spec_op.weight_key.empty()) continue;
        const auto dev = static_cast<uint16_t>(g * static_cast<size_t>(p->num_slots) +
                                               static_cast<size_t>(p->slot_of_op[static_cast<size_t>(op)]));
        if (gmg.HasWeights(DeviceId(dev), spec_op.weight_key)) continue;
        if (!planned.insert({dev, spec_op.weight_key}).second) continue;
        plan.loads.emplace_back(DeviceId(dev), &spec_op);
        extra[dev] += spec_op.weight_bytes.count();
      }
    }
  }
  for (size_t d = 0; d < num_devices; ++d) {
    const DeviceId id(static_cast<uint16_t>(d));
    const int64_t cap = gmg.accelerators().device(id).memory.count();
    const int64_t used = gmg.memory(id).total().count();
    if (extra[d] > 0 && used + extra[d] > cap) {
      return absl::ResourceExhaustedError(
          StrCat("spec.model: the weights need ", Bytes(extra[d]).ToString(), " more on ",
                 gmg.accelerators().device(id).name, ", which has ", Bytes(cap - used).ToString(), " free"));
    }
  }
  return plan;
}

}  // namespace

absl::StatusOr<DeploymentInfo> Master::RegisterDeployment(DeploymentConfig spec, bool replace) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new deployments");
  // The tokenizer is read here, off the loop thread.
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const jobs::Tokenizer> tokenizer, LoadDeploymentTokenizer(spec));
  absl::StatusOr<DeploymentInfo> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { result = RegisterDeploymentOnLoop(spec, replace, tokenizer); }));
  return result;
}

absl::StatusOr<DeploymentInfo> Master::RegisterDeploymentOnLoop(
    const DeploymentConfig& spec, bool replace, const std::shared_ptr<const jobs::Tokenizer>& tokenizer) {
  Impl& im = *impl_;
  if (!ValidDeploymentName(spec.name)) {
    return absl::InvalidArgumentError(
        StrCat("spec.name: '", spec.name, "' is not a valid name (1..128 of letters, digits, '.', '_', '-')"));
  }
  LlamaDims dims = spec.model;
  dims.name = spec.name;  // templates and weight keys are per deployment
  if (absl::Status v = dims.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(StrCat("spec.model: ", v.message()));
  }
  auto existing = im.deployments.find(spec.name);
  if (existing != im.deployments.end()) {
    if (!replace) {
      return absl::AlreadyExistsError(
          StrCat("spec.name: deployment '", spec.name, "' exists (set replace to replace it)"));
    }
    if (!SameModel(existing->second.spec.model, spec.model)) {
      return absl::UnimplementedError(
          StrCat("spec.model: replacing deployment '", spec.name,
                 "' with a different model is not supported yet; register it under a new name"));
    }
  }
  auto templates = BuildLlamaTemplates(dims);
  if (!templates.ok()) return absl::InvalidArgumentError(StrCat("spec.model: ", templates.status().message()));
  auto train_template = BuildLlamaTrainTemplate(dims);
  if (!train_template.ok()) {
    return absl::InvalidArgumentError(StrCat("spec.model: ", train_template.status().message()));
  }
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<const CandidatePartition*> enabled,
                              EnabledPartitions(spec, *templates->prefill, im.gmg.accelerators().size()));
  SLICESCHED_ASSIGN_OR_RETURN(const WeightPlan weights, PlanWeights(im.gmg, *templates->prefill, enabled));

  // Real weights before anything is registered (the loader's errors name
  // the bad tensor; a failure leaves no trace).
  if (absl::Status w = im.AddModel(dims, spec.weights); !w.ok()) {
    return absl::Status(w.code(), StrCat("spec.weights: ", w.message()));
  }

  // Templates (new deployments only; a replacement keeps its templates).
  DeploymentInfo info;
  info.prefill_template = templates->prefill->name();
  info.decode_template = templates->decode->name();
  info.train_template = (*train_template)->name();
  if (existing == im.deployments.end()) {
    std::vector<std::shared_ptr<const GraphTemplate>> all = {templates->prefill, templates->decode,
                                                             *train_template};
    for (int k = 2; k <= kMaxPrefillChunks; ++k) {  // the scheduler's PrefillChunks picks one
      auto chunked = BuildLlamaChunkedPrefill(dims, k);
      if (!chunked.ok()) return absl::InvalidArgumentError(StrCat("spec.model: ", chunked.status().message()));
      all.push_back(*std::move(chunked));
    }
    for (const auto& tpl : all) {
      auto tid = im.gmg.RegisterTemplate(tpl);
      if (!tid.ok()) return Annotate(tid.status(), "spec.name");
      for (const DeviceSpec& d : im.gmg.accelerators().devices()) im.ctx.OpKeys(d.type, tid->value());
      im.template_owner[tpl->name()] = spec.name;
    }
  }
  for (const auto& [dev, op] : weights.loads) {
    SLICESCHED_RETURN_IF_ERROR(im.gmg.LoadWeights(dev, op->weight_key, op->weight_bytes));
  }

  SLICESCHED_RETURN_IF_ERROR(store_->PutDeployment(spec.name, spec.ToYaml()));
  SLICESCHED_ASSIGN_OR_RETURN(StoredDeployment stored, store_->GetDeployment(spec.name));
  info.spec = spec;
  for (const CandidatePartition* p : enabled) info.partitions.emplace_back(p->name, p->num_slots);
  info.weight_bytes = weights.weight_bytes;
  info.kv_bytes_per_token = dims.KvBytesPerTokenPerLayer() * dims.layers;
  info.created_unix_ms = stored.created_unix_ms;
  info.tokenizer = tokenizer;
  im.deployments[spec.name] = info;
  spdlog::info("deployment '{}' registered: templates {} / {}, partitions [{}], {} of weights per replica",
               spec.name, info.prefill_template, info.decode_template,
               absl::StrJoin(info.partitions, ", ",
                             [](std::string* out, const auto& p) { out->append(p.first); }),
               Bytes(weights.weight_bytes).ToString());
  return info;
}

absl::StatusOr<std::vector<DeploymentInfo>> Master::ListDeployments() {
  std::vector<DeploymentInfo> out;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    for (const auto& [name, info] : impl_->deployments) out.push_back(info);
  }));
  return out;
}

absl::StatusOr<SubmitResult> Master::Submit(SubmitArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new instances");
  for (const auto& [sym, value] : args.bindings) {
    if (value < 1 || value > options_.max_binding_value) {
      return absl::InvalidArgumentError(StrCat("bindings[", sym, "]: ", value, " is outside 1..",
                                               options_.max_binding_value));
    }
  }
  absl::StatusOr<SubmitResult> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<SubmitResult> {
      if (!im.template_owner.contains(args.template_name)) {
        std::vector<std::string> names;
        for (const auto& [n, d] : im.template_owner) names.push_back(n);
        std::sort(names.begin(), names.end());
        return absl::NotFoundError(StrCat("template_name: no template '", args.template_name,
                                          "' (registered: ", absl::StrJoin(names, ", "), ")"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId tid, im.gmg.templates().FindByName(args.template_name));
      const GraphTemplate* tpl = im.gmg.templates().Find(tid);
      const Timestamp now = clock_.Now();
      InstanceSpec spec;
      spec.template_id = tid;
      spec.bindings = args.bindings;
      spec.priority_class = args.priority_class;
      spec.priority = args.priority;
      spec.tenant = TenantId(args.priority_class == PriorityClass::kOffline ? kOfflineTenantBase : 0);
      spec.arrival = now;
      if (args.deadline_ms > 0) spec.deadline = now + Duration::Millis(args.deadline_ms);
      for (const auto& [name, ckpt] : args.checkpoints) {
        if (im.gmg.FindCheckpoint(CheckpointId(ckpt)) == nullptr) {
          return absl::NotFoundError(StrCat("checkpoints[", name, "]: no retained checkpoint ", ckpt));
        }
        spec.checkpoints.emplace_back(name, CheckpointId(ckpt));
      }
      spec.label = args.label;
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) {
        const absl::StatusCode code = absl::IsNotFound(id.status()) ? absl::StatusCode::kNotFound
                                                                    : absl::StatusCode::kInvalidArgument;
        const bool about_symbols = absl::StrContains(id.status().message(), "symbol");
        return absl::Status(code, StrCat(about_symbols ? "bindings: " : "checkpoints: ", id.status().message()));
      }
      if (im.has_tokens) {
        // No token ids in a raw Submit: derive them from the instance id.
        const DeploymentInfo& dep = im.deployments.at(im.template_owner.at(args.template_name));
        int64_t batch = 1, news = 1;
        for (const auto& [sym, value] : args.bindings) {
          if (sym == "B") batch = value;
          if (sym == "S" && args.template_name == dep.prefill_template) news = value;
        }
        std::vector<int64_t> tokens(static_cast<size_t>(batch * news));
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = static_cast<int64_t>((id->value() * 7919 + i) % static_cast<uint64_t>(dep.spec.model.vocab));
        }
        if (absl::Status r = im.SetRequest(dep.spec.name, *id, tokens, batch, 0, 1, id->value()); !r.ok()) {
          (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
          return Annotate(r, "bindings");
        }
      }
      for (const auto& [name, ckpt] : args.checkpoints) im.checkpoint_used[ckpt] = now;
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(tpl->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      im.live.emplace(id->value(), std::move(t));
      return SubmitResult{.instance_id = id->value(), .arrival = now};
    }();
  }));
  return result;
}

absl::StatusOr<std::shared_ptr<InstanceRecord>> Master::FindInstance(uint64_t instance_id) {
  std::shared_ptr<InstanceRecord> rec;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    if (auto it = impl_->live.find(instance_id); it != impl_->live.end()) {
      rec = it->second.record;
    } else if (auto f = impl_->finished.find(instance_id); f != impl_->finished.end()) {
      rec = f->second;
    }
  }));
  if (rec == nullptr) return absl::NotFoundError(StrCat("instance_id: no instance ", instance_id));
  return rec;
}

absl::StatusOr<InstanceState> Master::Cancel(uint64_t instance_id) {
  absl::StatusOr<InstanceState> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    if (auto f = im.finished.find(instance_id); f != im.finished.end()) {
      result = f->second->Last().state;
      return;
    }
    auto it = im.live.find(instance_id);
    if (it == im.live.end()) {
      result = absl::NotFoundError(StrCat("instance_id: no instance ", instance_id));
      return;
    }
    const Instance* inst = im.gmg.FindInstance(it->second.id);
    if (inst != nullptr && IsTerminalInstanceState(inst->state)) {
      result = inst->state;  // finishing; reported when retired
      return;
    }
    const absl::Status s = im.gmg.CancelInstance(it->second.id, "cancelled by the client", clock_.Now());
    result = s.ok() ? absl::StatusOr<InstanceState>(InstanceState::kCancelled) : s;
  }));
  return result;
}

// ---------------------------------------------------------------------------
// Generate
// ---------------------------------------------------------------------------

void Master::NotifyBackendEvent() {
  absl::MutexLock lock(&mu_);
  backend_event_ = true;
}

absl::StatusOr<std::shared_ptr<GenerationRecord>> Master::Generate(GenerateArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new requests");
  if (args.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids: at least one token is required");
  if (args.max_tokens < 1) return absl::InvalidArgumentError("max_tokens: must be at least 1");
  const int64_t total = static_cast<int64_t>(args.prompt.size()) + args.max_tokens;
  if (total > options_.max_binding_value) {
    return absl::InvalidArgumentError(StrCat("max_tokens: prompt (", args.prompt.size(), ") + max_tokens (",
                                             args.max_tokens, ") exceeds ", options_.max_binding_value, " tokens"));
  }
  if (!(args.temperature >= 0) || !(args.top_p >= 0 && args.top_p <= 1) || args.top_k < 0) {
    return absl::InvalidArgumentError("sampling: temperature must be >= 0, top_p within [0, 1] and top_k >= 0");
  }
  absl::StatusOr<std::shared_ptr<GenerationRecord>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<std::shared_ptr<GenerationRecord>> {
      auto dep_it = im.deployments.find(args.deployment);
      if (dep_it == im.deployments.end()) {
        return absl::NotFoundError(StrCat("deployment: no deployment '", args.deployment, "'"));
      }
      if (!im.has_tokens) {
        return absl::FailedPreconditionError(StrCat(
            "deployment: the daemon's backend (", backend_name_,
            ") computes no tokens; Generate needs devices with backend 'cpu' in a build with LibTorch"));
      }
      const DeploymentInfo& dep = dep_it->second;
      const int64_t vocab = dep.spec.model.vocab;
      for (size_t i = 0; i < args.prompt.size(); ++i) {
        if (args.prompt[i] < 0 || args.prompt[i] >= vocab) {
          return absl::InvalidArgumentError(StrCat("prompt_token_ids[", i, "]: ", args.prompt[i],
                                                   " is outside the vocabulary [0, ", vocab, ")"));
        }
      }
      // Admission: the whole KV cache must fit on some device, split over the
      // widest enabled partition.
      int max_slots = 1;
      for (const auto& [name, slots] : dep.partitions) max_slots = std::max(max_slots, slots);
      const int64_t kv_total = dep.kv_bytes_per_token * total;
      const int64_t kv_share = (kv_total + max_slots - 1) / max_slots;
      int64_t best_room = 0;
      for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
        best_room = std::max(best_room, d.memory.count() - im.gmg.memory(d.id).weights.count());
      }
      if (kv_share > best_room) {
        return absl::ResourceExhaustedError(StrCat(
            "prompt_token_ids: the KV cache of ", total, " tokens (prompt + max_tokens) needs ",
            Bytes(kv_total).ToString(), " (", Bytes(kv_share).ToString(), " per device over ", max_slots,
            " devices), more than any device can hold besides its weights (", Bytes(best_room).ToString(), ")"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre, im.gmg.templates().FindByName(dep.prefill_template));
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec, im.gmg.templates().FindByName(dep.decode_template));

      const Timestamp now = clock_.Now();
      const uint64_t request = im.next_request_id++;
      Impl::Generation g;
      g.id = request;
      g.deployment = dep.spec.name;
      g.decode_tpl = dec;
      g.cls = args.priority_class.value_or(dep.spec.role == DeploymentRole::kOffline ? PriorityClass::kOffline
                                                                                       : PriorityClass::kOnline);
      if (args.seed == 0) args.seed = request * 0x9E3779B97F4A7C15ull + 1;
      g.record = std::make_shared<GenerationRecord>(request, now);

      const auto prompt_tokens = static_cast<int64_t>(args.prompt.size());
      const int chunks = PrefillPieces(im.scheduler, prompt_tokens, g.cls);
      InstanceSpec spec;
      if (chunks > 1) {
        // "<model>/prefill_c<k>" beside the deployment's "<model>/prefill".
        SLICESCHED_ASSIGN_OR_RETURN(TemplateId chunked,
                                    im.gmg.templates().FindByName(StrCat(dep.prefill_template, "_c", chunks)));
        spec = LlamaChunkedPrefill(chunked, chunks, prompt_tokens, g.cls, now);
      } else {
        spec.template_id = pre;
        spec.bindings = {{"B", 1}, {"S", prompt_tokens}};
      }
      spec.priority_class = g.cls;
      spec.priority = args.priority;
      spec.tenant = TenantId(g.cls == PriorityClass::kOffline ? kOfflineTenantBase : 0);
      spec.arrival = now;
      if (args.ttft_ms > 0) {
        spec.deadline = now + Duration::Millis(args.ttft_ms);
      } else if (args.deadline_ms > 0 && g.cls == PriorityClass::kOffline) {
        // Offline work's whole-request deadline (a batch's completion
        // window), which the scheduler's offline aging respects.
        spec.deadline = now + Duration::Millis(args.deadline_ms);
      }
      spec.label = args.client_tag;
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) return Annotate(id.status(), "prompt_token_ids");
      if (absl::Status r =
              im.SetRequest(g.deployment, *id, args.prompt, 1, args.temperature, args.top_p, args.seed, args.top_k);
          !r.ok()) {
        (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
        return r;
      }
      g.args = std::move(args);
      g.current = *id;
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(pre)->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      im.live.emplace(id->value(), std::move(t));
      im.step_owner[id->value()] = request;
      std::shared_ptr<GenerationRecord> record = g.record;
      im.generations.emplace(request, std::move(g));
      return record;
    }();
  }));
  return result;
}

void Master::StepRetired(uint64_t request, const RetiredInstance& r, Timestamp now) {
  Impl& im = *impl_;
  auto it = im.generations.find(request);
  if (it == im.generations.end()) return;
  Impl::Generation& g = it->second;
  auto end_request = [&](GenerationEnd end, std::string message) {
    g.record->Finish(end, std::move(message));
    im.ReleaseKv(g);
    im.generations.erase(it);
  };
  if (g.produced == 0 && r.state == InstanceState::kDone) g.kv = r.produced;
  if (r.state != InstanceState::kDone) {
    const bool cancelled = g.cancel_requested || r.state == InstanceState::kCancelled;
    end_request(cancelled ? GenerationEnd::kCancelled : GenerationEnd::kError,
                r.failure.empty() ? std::string(ToStd(InstanceStateName(r.state))) : r.failure);
    return;
  }
  std::optional<std::vector<int64_t>> tokens = im.TakeTokens(r.id);
  if (!tokens.has_value() || tokens->size() != 1) {
    end_request(GenerationEnd::kError, StrCat("step ", g.produced, " (instance ", r.id, ") reported no token"));
    return;
  }
  const int64_t token = (*tokens)[0];
  GeneratedToken out;
  out.token = token;
  out.index = g.produced++;
  out.time = now;
  if (out.index == 0 && g.first_start != Timestamp::Never()) {
    out.queue_ms = static_cast<double>((g.first_start - g.record->arrival()).nanos()) / 1e6;
  }
  const bool stop = std::find(g.args.stop_tokens.begin(), g.args.stop_tokens.end(), token) != g.args.stop_tokens.end();
  if (stop) {
    out.end = GenerationEnd::kStop;
  } else if (g.produced >= g.args.max_tokens) {
    out.end = GenerationEnd::kLength;
  }
  if (out.end == GenerationEnd::kNone && g.cancel_requested) out.end = GenerationEnd::kCancelled;
  g.record->Append(out);
  if (out.end != GenerationEnd::kNone) {
    end_request(out.end, out.end == GenerationEnd::kCancelled ? "cancelled by the client" : "");
    return;
  }
  if (g.kv.empty()) {
    end_request(GenerationEnd::kError, "the prefill retained no KV cache");
    return;
  }
  // The next step: one token on top of prompt + (produced - 1) cached ones.
  const int64_t context = static_cast<int64_t>(g.args.prompt.size()) + g.produced - 1;
  InstanceSpec spec =
      LlamaDecodeStep(g.decode_tpl, context, g.kv, g.cls, DecodeStepArrival(g.cls, g.record->arrival(), now));
  spec.priority = g.args.priority;
  spec.tenant = TenantId(g.cls == PriorityClass::kOffline ? kOfflineTenantBase : 0);
  spec.label = g.args.client_tag;
  if (g.args.deadline_ms > 0) spec.deadline = g.record->arrival() + Duration::Millis(g.args.deadline_ms);
  auto id = im.gmg.Instantiate(spec);
  if (!id.ok()) {
    end_request(GenerationEnd::kError, StrCat("decode step ", g.produced, ": ", id.status().message()));
    return;
  }
  const std::vector<int64_t> last = {token};
  if (absl::Status s = im.SetRequest(g.deployment, *id, last, 1, g.args.temperature, g.args.top_p,
                                     g.args.seed + g.produced, g.args.top_k);
      !s.ok()) {
    (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
    end_request(GenerationEnd::kError, std::string(ToStd(s.message())));
    return;
  }
  for (CheckpointId c : g.kv) im.checkpoint_used[c.value()] = now;
  g.current = *id;
  Impl::Tracked t;
  t.id = *id;
  t.record = std::make_shared<InstanceRecord>(id->value());
  t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(g.decode_tpl)->num_ops());
  t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
  im.live.emplace(id->value(), std::move(t));
  im.step_owner[id->value()] = request;
}

absl::Status Master::CancelGeneration(uint64_t request_id) {
  return RunOnLoop([&] {
    Impl& im = *impl_;
    auto it = im.generations.find(request_id);
    if (it == im.generations.end()) return;
    Impl::Generation& g = it->second;
    g.cancel_requested = true;
    const Instance* inst = im.gmg.FindInstance(g.current);
    if (inst != nullptr && !IsTerminalInstanceState(inst->state)) {
      const absl::Status s = im.gmg.CancelInstance(g.current, "the client went away", clock_.Now());
      if (!s.ok()) spdlog::warn("generation {}: cancelling instance {}: {}", request_id, g.current.value(), s.ToString());
    }
  });
}

absl::StatusOr<size_t> Master::LiveGenerations() {
  size_t n = 0;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { n = impl_->generations.size(); }));
  return n;
}

}  // namespace slicesched
