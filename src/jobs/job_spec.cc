#include "slicesched/jobs/job_spec.h"

#include <algorithm>
#include <cmath>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/synth/wordnet.h"

namespace slicesched::jobs {
namespace {

constexpr size_t kMaxNameLength = 64;
constexpr int64_t kMaxGpus = 4096;
constexpr int64_t kMinPriority = 0;
constexpr int64_t kMaxPriority = 100;
constexpr char kTokensBinMagic[8] = {'S', 'S', 'T', 'O', 'K', 'V', '1', '\n'};
// Upper bounds of the sizes a job may ask for (job_spec.h). They keep the
// runner's products (batch x accumulation, epochs x iterations) far from
// int64 overflow and the allocations they imply within reason.
constexpr int64_t kMaxExamples = int64_t{1} << 24;
constexpr int64_t kMaxSequenceLength = int64_t{1} << 16;
constexpr int64_t kMaxClasses = int64_t{1} << 16;
constexpr int64_t kMaxBatch = int64_t{1} << 16;  // batch_size, grad_accumulation
constexpr int64_t kMaxLoraRank = int64_t{1} << 12;
constexpr int64_t kMaxEpochs = int64_t{1} << 20;
constexpr int64_t kMaxIterations = int64_t{1} << 40;
constexpr double kMaxLearningRate = 10;
constexpr double kMaxLoraAlpha = 1e6;

// `value` of `key` in [lo, hi]; the error gives the bound and the value.
void CheckRange(const ConfigReader& r, const char* key, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo) {
    r.Check(false, key, StrCat("must be at least ", lo, ", got ", value));
  } else if (value > hi) {
    r.Check(false, key, StrCat("must be at most ", hi, ", got ", value));
  }
}
// A `value` of `key` in (0, hi] (so finite).
void CheckPositiveAtMost(const ConfigReader& r, const char* key, double value, double hi) {
  if (!(value > 0)) {
    r.Check(false, key, StrCat("must be positive, got ", value));
  } else if (!(value <= hi)) {
    r.Check(false, key, StrCat("must be at most ", hi, ", got ", value));
  }
}

// Required<T>(key), or nullopt when the field was missing or could not be
// converted (already reported), so range checks do not pile a second error
// onto the same field.
template <typename T>
std::optional<T> RequiredValue(const ConfigReader& r, std::string_view key) {
  const size_t before = r.errors()->size();
  T value = r.Required<T>(ToAbsl(key));
  if (r.errors()->size() != before || !r.present()) return std::nullopt;
  return value;
}

// Required<std::string>(key), with `key: ""` reported as empty (Required
// accepts it), so that callers may treat "" as already reported.
std::string RequiredString(const ConfigReader& r, const char* key) {
  const size_t before = r.errors()->size();
  std::string value = r.Required<std::string>(key);
  if (value.empty() && r.Has(key) && r.errors()->size() == before) r.Check(false, key, "must not be empty");
  return value;
}

// [A-Za-z0-9._-]+
bool ValidName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// [a-z0-9_-]+
bool ValidTaskName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_islower(static_cast<unsigned char>(c)) || absl::ascii_isdigit(static_cast<unsigned char>(c)) ||
           c == '_' || c == '-';
  });
}

void CheckName(const ConfigReader& r, const char* key, const std::string& value, std::string_view what) {
  if (value.empty()) return;  // already reported as missing, or allowed
  r.Check(ValidName(value) && value.size() <= kMaxNameLength, key,
          StrCat(what, " must be 1..", kMaxNameLength, " characters of [A-Za-z0-9._-], got '", value, "'"));
}

void ParseBackbone(const ConfigReader& r, const JobSpecOptions& options, JobSpec* spec) {
  spec->backbone = RequiredString(r, "backbone");
  if (spec->backbone.empty()) return;
  spec->backbone_is_preset = LlamaPreset(ToAbsl(spec->backbone)).ok();
  if (spec->backbone_is_preset || !options.check_backbone) return;
  const bool deployment = options.is_deployment && options.is_deployment(spec->backbone);
  r.Check(deployment, "backbone",
          StrCat("unknown backbone '", spec->backbone,
                 "': not a model preset (llama3-8b, small, tiny) and not a registered deployment"));
}

// What dataset.path must name, for messages about a path that names
// something else.
constexpr char kDatasetFileKinds[] =
    "a JSONL file (.jsonl, one {\"tokens\": [...], \"label\": N} per line) or a tokens-bin file (.bin, "
    "starting with \"SSTOKV1\\n\")";

// A directory at `path` is reported as such, before its suffix or contents
// are looked at (which would only say that its format is unknown or that
// it is not a regular file). Returns whether it reported.
bool ReportDirectory(const ConfigReader& d, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  d.Check(false, "path", StrCat("'", path, "' is a directory; dataset.path must name one file: ", kDatasetFileKinds));
  return true;
}

void CheckDatasetFile(const ConfigReader& d, DatasetSpec* ds) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(ds->path, ec);
  if (ec || !std::filesystem::exists(st)) {
    d.Check(false, "path", StrCat("'", ds->path, "' does not exist"));
    return;
  }
  if (!std::filesystem::is_regular_file(st)) {
    d.Check(false, "path",
            StrCat("'", ds->path, "' is not a regular file (a device, socket or pipe); expected ", kDatasetFileKinds));
    return;
  }
  std::ifstream in(ds->path, std::ios::binary);
  if (!in) {
    d.Check(false, "path", StrCat("cannot read '", ds->path, "': ", std::strerror(errno)));
    return;
  }
  if (ds->format == DatasetFormat::kTokensBin) {
    std::array<char, sizeof(kTokensBinMagic)> magic{};
    in.read(magic.data(), magic.size());
    const bool ok = in.gcount() == static_cast<std::streamsize>(magic.size()) &&
                    std::memcmp(magic.data(), kTokensBinMagic, magic.size()) == 0;
    d.Check(ok, "path", StrCat("'", ds->path, "' is not a tokens-bin file (it does not start with \"SSTOKV1\\n\")"));
  }
}

void ParseFileDataset(const ConfigReader& d, const JobSpecOptions& options, DatasetSpec* ds) {
  ds->kind = DatasetSpec::Kind::kFile;
  std::string path = d.Required<std::string>("path");
  if (path.empty()) {
    d.Check(false, "path", "must not be empty");
    return;
  }
  bool path_ok = true;
  if (path.front() != '/') {
    if (options.base_dir.empty()) {
      d.Check(false, "path", StrCat("must be an absolute path (a submitted job has no directory to resolve '", path,
                                    "' against)"));
      path_ok = false;
    } else {
      path = (std::filesystem::path(options.base_dir) / path).lexically_normal().string();
    }
  }
  ds->path = path;
  const bool directory = path_ok && options.check_dataset_file && ReportDirectory(d, path);
  if (directory) path_ok = false;
  if (d.Has("format")) {
    const std::string f = d.Required<std::string>("format");
    if (f == "jsonl") {
      ds->format = DatasetFormat::kJsonl;
    } else if (f == "tokens-bin") {
      ds->format = DatasetFormat::kTokensBin;
    } else {
      d.Check(false, "format", StrCat("must be jsonl or tokens-bin, got '", f, "'"));
      path_ok = false;
    }
  } else if (directory) {
    // Reported above; a directory's suffix says nothing about a format.
  } else if (path.ends_with(".jsonl")) {
    ds->format = DatasetFormat::kJsonl;
  } else if (path.ends_with(".bin")) {
    ds->format = DatasetFormat::kTokensBin;
  } else {
    d.Check(false, "path",
            StrCat("cannot tell the format of '", path, "' from its suffix (.jsonl or .bin); set dataset.format"));
    path_ok = false;
  }
  if (path_ok && options.check_dataset_file) CheckDatasetFile(d, ds);
}

// The fields every generated dataset has: seed (required, >= 0), examples
// (min_examples..2^24) and sequence_length (1..65536); defaults are the
// values passed in.
void ParseGeneratedSizes(const ConfigReader& r, int64_t min_examples, uint64_t* seed, int64_t* examples,
                         int64_t* sequence_length) {
  if (auto v = RequiredValue<int64_t>(r, "seed")) {
    r.Check(*v >= 0, "seed", StrCat("must not be negative, got ", *v));
    *seed = static_cast<uint64_t>(std::max<int64_t>(*v, 0));
  }
  *examples = r.Optional<int64_t>("examples", *examples);
  CheckRange(r, "examples", *examples, min_examples, kMaxExamples);
  *sequence_length = r.Optional<int64_t>("sequence_length", *sequence_length);
  CheckRange(r, "sequence_length", *sequence_length, 1, kMaxSequenceLength);
}

void ParseSyntheticDataset(const ConfigReader& s, DatasetSpec* ds) {
  ds->kind = DatasetSpec::Kind::kSynthetic;
  SyntheticDataset& syn = ds->synthetic;
  if (!s.IsMap()) {
    s.Error("expected a map such as {task: parity, seed: 7}");
    return;
  }
  s.RejectUnknownKeys({"task", "seed", "examples", "sequence_length", "num_classes"});
  syn.task = RequiredString(s, "task");
  if (!syn.task.empty()) {
    s.Check(ValidTaskName(syn.task), "task", StrCat("must be a name of [a-z0-9_-], got '", syn.task, "'"));
    if (ValidTaskName(syn.task)) {
      // The built-in generator's tasks (slicesched/synth/tasks.h).
      auto known = synth::FindTask(syn.task);
      s.Check(known.ok(), "task", std::string(known.status().message()));
    }
  }
  ParseGeneratedSizes(s, 1, &syn.seed, &syn.examples, &syn.sequence_length);
  syn.num_classes = s.Optional<int64_t>("num_classes", syn.num_classes);
  CheckRange(s, "num_classes", syn.num_classes, 2, kMaxClasses);
}

void ParseWordNetDataset(const ConfigReader& w, const JobSpecOptions& options, DatasetSpec* ds) {
  ds->kind = DatasetSpec::Kind::kWordNet;
  WordNetDataset& wn = ds->wordnet;
  if (!w.IsMap()) {
    w.Error("expected a map such as {task: animal-plant, seed: 3}");
    return;
  }
  w.RejectUnknownKeys({"task", "seed", "examples", "sequence_length", "dir"});
  wn.task = RequiredString(w, "task");
  if (!wn.task.empty()) {
    auto known = synth::FindWordNetTask(wn.task);
    w.Check(known.ok(), "task", std::string(known.status().message()));
  }
  // Two examples at least: one to train on, one to evaluate.
  ParseGeneratedSizes(w, 2, &wn.seed, &wn.examples, &wn.sequence_length);
  wn.dir = w.Optional<std::string>("dir", wn.dir);
  // The runner reads it long after submission, from the daemon's directory.
  if (!std::filesystem::path(wn.dir).is_absolute()) {
    w.Check(false, "dir", StrCat("must be an absolute path, got '", wn.dir, "'"));
    return;
  }
  if (!options.check_dataset_file) return;
  std::error_code ec;
  const std::filesystem::path noun = std::filesystem::path(wn.dir) / "data.noun";
  w.Check(std::filesystem::is_regular_file(noun, ec), "dir",
          StrCat("'", noun.string(), "' does not exist (WordNet 3.0: apt-get install wordnet-base)"));
}

void ParseDataset(const ConfigReader& r, const JobSpecOptions& options, DatasetSpec* ds) {
  constexpr std::string_view kOneOf =
      "'path' (a token file), 'synthetic' (the built-in generator) or 'wordnet' (WordNet gloss tasks)";
  ConfigReader d = r.RequiredChild("dataset");
  if (!d.present()) return;
  if (!d.IsMap()) {
    d.Error(StrCat("expected a map with ", kOneOf));
    return;
  }
  d.RejectUnknownKeys({"path", "format", "synthetic", "wordnet"});
  const int kinds = int{d.Has("path")} + int{d.Has("synthetic")} + int{d.Has("wordnet")};
  if (kinds != 1) {
    d.Error(StrCat("set exactly one of ", kOneOf));
    return;
  }
  if (d.Has("path")) {
    ParseFileDataset(d, options, ds);
    return;
  }
  d.Check(!d.Has("format"), "format", "only applies to dataset.path");
  if (d.Has("synthetic")) {
    ParseSyntheticDataset(d.Child("synthetic"), ds);
  } else {
    ParseWordNetDataset(d.Child("wordnet"), options, ds);
  }
}

void ParseHyperparameters(const ConfigReader& r, Hyperparameters* h) {
  ConfigReader hp = r.RequiredChild("hyperparameters");
  if (!hp.present()) return;
  hp.RejectUnknownKeys(
      {"learning_rate", "batch_size", "grad_accumulation", "lora_rank", "lora_alpha", "optimizer", "momentum",
       "seed", "head_init", "warmup_steps"});
  if (auto lr = RequiredValue<double>(hp, "learning_rate")) {
    h->learning_rate = *lr;
    CheckPositiveAtMost(hp, "learning_rate", h->learning_rate, kMaxLearningRate);
  }
  if (auto bs = RequiredValue<int64_t>(hp, "batch_size")) {
    h->batch_size = *bs;
    CheckRange(hp, "batch_size", h->batch_size, 1, kMaxBatch);
  }
  h->grad_accumulation = hp.Optional<int64_t>("grad_accumulation", h->grad_accumulation);
  CheckRange(hp, "grad_accumulation", h->grad_accumulation, 1, kMaxBatch);
  h->lora_rank = hp.Optional<int64_t>("lora_rank", h->lora_rank);
  CheckRange(hp, "lora_rank", h->lora_rank, 1, kMaxLoraRank);
  h->lora_alpha = hp.Optional<double>("lora_alpha", h->lora_alpha);
  CheckPositiveAtMost(hp, "lora_alpha", h->lora_alpha, kMaxLoraAlpha);
  const std::string opt = hp.Optional<std::string>("optimizer", "adamw");
  if (opt == "adamw") {
    h->optimizer = Optimizer::kAdamW;
  } else if (opt == "sgd") {
    h->optimizer = Optimizer::kSgd;
  } else {
    hp.Check(false, "optimizer", StrCat("must be adamw or sgd, got '", opt, "'"));
  }
  if (hp.Has("momentum")) {
    h->momentum = hp.Optional<double>("momentum", h->momentum);
    hp.Check(opt != "adamw", "momentum", "only applies to optimizer sgd (AdamW has no momentum setting)");
    hp.Check(std::isfinite(h->momentum) && h->momentum >= 0 && h->momentum < 1, "momentum",
             StrCat("must be in [0, 1), got ", h->momentum));
  }
  const int64_t seed = hp.Optional<int64_t>("seed", 0);
  hp.Check(seed >= 0, "seed", StrCat("must not be negative, got ", seed));
  h->seed = static_cast<uint64_t>(std::max<int64_t>(seed, 0));
  const std::string head = hp.Optional<std::string>("head_init", "random");
  if (head == "zero") {
    h->head_init = HeadInit::kZero;
  } else {
    hp.Check(head == "random", "head_init", StrCat("must be random or zero, got '", head, "'"));
  }
  h->warmup_steps = hp.Optional<int64_t>("warmup_steps", h->warmup_steps);
  CheckRange(hp, "warmup_steps", h->warmup_steps, 0, kMaxEpochs);
}

void ParseStop(const ConfigReader& r, StopCondition* stop) {
  ConfigReader s = r.RequiredChild("stop");
  if (!s.present()) return;
  s.RejectUnknownKeys({"metric", "target", "max_epochs", "max_iterations"});
  const std::string metric = RequiredString(s, "metric");
  bool metric_ok = true;
  if (metric == "accuracy") {
    stop->metric = StopMetric::kAccuracy;
  } else if (metric == "loss") {
    stop->metric = StopMetric::kLoss;
  } else if (metric == "perplexity") {
    stop->metric = StopMetric::kPerplexity;
  } else {
    metric_ok = false;
    if (!metric.empty()) s.Check(false, "metric", StrCat("must be accuracy, loss or perplexity, got '", metric, "'"));
  }
  const std::optional<double> target = RequiredValue<double>(s, "target");
  stop->target = target.value_or(0);
  if (metric_ok && target.has_value()) {
    switch (stop->metric) {
      case StopMetric::kAccuracy:
        s.Check(stop->target > 0 && stop->target <= 1, "target",
                StrCat("an accuracy target must be in (0, 1], got ", stop->target));
        break;
      case StopMetric::kLoss:
        s.Check(stop->target >= 0, "target", StrCat("a loss target must not be negative, got ", stop->target));
        break;
      case StopMetric::kPerplexity:
        s.Check(stop->target >= 1, "target", StrCat("a perplexity target must be at least 1, got ", stop->target));
        break;
    }
  }
  if (auto epochs = RequiredValue<int64_t>(s, "max_epochs")) {
    stop->max_epochs = *epochs;
    CheckRange(s, "max_epochs", stop->max_epochs, 1, kMaxEpochs);
  }
  if (s.Has("max_iterations")) {
    if (auto iters = RequiredValue<int64_t>(s, "max_iterations")) {
      stop->max_iterations = *iters;
      CheckRange(s, "max_iterations", stop->max_iterations, 1, kMaxIterations);
    }
  }
}

void ParseGpus(const ConfigReader& r, JobSpec* spec) {
  const int64_t pp = r.Optional<int64_t>("pipeline_parallel", 1);
  const bool pp_ok = pp == 1 || pp == 2 || pp == 4 || pp == 8;
  r.Check(pp_ok, "pipeline_parallel", StrCat("must be 1, 2, 4 or 8, got ", pp));
  spec->pipeline_parallel = pp_ok ? static_cast<int>(pp) : 1;
  ConfigReader g = r.Child("gpus");
  int64_t min = spec->pipeline_parallel;
  int64_t max = -1;
  if (g.present()) {
    if (!g.IsMap()) {
      g.Error("expected a map such as {min: 1, max: 4}");
    } else {
      g.RejectUnknownKeys({"min", "max"});
      min = g.Optional<int64_t>("min", min);
      max = g.Optional<int64_t>("max", -1);
    }
  }
  if (max < 0) max = std::max<int64_t>(min, 1);
  bool ok = true;
  if (min < 1 || min > kMaxGpus) {
    g.Check(false, "min", StrCat("must be in 1..", kMaxGpus, ", got ", min));
    ok = false;
  }
  if (max < 1 || max > kMaxGpus) {
    g.Check(false, "max", StrCat("must be in 1..", kMaxGpus, ", got ", max));
    ok = false;
  }
  if (ok && max < min) {
    g.Check(false, "max", StrCat("must be at least gpus.min (", min, "), got ", max));
    ok = false;
  }
  if (ok && pp_ok && pp > 1) {
    // Each data-parallel replica is a pipeline of `pp` stages, one per GPU.
    g.Check(min % pp == 0, "min", StrCat("must be a multiple of pipeline_parallel (", pp, "), got ", min));
    g.Check(max % pp == 0, "max", StrCat("must be a multiple of pipeline_parallel (", pp, "), got ", max));
  }
  spec->min_gpus = static_cast<int>(std::clamp<int64_t>(min, 1, kMaxGpus));
  spec->max_gpus = static_cast<int>(std::clamp<int64_t>(max, 1, kMaxGpus));
}

void ParseTenancy(const ConfigReader& r, const JobSpecOptions& options, JobSpec* spec,
                  std::vector<std::string>* warnings) {
  const std::string yaml_tenant = r.Optional<std::string>("tenant", "");
  CheckName(r, "tenant", yaml_tenant, "a tenant");
  if (!options.tenant.empty()) {
    r.Check(yaml_tenant.empty() || yaml_tenant == options.tenant, "tenant",
            StrCat("is '", yaml_tenant, "' but the job is submitted for tenant '", options.tenant, "'"));
    spec->tenant = options.tenant;
  } else {
    spec->tenant = yaml_tenant.empty() ? "default" : yaml_tenant;
  }
  spec->trust_domain = r.Optional<std::string>("trust_domain", "");
  CheckName(r, "trust_domain", spec->trust_domain, "a trust domain");
  if (spec->trust_domain.empty()) {
    spec->trust_domain = spec->tenant;
    if (spec->allow_sharing && warnings != nullptr) {
      warnings->push_back(StrCat("trust_domain is not set: the job shares work only with jobs of tenant '",
                                 spec->tenant, "'"));
    }
  }
  const int64_t priority = r.Optional<int64_t>("priority", 0);
  r.Check(priority >= kMinPriority && priority <= kMaxPriority, "priority",
          StrCat("must be in ", kMinPriority, "..", kMaxPriority, ", got ", priority));
  spec->priority = static_cast<int>(std::clamp(priority, kMinPriority, kMaxPriority));
}

}  // namespace

std::string_view OptimizerName(Optimizer o) { return o == Optimizer::kAdamW ? "adamw" : "sgd"; }

std::string_view HeadInitName(HeadInit h) { return h == HeadInit::kZero ? "zero" : "random"; }

std::string_view DatasetTaskName(const DatasetSpec& ds) {
  switch (ds.kind) {
    case DatasetSpec::Kind::kSynthetic: return ds.synthetic.task;
    case DatasetSpec::Kind::kWordNet: return ds.wordnet.task;
    case DatasetSpec::Kind::kFile: break;
  }
  return {};
}

std::string_view StopMetricName(StopMetric m) {
  switch (m) {
    case StopMetric::kAccuracy: return "accuracy";
    case StopMetric::kLoss: return "loss";
    case StopMetric::kPerplexity: return "perplexity";
  }
  return "?";
}

bool HigherIsBetter(StopMetric m) { return m == StopMetric::kAccuracy; }

std::string_view DatasetFormatName(DatasetFormat f) { return f == DatasetFormat::kJsonl ? "jsonl" : "tokens-bin"; }

JobSpec ParseJobSpec(const ConfigReader& r, const JobSpecOptions& options, std::vector<std::string>* warnings) {
  JobSpec spec;
  if (!r.present()) {
    r.Error("the job description is empty");
    return spec;
  }
  if (!r.IsMap()) {
    r.Error("expected a map with name, backbone, dataset, hyperparameters and stop");
    return spec;
  }
  r.RejectUnknownKeys({"name", "backbone", "dataset", "hyperparameters", "stop", "allow_sharing", "pipeline_parallel",
                       "gpus", "tenant", "trust_domain", "priority"});
  spec.name = RequiredString(r, "name");
  CheckName(r, "name", spec.name, "a job name");
  ParseBackbone(r, options, &spec);
  ParseDataset(r, options, &spec.dataset);
  ParseHyperparameters(r, &spec.hyperparameters);
  ParseStop(r, &spec.stop);
  spec.allow_sharing = r.Optional<bool>("allow_sharing", true);
  ParseGpus(r, &spec);
  ParseTenancy(r, options, &spec, warnings);
  return spec;
}

namespace {

// The parsing pass on a loaded tree, as a Status.
absl::StatusOr<ParsedJobSpec> ParseJobSpecTree(const YAML::Node& root, const JobSpecOptions& options) {
  ConfigErrors errors;
  ConfigReader r(root, options.source, &errors);
  if (options.accept_quoted_scalars) r.AcceptQuotedScalars();
  ParsedJobSpec out;
  out.spec = ParseJobSpec(r, options, &out.warnings);
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  return out;
}

}  // namespace

absl::StatusOr<ParsedJobSpec> ParseJobSpec(std::string_view yaml, const JobSpecOptions& options) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(yaml), options.source));
  return ParseJobSpecTree(root, options);
}

absl::StatusOr<ParsedJobSpec> LoadJobSpecFile(const std::string& path, JobSpecOptions options) {
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  options.source = path;
  if (options.base_dir.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(path, ec);
    options.base_dir = (ec ? std::filesystem::path(path) : abs).parent_path().string();
  }
  return ParseJobSpecTree(root, options);
}

}  // namespace slicesched::jobs
