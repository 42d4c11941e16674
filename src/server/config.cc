#include "slicesched/server/config.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace presets {
extern const std::string_view kSlicedYaml;
}  // namespace presets

namespace {

constexpr absl::string_view kEmbeddedSource = "<embedded:configs/sliced.yaml>";
constexpr size_t kMaxUnixSocketPath = 107;  // sizeof(sockaddr_un::sun_path) - 1
const char* const kLogLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// "host:port", "[v6]:port" or ":port"; port 1..65535.
bool ValidTcpAddress(const std::string& addr, std::string* why) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) {
    *why = "expected HOST:PORT";
    return false;
  }
  const std::string host = addr.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(addr.substr(colon + 1), &port) || port < 1 || port > 65535) {
    *why = "port must be a number in 1..65535";
    return false;
  }
  if (host.find(':') != std::string::npos && !(host.front() == '[' && host.back() == ']')) {
    *why = "an IPv6 host must be in brackets, e.g. [::1]:50051";
    return false;
  }
  return true;
}

bool IsFileSource(absl::string_view source) { return !source.empty() && source.front() != '<'; }

std::string DirOf(absl::string_view source) {
  if (!IsFileSource(source)) return "";
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(std::filesystem::path{std::string(source)}, ec);
  return ec ? std::filesystem::path{std::string(source)}.parent_path().string() : p.parent_path().string();
}

void ParseModel(const ConfigReader& d, DeploymentConfig* dep) {
  ConfigReader model = d.RequiredChild("model");
  if (!model.present()) return;
  if (model.IsScalar()) {
    dep->model_preset = model.As<std::string>();
    auto preset = LlamaPreset(dep->model_preset);
    if (preset.ok()) {
      dep->model = *preset;
    } else {
      model.Error(preset.status().message());
    }
    return;
  }
  const size_t before = d.errors()->size();
  dep->model = LlamaDims::FromConfig(model);
  if (d.errors()->size() == before) {
    absl::Status s = dep->model.Validate();
    if (!s.ok()) model.Error(s.message());
  }
}

void ParseWeights(const ConfigReader& d, absl::string_view base_dir, DeploymentConfig* dep) {
  ConfigReader w = d.RequiredChild("weights");
  if (!w.present()) return;
  w.RejectUnknownKeys({"seed", "safetensors"});
  const bool has_seed = w.Has("seed");
  const bool has_file = w.Has("safetensors");
  if (has_seed == has_file) {
    w.Error("set exactly one of 'seed' (random weights) or 'safetensors' (a file path)");
    return;
  }
  if (has_seed) {
    dep->weights.kind = WeightsConfig::Kind::kSeed;
    const int64_t seed = w.Required<int64_t>("seed");
    w.Check(seed >= 0, "seed", StrCat("must not be negative, got ", seed));
    dep->weights.seed = static_cast<uint64_t>(std::max<int64_t>(seed, 0));
  } else {
    dep->weights.kind = WeightsConfig::Kind::kSafetensors;
    std::string path = w.Required<std::string>("safetensors");
    w.Check(!path.empty(), "safetensors", "must not be empty");
    if (!path.empty() && !base_dir.empty() && path.front() != '/') {
      path = (std::filesystem::path(std::string(base_dir)) / path).lexically_normal().string();
    }
    dep->weights.safetensors_path = path;
  }
}

void ParsePartitions(const ConfigReader& d, const AcceleratorSet* cluster, bool model_ok,
                     DeploymentConfig* dep) {
  ConfigReader parts = d.Child("partitions");
  if (!parts.present()) return;
  if (!parts.IsList()) {
    parts.Error("expected a list of partition names, e.g. [single, pp2]");
    return;
  }
  std::vector<CandidatePartition> offered;
  if (model_ok) {
    auto templates = BuildLlamaTemplates(dep->model);
    if (templates.ok()) {
      offered = templates->prefill->partitions();
    } else {
      d.Check(false, "model", templates.status().message());
      model_ok = false;
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    ConfigReader p = parts.At(i);
    const std::string name = p.As<std::string>();
    if (std::find(dep->partitions.begin(), dep->partitions.end(), name) != dep->partitions.end()) {
      p.Error(StrCat("partition '", name, "' is listed twice"));
      continue;
    }
    dep->partitions.push_back(name);
    if (!model_ok) continue;
    auto it = std::find_if(offered.begin(), offered.end(),
                           [&](const CandidatePartition& c) { return c.name == name; });
    if (it == offered.end()) {
      std::vector<std::string> names;
      for (const CandidatePartition& c : offered) names.push_back(c.name);
      p.Error(StrCat("model '", dep->model.name, "' has no partition '", name,
                     "' (it offers: ", absl::StrJoin(names, ", "), ")"));
    } else if (cluster != nullptr && cluster->size() > 0 &&
               static_cast<size_t>(it->num_slots) > cluster->size()) {
      p.Error(StrCat("partition '", name, "' needs ", it->num_slots, " devices but the cluster has ",
                     cluster->size()));
    }
  }
}

// Longest duration a config knob may give: Duration holds int64 nanoseconds
// (about 292 years), and a larger double would not convert.
constexpr double kMaxConfigSeconds = 1e9;

// A duration knob `key` given as a number of units (`unit_ns` nanoseconds
// each, named `unit` in errors): finite, at most kMaxConfigSeconds, and
// positive (or, with allow_zero, not negative). `fallback` when absent or
// invalid.
Duration DurationKnob(const ConfigReader& r, absl::string_view key, double unit_ns, absl::string_view unit,
                      Duration fallback, bool allow_zero) {
  const double v = r.Optional<double>(key, static_cast<double>(fallback.nanos()) / unit_ns);
  const double ns = v * unit_ns;
  if (!allow_zero && !(v > 0)) {
    r.Check(false, key, StrCat("must be positive, got ", v));
  } else if (!(v >= 0)) {
    r.Check(false, key, StrCat("must not be negative, got ", v));
  } else if (!(ns <= kMaxConfigSeconds * 1e9)) {
    r.Check(false, key, StrCat("must be at most ", kMaxConfigSeconds * 1e9 / unit_ns, " ", unit, ", got ", v));
  } else if (!allow_zero && ns < 1) {
    r.Check(false, key, StrCat("must be at least 1 ns, got ", v, " ", unit));
  } else {
    return Duration::Nanos(static_cast<int64_t>(ns));
  }
  return fallback;
}

void ParseScheduler(const ConfigReader& s, SchedulerConfig* c) {
  s.RejectUnknownKeys({"volume_ms", "offline_queue_limit", "offline_aging_s", "timeliness", "owner_nap_us",
                       "prefill_chunk_tokens", "offline_prefill_chunk_tokens", "online_new_device_cost_ms",
                       "online_stream_device_cost_ms", "stream_idle_after_s", "offline_avoids_online_streams",
                       "pipeline_online_prefill"});
  c->volume = DurationKnob(s, "volume_ms", 1e6, "ms", c->volume, /*allow_zero=*/false);
  c->offline_queue_limit = s.Optional<int64_t>("offline_queue_limit", c->offline_queue_limit);
  s.CheckPositive("offline_queue_limit", c->offline_queue_limit);
  c->offline_aging = DurationKnob(s, "offline_aging_s", 1e9, "s", c->offline_aging, /*allow_zero=*/true);
  c->timeliness = s.Optional<double>("timeliness", c->timeliness);
  s.CheckPositive("timeliness", c->timeliness);
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"prefill_chunk_tokens", &c->prefill_chunk_tokens},
                            {"offline_prefill_chunk_tokens", &c->offline_prefill_chunk_tokens}}) {
    *field = s.Optional<int64_t>(key, *field);
    s.Check(*field >= 0, key, StrCat("must be >= 0 (0: never chunk), got ", *field));
  }
  c->online_new_device_cost =
      DurationKnob(s, "online_new_device_cost_ms", 1e6, "ms", c->online_new_device_cost, /*allow_zero=*/true);
  c->online_stream_device_cost =
      DurationKnob(s, "online_stream_device_cost_ms", 1e6, "ms", c->online_stream_device_cost, /*allow_zero=*/true);
  c->stream_idle_after = DurationKnob(s, "stream_idle_after_s", 1e9, "s", c->stream_idle_after, /*allow_zero=*/true);
  c->offline_avoids_online_streams = s.Optional<bool>("offline_avoids_online_streams", c->offline_avoids_online_streams);
  c->pipeline_online_prefill = s.Optional<bool>("pipeline_online_prefill", c->pipeline_online_prefill);
  if (s.Has("owner_nap_us")) {
    c->owner_nap = DurationKnob(s, "owner_nap_us", 1e3, "us", Duration::Zero(), /*allow_zero=*/true);
  }
}

// A file knob (`key`, already resolved to `path`) must not name a
// directory: the gains table would read as empty and the time LUT could
// never be written back. A path that does not exist is left to its reader.
void CheckNotDirectory(const ConfigReader& p, absl::string_view key, const std::string& path,
                       absl::string_view expected) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::is_directory(path, ec)) return;
  p.Check(false, key, StrCat("'", path, "' is a directory; expected ", expected));
}

// planner.time_lut / planner.profile_from_lut (data parallelism's times).
void ParsePlannerTimeLut(const ConfigReader& p, absl::string_view base_dir, PlannerConfig* c) {
  c->time_lut_path = p.Optional<std::string>("time_lut", "");
  if (!c->time_lut_path.empty() && c->time_lut_path.front() != '/' && !base_dir.empty()) {
    c->time_lut_path = StrCat(base_dir, "/", c->time_lut_path);
  }
  CheckNotDirectory(p, "time_lut", c->time_lut_path, "a CSV file (created when missing)");
  c->profile_from_lut = p.Optional<bool>("profile_from_lut", false);
  p.Check(!c->profile_from_lut || !c->time_lut_path.empty(), "profile_from_lut",
          "needs planner.time_lut (the LUT to read the profile from)");
}

void ParsePlanner(const ConfigReader& p, absl::string_view base_dir, PlannerConfig* c) {
  p.RejectUnknownKeys({"interval_s", "mode", "gains", "checkpoint_interval_s", "prefetch_s", "eval_every_steps",
                       "time_lut", "profile_from_lut", "spatial_step", "max_eval_examples", "neutral_pairs"});
  c->interval = DurationKnob(p, "interval_s", 1e9, "s", c->interval, /*allow_zero=*/false);
  const std::string mode = absl::AsciiStrToLower(p.Optional<std::string>("mode", "ymir"));
  if (mode == "ymir") {
    c->mode = PlannerConfig::Mode::kYmir;
  } else if (mode == "elastic") {
    c->mode = PlannerConfig::Mode::kElastic;
  } else if (mode == "srtf") {
    c->mode = PlannerConfig::Mode::kSrtf;
  } else if (mode == "pollux") {
    c->mode = PlannerConfig::Mode::kPollux;
  } else {
    p.Check(false, "mode", StrCat("expected ymir, elastic, srtf or pollux, got '", mode, "'"));
  }
  const std::string step = p.Optional<std::string>("spatial_step", "mean");
  if (step == "sum") {
    c->spatial_step = PlannerConfig::SpatialStep::kSum;
  } else {
    p.Check(step == "mean", "spatial_step", StrCat("expected mean or sum, got '", step, "'"));
  }
  c->gains_path = p.Optional<std::string>("gains", "");
  if (!c->gains_path.empty() && c->gains_path.front() != '/' && !base_dir.empty()) {
    c->gains_path = StrCat(base_dir, "/", c->gains_path);
  }
  CheckNotDirectory(p, "gains", c->gains_path, "a gains table (a CSV file)");
  const std::string neutral = absl::AsciiStrToLower(p.Optional<std::string>("neutral_pairs", "skip"));
  p.Check(neutral == "skip" || neutral == "plan", "neutral_pairs", StrCat("expected skip or plan, got '", neutral, "'"));
  c->pair_neutral = neutral == "plan";
  c->checkpoint_interval =
      DurationKnob(p, "checkpoint_interval_s", 1e9, "s", c->checkpoint_interval, /*allow_zero=*/false);
  c->prefetch = DurationKnob(p, "prefetch_s", 1e9, "s", c->prefetch, /*allow_zero=*/true);
  c->eval_every_steps = p.Optional<int64_t>("eval_every_steps", c->eval_every_steps);
  p.Check(c->eval_every_steps >= 0, "eval_every_steps", StrCat("must not be negative, got ", c->eval_every_steps));
  c->max_eval_examples = p.Optional<int64_t>("max_eval_examples", c->max_eval_examples);
  p.Check(c->max_eval_examples >= 1 && c->max_eval_examples <= (int64_t{1} << 20), "max_eval_examples",
          StrCat("must be in 1..1048576, got ", c->max_eval_examples));
  ParsePlannerTimeLut(p, base_dir, c);
}

void ParseListen(const ConfigReader& l, ListenConfig* c) {
  l.RejectUnknownKeys({"unix_socket", "tcp", "tls", "admin_token", "metrics"});
  if (l.present() && l.IsMap() && l.node()["unix_socket"] && l.node()["unix_socket"].IsNull()) {
    c->unix_socket.clear();  // `unix_socket: ~` disables it too
  }
  c->unix_socket = l.Optional<std::string>("unix_socket", c->unix_socket);
  if (!c->unix_socket.empty()) {
    const std::string problem = UnixSocketPathProblem(c->unix_socket);
    l.Check(problem.empty(), "unix_socket", problem);
  }
  c->tcp_address = l.Optional<std::string>("tcp", "");
  std::string why;
  if (!c->tcp_address.empty() && !ValidTcpAddress(c->tcp_address, &why)) {
    l.Check(false, "tcp", StrCat(why, ", got '", c->tcp_address, "'"));
  }
  ConfigReader tls = l.Child("tls");
  if (tls.present()) {
    tls.RejectUnknownKeys({"cert", "key"});
    c->tls_cert = tls.Required<std::string>("cert");
    c->tls_key = tls.Required<std::string>("key");
    l.Check(!c->tcp_address.empty(), "tls", "is set but listen.tcp is not (TLS applies to TCP only)");
  } else if (!c->tcp_address.empty()) {
    l.Check(false, "tcp", "requires listen.tls with 'cert' and 'key' (TCP is served over TLS only)");
  }
  c->admin_token = l.Optional<std::string>("admin_token", "");
  c->metrics_address = l.Optional<std::string>("metrics", "");
  if (!c->metrics_address.empty() && !ValidTcpAddress(c->metrics_address, &why)) {
    l.Check(false, "metrics", StrCat(why, ", got '", c->metrics_address, "'"));
  }
  if (c->unix_socket.empty() && c->tcp_address.empty()) {
    l.Error("no listen address: set unix_socket, tcp or both");
  }
}

}  // namespace

absl::string_view DeploymentRoleName(DeploymentRole role) {
  return role == DeploymentRole::kOnline ? "online" : "offline";
}

const DeploymentConfig* SlicedConfig::FindDeployment(std::string_view name) const {
  for (const DeploymentConfig& d : deployments) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string DeploymentConfig::ToYaml() const {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << name;
  e << YAML::Key << "model" << YAML::Value;
  if (!model_preset.empty()) {
    e << model_preset;
  } else {
    e << YAML::BeginMap;
    e << YAML::Key << "name" << YAML::Value << model.name;
    e << YAML::Key << "layers" << YAML::Value << model.layers;
    e << YAML::Key << "hidden" << YAML::Value << model.hidden;
    e << YAML::Key << "heads" << YAML::Value << model.heads;
    e << YAML::Key << "kv_heads" << YAML::Value << model.kv_heads;
    e << YAML::Key << "ffn" << YAML::Value << model.ffn;
    e << YAML::Key << "vocab" << YAML::Value << model.vocab;
    e << YAML::Key << "dtype" << YAML::Value << std::string(ToStd(DTypeName(model.dtype)));
    e << YAML::Key << "fusion" << YAML::Value << model.fusion;
    e << YAML::EndMap;
  }
  e << YAML::Key << "weights" << YAML::Value << YAML::Flow << YAML::BeginMap;
  if (weights.kind == WeightsConfig::Kind::kSeed) {
    e << YAML::Key << "seed" << YAML::Value << weights.seed;
  } else {
    e << YAML::Key << "safetensors" << YAML::Value << weights.safetensors_path;
  }
  e << YAML::EndMap;
  e << YAML::Key << "role" << YAML::Value << std::string(ToStd(DeploymentRoleName(role)));
  if (!partitions.empty()) {
    e << YAML::Key << "partitions" << YAML::Value << YAML::Flow << partitions;
  }
  if (!tokenizer.empty()) e << YAML::Key << "tokenizer" << YAML::Value << tokenizer;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

DeploymentConfig ParseDeploymentConfig(const ConfigReader& d, const AcceleratorSet* cluster,
                                       absl::string_view base_dir) {
  DeploymentConfig dep;
  d.RejectUnknownKeys({"name", "model", "weights", "role", "partitions", "tokenizer"});
  dep.name = d.Required<std::string>("name");
  if (d.Has("name")) {
    d.Check(ValidName(dep.name), "name",
            StrCat("'", dep.name, "' is not a valid name (letters, digits, '.', '_', '-')"));
  }
  const size_t before = d.errors()->size();
  ParseModel(d, &dep);
  const bool model_ok = d.errors()->size() == before && d.Has("model");
  ParseWeights(d, base_dir, &dep);
  const std::string role = d.Required<std::string>("role");
  if (role == "online") {
    dep.role = DeploymentRole::kOnline;
  } else if (role == "offline") {
    dep.role = DeploymentRole::kOffline;
  } else if (d.Has("role")) {
    d.Check(false, "role", StrCat("expected 'online' or 'offline', got '", role, "'"));
  }
  ParsePartitions(d, cluster, model_ok, &dep);
  if (d.Has("tokenizer")) {
    std::string path = d.Required<std::string>("tokenizer");
    d.Check(!path.empty(), "tokenizer", "must not be empty");
    if (!path.empty() && !base_dir.empty() && path.front() != '/') {
      path = (std::filesystem::path(std::string(base_dir)) / path).lexically_normal().string();
    }
    dep.tokenizer = path;
  }
  return dep;
}

absl::StatusOr<DeploymentConfig> DeploymentConfigFromYaml(absl::string_view yaml,
                                                          absl::string_view source) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(yaml, source));
  ConfigErrors errors;
  ConfigReader r(root, source, &errors);
  if (!r.IsMap()) return absl::InvalidArgumentError(StrCat(source, ": expected a deployment map"));
  DeploymentConfig dep = ParseDeploymentConfig(r, nullptr, "");
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  return dep;
}

absl::StatusOr<SlicedConfig> ParseSlicedConfig(const YAML::Node& root, absl::string_view source) {
  ConfigErrors errors;
  ConfigReader r(root, source, &errors);
  SlicedConfig c;
  c.source = std::string(source);
  if (!r.present()) {
    return absl::InvalidArgumentError(StrCat(source, ": the configuration is empty"));
  }
  r.RejectUnknownKeys({"cluster", "deployments", "scheduler", "planner", "batch", "listen", "state_dir", "log_level"});

  c.cluster = AcceleratorSet::FromConfig(r.RequiredChild("cluster"), &errors);
  const AcceleratorSet* cluster = errors.ok() ? &c.cluster : nullptr;

  ConfigReader deps = r.Child("deployments");
  const std::string base_dir = DirOf(source);
  std::map<std::string, int> line_of_name;
  for (size_t i = 0; i < deps.size(); ++i) {
    ConfigReader d = deps.At(i);
    DeploymentConfig dep = ParseDeploymentConfig(d, cluster, base_dir);
    if (!dep.name.empty()) {
      const YAML::Node& name_node = d.IsMap() ? d.node()["name"] : d.node();
      const int line = name_node.Mark().line + 1;
      auto [it, inserted] = line_of_name.emplace(dep.name, line);
      if (!inserted) {
        d.Check(false, "name",
                StrCat("duplicate deployment name '", dep.name, "' (first defined at line ", it->second, ")"));
        continue;
      }
    }
    c.deployments.push_back(std::move(dep));
  }

  ParseScheduler(r.Child("scheduler"), &c.scheduler);
  ParsePlanner(r.Child("planner"), base_dir, &c.planner);
  {
    const ConfigReader b = r.Child("batch");
    b.RejectUnknownKeys({"max_inflight"});
    c.batch.max_inflight = b.Optional<int64_t>("max_inflight", c.batch.max_inflight);
    b.CheckPositive("max_inflight", c.batch.max_inflight);
  }
  ParseListen(r.Child("listen"), &c.listen);

  c.state_dir = r.Optional<std::string>("state_dir", c.state_dir);
  const std::string state_dir_problem = AbsolutePathProblem(c.state_dir);
  r.Check(state_dir_problem.empty(), "state_dir", state_dir_problem);
  c.log_level = absl::AsciiStrToLower(r.Optional<std::string>("log_level", c.log_level));
  r.Check(std::find(std::begin(kLogLevels), std::end(kLogLevels), c.log_level) != std::end(kLogLevels),
          "log_level",
          StrCat("expected one of trace, debug, info, warn, error, critical, off; got '", c.log_level, "'"));

  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  return c;
}

std::string AbsolutePathProblem(std::string_view path) {
  if (path.empty() || path.front() != '/') return StrCat("must be an absolute path, got '", path, "'");
  return "";
}

std::string UnixSocketPathProblem(std::string_view path) {
  if (std::string problem = AbsolutePathProblem(path); !problem.empty()) return problem;
  if (path.size() > kMaxUnixSocketPath) {
    return StrCat("is ", path.size(), " bytes; a socket path holds at most ", kMaxUnixSocketPath);
  }
  return "";
}

absl::Status ApplySlicedOverrides(const SlicedOverrides& overrides, SlicedConfig* config) {
  if (!overrides.unix_socket.empty()) {
    const std::string problem = UnixSocketPathProblem(overrides.unix_socket);
    if (!problem.empty()) return absl::InvalidArgumentError(StrCat("--socket: ", problem));
  }
  if (!overrides.state_dir.empty()) {
    const std::string problem = AbsolutePathProblem(overrides.state_dir);
    if (!problem.empty()) return absl::InvalidArgumentError(StrCat("--state-dir: ", problem));
  }
  if (!overrides.unix_socket.empty()) config->listen.unix_socket = overrides.unix_socket;
  if (!overrides.state_dir.empty()) config->state_dir = overrides.state_dir;
  return absl::OkStatus();
}

absl::StatusOr<SlicedConfig> LoadSlicedConfig(const std::string& path) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  return ParseSlicedConfig(root, path);
}

absl::string_view PlannerModeName(PlannerConfig::Mode mode) {
  switch (mode) {
    case PlannerConfig::Mode::kYmir: return "ymir";
    case PlannerConfig::Mode::kElastic: return "elastic";
    case PlannerConfig::Mode::kSrtf: return "srtf";
    case PlannerConfig::Mode::kPollux: return "pollux";
  }
  return "ymir";
}

std::string_view DefaultSlicedConfigYaml() { return presets::kSlicedYaml; }

absl::StatusOr<SlicedConfig> DefaultSlicedConfig() {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(presets::kSlicedYaml), kEmbeddedSource));
  return ParseSlicedConfig(root, kEmbeddedSource);
}

}  // namespace slicesched
