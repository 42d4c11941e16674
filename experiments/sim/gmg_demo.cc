#include "slicesched/experiments/gmg_demo.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"

namespace slicesched {
namespace presets {
extern const std::string_view kSlicesimYaml;
}  // namespace presets

absl::StatusOr<GmgDemoConfig> ParseGmgDemoConfig(const YAML::Node& root, absl::string_view source) {
  ConfigErrors errors;
  ConfigReader r(root, source, &errors);
  r.RejectUnknownKeys({"cluster", "model", "demo"});
  GmgDemoConfig c;
  c.cluster = AcceleratorSet::FromConfig(r.RequiredChild("cluster"), &errors);
  ConfigReader model = r.RequiredChild("model");
  if (model.IsScalar()) {
    auto preset = LlamaPreset(model.As<std::string>());
    if (preset.ok()) {
      c.model = *preset;
    } else {
      model.Error(preset.status().message());
    }
  } else if (model.present()) {
    c.model = LlamaDims::FromConfig(model);
  }
  ConfigReader demo = r.Child("demo");
  demo.RejectUnknownKeys({"prefill_tokens", "decode_steps", "partition", "devices"});
  c.prefill_tokens = demo.Optional<int64_t>("prefill_tokens", 2048);
  demo.CheckPositive("prefill_tokens", c.prefill_tokens);
  c.decode_steps = demo.Optional<int64_t>("decode_steps", 4);
  demo.Check(c.decode_steps >= 0, "decode_steps", "must not be negative");
  c.partition = demo.Optional<std::string>("partition", "single");
  ConfigReader devs = demo.Child("devices");
  for (size_t i = 0; i < devs.size(); ++i) c.devices.push_back(devs.At(i).As<std::string>());
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  SLICESCHED_RETURN_IF_ERROR(c.model.Validate());
  return c;
}

absl::StatusOr<GmgDemoConfig> DefaultGmgDemoConfig() {
  constexpr absl::string_view kSource = "<embedded:configs/slicesim.yaml>";
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(presets::kSlicesimYaml), kSource));
  return ParseGmgDemoConfig(root, kSource);
}

absl::StatusOr<GmgDemoConfig> LoadGmgDemoConfig(const std::string& path) {
  if (path.empty()) return DefaultGmgDemoConfig();
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  return ParseGmgDemoConfig(root, path);
}

namespace {

std::string Human(Bytes b) { return b.ToString(); }

void MemoryTable(const GlobalMappingGraph& g, std::string* out) {
  absl::StrAppendFormat(out, "  %-8s %12s %12s %12s %12s %12s %7s\n", "device", "weights", "activations",
                        "workspace", "checkpoints", "total", "used");
  for (const DeviceSpec& d : g.accelerators().devices()) {
    const DeviceMemory& m = g.memory(d.id);
    if (m.total() == Bytes(0)) continue;
    absl::StrAppendFormat(out, "  %-8s %12s %12s %12s %12s %12s %6.2f%%\n", d.name, Human(m.weights),
                          Human(m.activations), Human(m.workspace), Human(m.checkpoints),
                          Human(m.total()),
                          100.0 * static_cast<double>(m.total().count()) / static_cast<double>(d.memory.count()));
  }
  absl::StrAppendFormat(out, "  frontiers: %d unscheduled, %d scheduled; live instances %d, nodes %d\n",
                        g.unscheduled_frontier().size(), g.scheduled_frontier().size(),
                        g.num_instances(), g.num_nodes());
}

// Runs every issued node of the instance in dependency order, one event per
// millisecond of virtual time (the GMG times nothing; this only orders events).
absl::Status RunToCompletion(GlobalMappingGraph& g, InstanceId id, ManualClock& clock, int* events) {
  while (const Instance* inst = g.FindInstance(id)) {
    std::vector<NodeId> ready;
    for (const OpNode& n : inst->nodes) {
      if (g.IsReady(n.id)) ready.push_back(n.id);
    }
    for (NodeId t : inst->transfers) {
      if (g.IsReady(t)) ready.push_back(t);
    }
    if (ready.empty()) return absl::InternalError("demo instance is stuck: nothing is ready");
    const NodeId next = ready.front();
    SLICESCHED_RETURN_IF_ERROR(g.Start(next, clock.Now()));
    clock.Advance(Duration::Millis(1));
    SLICESCHED_RETURN_IF_ERROR(g.Finish(next, clock.Now()));
    ++*events;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RunGmgDemo(const GmgDemoConfig& c) {
  std::string out;
  GlobalMappingGraph g(c.cluster);
  ManualClock clock;

  absl::StrAppendFormat(&out, "Accelerator set: %d devices\n", c.cluster.size());
  absl::StrAppendFormat(&out, "  %-8s %-6s %-9s %10s\n", "device", "type", "backend", "memory");
  for (const DeviceSpec& d : c.cluster.devices()) {
    absl::StrAppendFormat(&out, "  %-8s %-6s %-9s %10s\n", d.name, d.type, DeviceBackendName(d.backend),
                          Human(d.memory));
  }
  if (c.cluster.size() >= 2) {
    const LinkSpec& l = c.cluster.link(DeviceId(0), DeviceId(1));
    absl::StrAppendFormat(&out, "  link %s<->%s: %.1f GB/s, %s\n", c.cluster.device(DeviceId(0)).name,
                          c.cluster.device(DeviceId(1)).name, l.bandwidth_bytes_per_s / 1e9,
                          l.latency.ToString());
  }

  const LlamaDims& m = c.model;
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t, BuildLlamaTemplates(m));
  absl::StrAppendFormat(&out,
                        "\nModel %s: %d layers, hidden %d, %d heads (%d kv, head dim %d), ffn %d, "
                        "vocab %d, %s\n",
                        m.name, m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim(), m.ffn, m.vocab,
                        DTypeName(m.dtype));
  absl::StrAppendFormat(&out, "  parameters: %.3f G in all; %.3f G per fused operator of %d layers (%s)\n",
                        m.TotalParams() / 1e9, m.ParamsPerGroup() / 1e9, m.fusion,
                        Human(Bytes(m.ParamsPerGroup() * DTypeSize(m.dtype))));
  absl::StrAppendFormat(&out, "  KV cache: %d bytes per token per layer (2 x %d kv heads x %d x %d B)\n",
                        m.KvBytesPerTokenPerLayer(), m.kv_heads, m.head_dim(), DTypeSize(m.dtype));

  SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre_id, g.RegisterTemplate(t.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec_id, g.RegisterTemplate(t.decode));
  for (const auto& tpl : {t.prefill, t.decode}) {
    absl::StrAppendFormat(&out, "\nTemplate %s (symbols:", tpl->name());
    for (const std::string& s : tpl->FreeSymbols()) absl::StrAppend(&out, " ", s);
    absl::StrAppend(&out, "; partitions:");
    for (const auto& p : tpl->partitions()) absl::StrAppend(&out, " ", p.name);
    absl::StrAppend(&out, ")\n");
    absl::StrAppendFormat(&out, "  %-7s %-13s %-24s %12s  %s\n", "op", "kind", "inputs", "weights", "outputs");
    for (const OpSpec& op : tpl->ops()) {
      std::string outs;
      for (const TensorSpec& ts : op.outputs) {
        std::vector<std::string> dims;
        for (const ShapeExpr& e : ts.dims) dims.push_back(e.text());
        absl::StrAppend(&outs, outs.empty() ? "" : ", ", ts.name, "[", absl::StrJoin(dims, ","), "]",
                        DTypeName(ts.dtype), ts.retain ? " retained" : "",
                        ts.updates.empty() ? "" : StrCat(" grows @", ts.updates));
      }
      absl::StrAppendFormat(&out, "  %-7s %-13s %-24s %12s  %s\n", op.name, OpKindName(op.kind),
                            absl::StrJoin(op.input_names, ","),
                            op.weight_key.empty() ? "-" : Human(op.weight_bytes), outs);
    }
  }

  // Placement.
  const CandidatePartition* partition = nullptr;
  for (const auto& p : t.prefill->partitions()) {
    if (p.name == c.partition) partition = &p;
  }
  if (partition == nullptr) {
    return absl::InvalidArgumentError(StrCat("demo.partition: the model has no partition '", c.partition, "'"));
  }
  std::vector<DeviceId> slots;
  for (int s = 0; s < partition->num_slots; ++s) {
    if (s < static_cast<int>(c.devices.size())) {
      SLICESCHED_ASSIGN_OR_RETURN(DeviceId d, c.cluster.FindDevice(c.devices[s]));
      slots.push_back(d);
    } else if (static_cast<size_t>(s) < c.cluster.size()) {
      slots.push_back(DeviceId(static_cast<uint16_t>(s)));
    } else {
      return absl::InvalidArgumentError(StrCat("demo: partition '", c.partition, "' needs ",
                                               partition->num_slots, " devices"));
    }
  }
  for (int op = 0; op < t.prefill->num_ops(); ++op) {
    const OpSpec& spec = t.prefill->op(op);
    if (spec.weight_key.empty()) continue;
    SLICESCHED_RETURN_IF_ERROR(g.LoadWeights(slots[partition->slot_of_op[op]], spec.weight_key, spec.weight_bytes));
  }
  absl::StrAppendFormat(&out, "\nWeights loaded for partition %s:\n", partition->name);
  MemoryTable(g, &out);

  InstanceSpec ps;
  ps.template_id = pre_id;
  ps.bindings = {{"B", 1}, {"S", c.prefill_tokens}};
  ps.priority_class = PriorityClass::kOnline;
  ps.arrival = clock.Now();
  ps.label = "demo prefill";
  SLICESCHED_ASSIGN_OR_RETURN(InstanceId pre, g.Instantiate(ps));
  SLICESCHED_RETURN_IF_ERROR(IssueByPartition(g, pre, *partition, slots, 0, clock.Now()).status());
  absl::StrAppendFormat(&out, "\nPrefill of %d tokens issued (%d nodes including transfers):\n",
                        c.prefill_tokens, g.num_nodes());
  MemoryTable(g, &out);
  GmgSnapshot snap = g.Snapshot(clock.Now());
  absl::StrAppendFormat(&out, "  snapshot: %d nodes, %d tensors, %d bytes\n", snap.nodes.size(),
                        snap.tensors.size(), snap.ByteSize());
  int events = 0;
  SLICESCHED_RETURN_IF_ERROR(RunToCompletion(g, pre, clock, &events));
  auto retired = g.TakeRetired();
  absl::StrAppendFormat(&out, "\nPrefill done after %d events; %d KV checkpoints retained:\n", events,
                        retired.back().produced.size());
  MemoryTable(g, &out);

  const std::vector<CheckpointId> kv = retired.back().produced;
  for (int64_t step = 0; step < c.decode_steps; ++step) {
    const InstanceSpec ds =
        LlamaDecodeStep(dec_id, c.prefill_tokens + step, kv, PriorityClass::kOnline, clock.Now());
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId dec, g.Instantiate(ds));
    SLICESCHED_RETURN_IF_ERROR(IssueByPartition(g, dec, *partition, slots, 0, clock.Now()).status());
    SLICESCHED_RETURN_IF_ERROR(RunToCompletion(g, dec, clock, &events));
  }
  (void)g.TakeRetired();
  absl::StrAppendFormat(&out, "\nAfter %d decode steps (KV caches grew to %d tokens):\n", c.decode_steps,
                        c.prefill_tokens + c.decode_steps);
  MemoryTable(g, &out);
  SLICESCHED_RETURN_IF_ERROR(g.VerifyInvariants());
  absl::StrAppend(&out, "  invariants: frontiers and memory equal a from-scratch recomputation\n");
  return out;
}

}  // namespace slicesched
