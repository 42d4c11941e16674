// slicectl's commands on the daemon's state and on serving: status,
// devices, deployments, instances, gmg dump, timeline, cancel and generate.
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "slicectl_internal.h"

namespace slicesched::slicectl_internal {
namespace {

int DumpGmg(Client& c, v1::GmgDump* dump) {
  return Call(c, c.admin(), &v1::Admin::Stub::DumpGmg, v1::DumpGmgRequest(), dump);
}

int StreamGenerate(Client& c, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx, /*deadline=*/false);
  auto reader = c.serving().Generate(&ctx, req);
  v1::GenerateResponse r;
  int n = 0;
  double first_ms = 0, last_ms = 0;
  std::string finish;
  while (reader->Read(&r)) {
    if (c.json()) {
      c.out() << ToJson(r, /*pretty=*/false) << "\n";
    } else {
      c.out() << (n == 0 ? "" : " ") << r.token_id();
    }
    c.out().flush();
    if (n == 0) first_ms = r.time_from_arrival_ms();
    last_ms = r.time_from_arrival_ms();
    ++n;
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish = EnumSuffix(v1::FinishReason_Name(r.finish_reason()), "FINISH_REASON_");
      if (r.finish_reason() == v1::FINISH_REASON_ERROR) finish += ": " + r.error_message();
    }
  }
  const grpc::Status s = reader->Finish();
  if (!c.json() && n > 0) {
    c.out() << "\n"
            << n << " tokens, finish " << (finish.empty() ? "?" : finish) << ", first token " << Fixed(first_ms, 1)
            << " ms, last " << Fixed(last_ms, 1) << " ms\n";
  }
  return s.ok() ? kSlicectlOk : c.Fail(s);
}

}  // namespace

int Status(Client& c) {
  v1::StatusResponse r;
  if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Status, v1::StatusRequest(), &r)) return rc;
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  c.out() << KeyValues({
      {"version", r.version()},
      {"state", EnumSuffix(v1::ServingState_Name(r.state()), "SERVING_STATE_")},
      {"uptime", HumanDuration(r.uptime_ms())},
      {"devices", StrCat(r.num_devices())},
      {"deployments", r.deployments().empty() ? "-" : absl::StrJoin(r.deployments(), ", ")},
      {"live instances",
       StrCat(r.live_instances(), " (queued: ", r.queued_online(), " online, ", r.queued_offline(), " offline)")},
      {"jobs", StrCat(r.jobs_running(), " running, ", r.jobs_queued(), " queued")},
      {"policy", r.policy()},
      {"state dir", r.state_dir()},
  });
  // The runtime calibration: what the simulator multiplies its predictions by.
  const v1::Calibration& cal = r.calibration();
  if (cal.devices().empty()) return kSlicectlOk;
  std::vector<std::vector<std::string>> rows;
  auto row = [&rows](const std::string& name, const v1::CalibrationFactor& f, const std::string& drift,
                     const std::string& ops, const std::string& busy) {
    rows.push_back({name, absl::StrFormat("%.3f", f.factor()), drift, absl::StrFormat("%.3f", f.raw()),
                    absl::StrFormat("%.3f", f.weight()), StrCat(f.samples()), ops, busy});
  };
  for (const v1::DeviceCalibration& d : cal.devices()) {
    row(d.name().empty() ? StrCat("device ", d.device()) : d.name(), d.speed(),
        absl::StrFormat("%.3f", d.has_drift() ? d.drift().factor() : 1.0), StrCat(d.operators()),
        absl::StrFormat("%.1f s", d.busy_seconds()));
  }
  row("overlap", cal.overlap(), "-", "-", "-");
  row("transfer overlap", cal.transfer_overlap(), "-", "-", "-");
  c.out() << "\ncalibration (speed factor per device within its type, > 1 slower, times its type's drift; "
             "overlap slowdowns)\n"
          << FormatTable({"FACTOR OF", "VALUE", "DRIFT", "RAW", "WEIGHT", "SAMPLES", "OPERATORS", "BUSY"}, rows);
  return kSlicectlOk;
}

int Devices(Client& c) {
  v1::DevicesResponse r;
  if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Devices, v1::DevicesRequest(), &r)) return rc;
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::DeviceStatus& d : r.devices()) {
    const v1::DeviceMemory& m = d.memory();
    const int64_t used = m.weights_bytes() + m.activations_bytes() + m.workspace_bytes() + m.checkpoints_bytes();
    rows.push_back({StrCat(d.device().id()), d.device().name(), d.device().type(), d.device().backend(),
                    StrCat(HumanBytes(used), " / ", HumanBytes(d.device().memory_bytes())), StrCat(d.queue_length()),
                    d.running_node() == 0 ? "-" : StrCat(d.running_node()), Percent(d.busy_fraction()),
                    d.healthy() || d.error().empty() ? "ok" : d.error()});
  }
  c.out() << FormatTable({"ID", "NAME", "TYPE", "BACKEND", "MEMORY", "QUEUE", "RUNNING", "BUSY", "HEALTH"}, rows);
  return kSlicectlOk;
}

int Deployments(Client& c) {
  v1::ListDeploymentsResponse r;
  if (int rc = Call(c, c.serving(), &v1::Serving::Stub::ListDeployments, v1::ListDeploymentsRequest(), &r)) {
    return rc;
  }
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Deployment& d : r.deployments()) {
    const v1::DeploymentSpec& s = d.spec();
    const std::string model = s.model().has_llama() ? s.model().llama().name() : s.model().preset();
    std::vector<std::string> parts;
    for (const v1::Partition& p : d.info().partitions()) parts.push_back(p.name());
    rows.push_back({s.name(), model,
                    absl::AsciiStrToLower(EnumSuffix(v1::DeploymentRole_Name(s.role()), "DEPLOYMENT_ROLE_")),
                    absl::StrJoin(parts, ","), HumanBytes(d.info().weight_bytes()),
                    StrCat(d.info().prefill_template(), " ", d.info().decode_template())});
  }
  c.out() << FormatTable({"NAME", "MODEL", "ROLE", "PARTITIONS", "WEIGHTS", "TEMPLATES"}, rows);
  return kSlicectlOk;
}

int Instances(Client& c) {
  v1::GmgDump d;
  if (int rc = DumpGmg(c, &d)) return rc;
  if (c.json()) {
    v1::GmgDump only;
    only.set_taken_at_ns(d.taken_at_ns());
    *only.mutable_instances() = d.instances();
    c.out() << ToJson(only);
    return kSlicectlOk;
  }
  std::map<uint64_t, std::pair<int, int>> ops;  // instance -> done, total (operators only)
  for (const v1::Node& n : d.nodes()) {
    if (n.op() == "transfer") continue;
    auto& [done, total] = ops[n.instance()];
    ++total;
    done += n.state() == v1::NODE_STATE_DONE ? 1 : 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Instance& i : d.instances()) {
    const auto [done, total] = ops[i.id()];
    rows.push_back({StrCat(i.id()), i.template_name(), i.priority_class(), StrCat(i.priority()), i.state(),
                    StrCat(done, "/", total), HumanDuration((d.taken_at_ns() - i.arrival_ns()) / 1000000),
                    i.deadline_ns() == 0 ? "-" : HumanDuration((i.deadline_ns() - d.taken_at_ns()) / 1000000),
                    i.label().empty() ? "-" : i.label()});
  }
  c.out() << FormatTable({"ID", "TEMPLATE", "CLASS", "PRIO", "STATE", "OPS", "AGE", "DEADLINE IN", "LABEL"}, rows);
  return kSlicectlOk;
}

Usage Gmg(const Args& a, Runner* run) {
  if (a.words()[1] != "dump") return UsageError{StrCat("gmg: unknown subcommand '", a.words()[1], "' (expected dump)")};
  const std::string format = a.Get("--format", "json");
  if (format != "json" && format != "dot") {
    return UsageError{StrCat("gmg dump: --format must be json or dot, got '", format, "'")};
  }
  *run = [format](Client& c) {
    v1::GmgDump d;
    if (int rc = DumpGmg(c, &d)) return rc;
    c.out() << (format == "dot" ? GmgDumpToDot(d) : ToJson(d));
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

Usage Timeline(const Args& a, Runner* run) {
  v1::TimelineRequest req;
  req.set_format(v1::TIMELINE_FORMAT_CHROME_TRACE);
  for (const char* flag : {"--since-ns", "--until-ns", "--max-events"}) {
    if (!a.Has(flag)) continue;
    int64_t v = 0;
    const bool max = std::string_view(flag) == "--max-events";
    if (!ParseNumber(a.Get(flag), &v) || v < 0 || (max && v > 0xffffffffLL)) {
      return UsageError{StrCat("timeline: ", flag, ": expected a number >= 0, got '", a.Get(flag), "'")};
    }
    if (max) {
      req.set_max_events(static_cast<uint32_t>(v));
    } else if (std::string_view(flag) == "--since-ns") {
      req.set_since_ns(v);
    } else {
      req.set_until_ns(v);
    }
  }
  *run = [req, path = a.Get("--out")](Client& c) {
    v1::TimelineResponse r;
    if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Timeline, req, &r)) return rc;
    if (r.truncated()) c.err() << "slicectl: timeline truncated to the most recent events (see --max-events)\n";
    if (path.empty()) {
      c.out() << r.chrome_trace_json();
      return static_cast<int>(kSlicectlOk);
    }
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << r.chrome_trace_json();
    f.close();
    if (!f) {
      c.err() << "slicectl: timeline: cannot write '" << path << "'\n";
      return static_cast<int>(kSlicectlUsage);
    }
    c.out() << "wrote " << r.chrome_trace_json().size() << " bytes to " << path << "\n";
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

Usage Cancel(const Args& a, Runner* run) {
  Usage error;
  const std::optional<uint64_t> parsed = PositiveId(a, "cancel", "INSTANCE_ID", &error);
  if (!parsed) return error;
  const uint64_t id = *parsed;
  *run = [id](Client& c) {
    v1::CancelRequest req;
    req.set_instance_id(id);
    v1::CancelResponse r;
    if (int rc = Call(c, c.serving(), &v1::Serving::Stub::Cancel, req, &r)) return rc;
    if (c.json()) {
      c.out() << ToJson(r);
    } else {
      c.out() << "instance " << id << ": " << EnumSuffix(v1::InstanceState_Name(r.state()), "INSTANCE_STATE_") << "\n";
    }
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

Usage Generate(const Args& a, Runner* run) {
  v1::GenerateRequest req;
  req.set_deployment(a.words()[1]);
  if (!a.Has("--prompt")) return UsageError{"generate: --prompt \"TOKEN TOKEN ...\" is required"};
  for (absl::string_view t : absl::StrSplit(a.Get("--prompt"), absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(t, &id)) {
      return UsageError{StrCat("generate: --prompt: token ids are numbers, got '", ToStd(t), "'")};
    }
    req.add_prompt_token_ids(id);
  }
  if (req.prompt_token_ids().empty()) return UsageError{"generate: --prompt: no token ids"};
  uint32_t max_tokens = 0;
  if (!ParseNumber(a.Get("--max-tokens"), &max_tokens) || max_tokens == 0) {
    return UsageError{StrCat("generate: --max-tokens N (>= 1) is required, got '", a.Get("--max-tokens"), "'")};
  }
  req.set_max_tokens(max_tokens);
  v1::SamplingParams* sp = req.mutable_sampling();
  if (a.Has("--seed")) {
    uint64_t seed = 0;
    if (!ParseNumber(a.Get("--seed"), &seed))
      return UsageError{StrCat("generate: --seed: not a number: '", a.Get("--seed"), "'")};
    sp->set_seed(seed);
  }
  if (a.Has("--top-p")) {
    float p = 0;
    if (!ParseNumber(a.Get("--top-p"), &p) || p < 0 || p > 1) {
      return UsageError{StrCat("generate: --top-p: expected 0..1, got '", a.Get("--top-p"), "'")};
    }
    sp->set_top_p(p);
  }
  if (a.Has("--top-k")) {
    uint32_t k = 0;
    if (!ParseNumber(a.Get("--top-k"), &k))
      return UsageError{StrCat("generate: --top-k: not a number: '", a.Get("--top-k"), "'")};
    sp->set_top_k(k);
  }
  if (a.Has("--temperature")) {
    float t = 0;
    if (!ParseNumber(a.Get("--temperature"), &t) || t < 0) {
      return UsageError{StrCat("generate: --temperature: expected >= 0, got '", a.Get("--temperature"), "'")};
    }
    sp->set_temperature(t);
  }
  if (a.Has("--offline")) req.set_priority_class(v1::PRIORITY_CLASS_OFFLINE);

  *run = [req](Client& c) { return StreamGenerate(c, req); };
  return std::nullopt;
}

}  // namespace slicesched::slicectl_internal
