// Fine-tuning job descriptions: the YAML a user submits (FineTune.SubmitJob,
// or a file such as configs/jobs/*.yaml) parsed into a typed JobSpec.
//
// The `jobs` component is the job-level front of the Ymir planner (see
// ../shared/papers/ymir.md and include/slicesched/ymir/planner.h): it owns
// what a job *is* (this file) and its durable lifecycle (job_manager.h); the
// planner decides which jobs run, paired how and on how many GPUs, and drives
// the lifecycle through JobManager's transition methods.
//
// Format (every key is documented in docs/operations.md, "Fine-tuning jobs";
// numbers and booleans are written unquoted: `batch_size: "16"` is a string
// and is refused, common/config.h):
//
//   name: sst2-lora               # [A-Za-z0-9._-], 1..64 characters
//   backbone: tiny                # a model preset (tiny, small, llama3-8b)
//                                 # or the name of a registered deployment
//   dataset:                      # exactly one of `path`, `synthetic`, `wordnet`
//     path: data/sst2.jsonl       # token file; relative to the YAML file's
//                                 # directory, absolute when submitted over gRPC
//     format: jsonl               # jsonl | tokens-bin; default from the suffix
//     # synthetic: {task: parity, seed: 7, examples: 2048, sequence_length: 32,
//     #             num_classes: 2}
//     # wordnet: {task: animal-plant, seed: 3, examples: 1280, sequence_length: 16,
//     #           dir: /usr/share/wordnet}
//   hyperparameters:
//     learning_rate: 1e-4         # in (0, 10] (required)
//     batch_size: 16              # 1..65536 (required)
//     grad_accumulation: 1        # 1..65536 (default 1)
//     lora_rank: 8                # 1..4096 (default 8)
//     lora_alpha: 16              # in (0, 1e6] (default 16)
//     optimizer: adamw            # adamw | sgd (default adamw)
//     momentum: 0.9               # sgd only: in [0, 1) (default 0.9)
//     seed: 0                     # >= 0 (default 0)
//     head_init: random           # random | zero (default random): zero starts
//                                 # at the uniform prediction (loss ln C)
//     warmup_steps: 0             # 0..2^20: lr rises linearly over the first
//                                 # steps (lr (k+1)/W at step k < W; default 0)
//   stop:
//     metric: accuracy            # accuracy | loss | perplexity
//     target: 0.9                 # accuracy in (0, 1]; loss >= 0; perplexity >= 1
//     max_epochs: 3               # 1..2^20 (required)
//     max_iterations: 2000        # optional, 1..2^40
//   allow_sharing: true           # may be paired with other jobs (default true);
//                                 # an unquoted boolean (common/config.h)
//   pipeline_parallel: 1          # 1, 2, 4 or 8 (default 1)
//   gpus: {min: 1, max: 4}        # 1 <= min <= max, both multiples of
//                                 # pipeline_parallel (default min = pp, max = min)
//   tenant: team-a                # optional; see JobSpecOptions::tenant
//   trust_domain: lab             # jobs pair only within one trust domain
//                                 # (default: the tenant)
//   priority: 0                   # 0..100, higher first (default 0)
//
// Dataset files. `jsonl`: one JSON object per line,
//   {"tokens": [12, 7, 99, ...], "label": 1}
// (`tokens` a non-empty list of token ids < the backbone's vocabulary,
// `label` an integer class or a number). `tokens-bin` (suffix .bin): a
// little-endian binary file
//   bytes 0..7   magic "SSTOKV1\n"
//   u64          number of examples
//   per example  i64 label, u32 length, then `length` u32 token ids.
// Parsing checks that the file exists, is a regular file (a directory is
// reported as one, before its suffix is looked at) and (tokens-bin) starts
// with the magic; the contents are read by the data loader.
//
// Synthetic datasets are produced by the built-in generator
// (slicesched/synth/tasks.h). The fields are validated here: task (one of
// synth::KnownTasks(), e.g. parity, copy, fa-major), seed (>= 0,
// required), examples (1..2^24, default 1024), sequence_length (1..65536,
// default 32), num_classes (2..65536, default 2).
//
// WordNet datasets are the gloss tasks of slicesched/synth/wordnet.h, read
// by the job runner from WordNet 3.0's data.noun under `dir` (default
// /usr/share/wordnet, Debian's wordnet-base). task: a name of
// synth::WordNetTasks(), NAME@K for the same rule on other synsets; seed
// (>= 0, required), examples (2..2^24, default 1024), sequence_length
// (1..65536, default 16). Two classes; the backbone's vocabulary is the
// corpus's most frequent gloss words. Parsing checks that DIR/data.noun
// exists (unless check_dataset_file is off).
//
// Errors: parsing is one pass that reports every problem at once, each as
// "SOURCE:LINE:COL: FIELD.PATH: MESSAGE" (common/config.h); unknown keys are
// errors. The result is InvalidArgumentError listing them one per line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/config.h"

namespace slicesched::jobs {

enum class Optimizer : uint8_t { kAdamW, kSgd };
std::string_view OptimizerName(Optimizer o);  // "adamw" / "sgd"

// How a fresh classification head starts: seeded N(0, 1/hidden) weights, or
// all zeros (the first prediction is uniform).
enum class HeadInit : uint8_t { kRandom, kZero };
std::string_view HeadInitName(HeadInit h);  // "random" / "zero"

// What `stop.target` is compared with. Accuracy stops when the metric is >=
// the target; loss and perplexity when it is <= the target.
enum class StopMetric : uint8_t { kAccuracy, kLoss, kPerplexity };
std::string_view StopMetricName(StopMetric m);
bool HigherIsBetter(StopMetric m);

enum class DatasetFormat : uint8_t { kJsonl, kTokensBin };
std::string_view DatasetFormatName(DatasetFormat f);  // "jsonl" / "tokens-bin"

struct SyntheticDataset {
  std::string task;
  uint64_t seed = 0;
  int64_t examples = 1024;
  int64_t sequence_length = 32;
  int64_t num_classes = 2;
};

struct WordNetDataset {
  std::string task;  // synth::WordNetTasks() name, NAME@K accepted
  uint64_t seed = 0;
  int64_t examples = 1024;
  int64_t sequence_length = 16;
  std::string dir = "/usr/share/wordnet";  // holds data.noun
};

struct DatasetSpec {
  enum class Kind : uint8_t { kFile, kSynthetic, kWordNet };
  Kind kind = Kind::kSynthetic;
  std::string path;  // kFile: absolute after parsing
  DatasetFormat format = DatasetFormat::kJsonl;
  SyntheticDataset synthetic;  // kSynthetic
  WordNetDataset wordnet;      // kWordNet
};
// The task name the Ymir gains table is keyed by: the synthetic or WordNet
// task; a file dataset has none (empty).
std::string_view DatasetTaskName(const DatasetSpec& ds);

struct Hyperparameters {
  double learning_rate = 0;
  int64_t batch_size = 0;
  int64_t grad_accumulation = 1;
  int64_t lora_rank = 8;
  double lora_alpha = 16;
  Optimizer optimizer = Optimizer::kAdamW;
  double momentum = 0.9;  // SGD's momentum (optimizer sgd only)
  uint64_t seed = 0;
  HeadInit head_init = HeadInit::kRandom;
  int64_t warmup_steps = 0;  // linear learning-rate warm-up, optimizer steps
};

struct StopCondition {
  StopMetric metric = StopMetric::kAccuracy;
  double target = 0;
  int64_t max_epochs = 1;
  int64_t max_iterations = 0;  // 0 = no limit
};

struct JobSpec {
  std::string name;
  std::string backbone;
  bool backbone_is_preset = false;  // else a deployment name
  DatasetSpec dataset;
  Hyperparameters hyperparameters;
  StopCondition stop;
  bool allow_sharing = true;
  int pipeline_parallel = 1;
  int min_gpus = 1;
  int max_gpus = 1;
  std::string tenant;        // after JobSpecOptions::tenant is applied
  std::string trust_domain;  // defaults to the tenant
  int priority = 0;
};

struct JobSpecOptions {
  // Prefix of error positions: a file path, or "<job>" for submitted text.
  std::string source = "<job>";
  // Directory relative dataset paths are resolved against; empty = relative
  // paths are an error (text submitted over gRPC has no directory).
  std::string base_dir;
  // The submitter's tenant. Empty: the YAML's `tenant`, else "default". Set:
  // the YAML's `tenant` may be omitted or must be equal.
  std::string tenant;
  // Whether `backbone` names a registered deployment (presets are always
  // known). Null: only presets are accepted.
  std::function<bool(std::string_view)> is_deployment;
  // Whether to check the backbone and the dataset file against the outside
  // world (the presets/deployments and the file system). The JobManager turns
  // both off when it reloads a job that was accepted earlier.
  bool check_backbone = true;
  bool check_dataset_file = true;
  // Whether a quoted 'yes' / "true" reads as a boolean and a quoted "16" as
  // a number (ConfigReader::AcceptQuotedScalars). Off for new jobs; the
  // JobManager turns it on when it reloads a job, which an older sliced may
  // have accepted that way (older versions took quoted words and quoted
  // numbers as scalars).
  bool accept_quoted_scalars = false;
};

struct ParsedJobSpec {
  JobSpec spec;
  std::vector<std::string> warnings;  // e.g. defaults the user may not expect
};

// Parses and validates job YAML text. InvalidArgumentError lists every error.
absl::StatusOr<ParsedJobSpec> ParseJobSpec(std::string_view yaml, const JobSpecOptions& options = {});
// The same for a file: the source is the path, base_dir its directory.
absl::StatusOr<ParsedJobSpec> LoadJobSpecFile(const std::string& path, JobSpecOptions options = {});
// The parsing pass on an already loaded tree; errors go to `errors`.
JobSpec ParseJobSpec(const ConfigReader& root, const JobSpecOptions& options, std::vector<std::string>* warnings);

}  // namespace slicesched::jobs
