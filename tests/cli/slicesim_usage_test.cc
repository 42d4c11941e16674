// slicesim's exit codes: a bad command line (unknown option, missing or bad
// value) exits 2 with "slicesim COMMAND: --OPTION ..., got 'VALUE'" on
// stderr before any work; a failure while running exits 1. The flags' syntax
// (an integer, a number, one of the choices) is slicesim's own check; the
// bounds are the options structs' Validate(), the one place they are
// written, which slicesim reports as usage errors too. Runs the built binary
// (SLICESIM_PATH), as a user would.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Result {
  int code = -1;
  std::string err;
};

// Runs slicesim with `args`; stdout is discarded, stderr captured.
Result RunSlicesim(const std::vector<std::string>& args) {
  // One file per call and process: ctest runs the tests of this binary in
  // parallel processes.
  static int calls = 0;
  const std::string err_path =
      ::testing::TempDir() + "/slicesim_usage_stderr_" + std::to_string(::getpid()) + "_" + std::to_string(calls++);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_s = {SLICESIM_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  Result r;
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, SLICESIM_PATH, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(spawned, 0) << SLICESIM_PATH;
  if (spawned != 0) return r;
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "slicesim did not exit normally (status " << status << ")";
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  r.err = text.str();
  in.close();
  std::filesystem::remove(err_path);
  return r;
}

struct Case {
  std::vector<std::string> args;
  std::string error;  // the start of the first stderr line
};

void ExpectUsage(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::string line;
    for (const std::string& a : c.args) line += a + " ";
    const Result r = RunSlicesim(c.args);
    EXPECT_EQ(r.code, 2) << line << "\n" << r.err;
    EXPECT_THAT(r.err.substr(0, r.err.find('\n')), StartsWith(c.error)) << line;
  }
}

TEST(SlicesimUsage, BadOptionValuesExitTwoNamingOptionAndValue) {
  ExpectUsage({
      {{"bench-sim", "--devices", "abc"}, "slicesim bench-sim: --devices needs an integer, got 'abc'"},
      {{"bench-sim", "--devices", "-3"}, "slicesim bench-sim: --devices must be in 2..4096, got '-3'"},
      // Once truncated to int (1 device), now refused: no int holds it.
      {{"bench-sim", "--devices", "4294967297"},
       "slicesim bench-sim: --devices needs an integer in -2147483648..2147483647, got '4294967297'"},
      {{"bench-sim", "--seed", "-1"}, "slicesim bench-sim: --seed must be at least 0, got '-1'"},
      {{"bench-sim", "--repetitions", "0"}, "slicesim bench-sim: --repetitions must be at least 1, got '0'"},
      {{"bench-sim", "--sweep", "/dev/null/sweep", "--repetitions", "0"},
       "slicesim bench-sim: --repetitions must be at least 1, got '0'"},
      {{"bench-sim", "--horizon-us", "-2"},
       "slicesim bench-sim: --horizon-us must be at least -1 (-1: to completion), got '-2'"},
      {{"bench-sim", "--devices"}, "slicesim bench-sim: --devices needs a value"},
      {{"bench-sim", "--device", "8"}, "slicesim bench-sim: unknown argument '--device'"},
      {{"accuracy", "--minutes", "nan"}, "slicesim accuracy: --minutes needs a number, got 'nan'"},
      {{"accuracy", "--minutes", "0"}, "slicesim accuracy: --minutes must be > 0, got '0'"},
      {{"accuracy", "--minutes", "1", "--warmup", "60"},
       "slicesim accuracy: --minutes 1 (60 s) must exceed --warmup 60 s, before which nothing is scored"},
      {{"replay", "--policy", "Best"},
       "slicesim replay: --policy must be Static-Online, Full-Share, Subset-Share, Dual-Share, Priority-Colocate, "
       "SliceScheduler or all, got 'Best'"},
      {{"replay", "--threads", "2000"}, "slicesim replay: --threads must be in 0..1024, got '2000'"},
      {{"replay", "--target-util", "1.2"}, "slicesim replay: --target-util must be in (0, 1), got '1.2'"},
      {{"replay", "--offline-rate", "-1"}, "slicesim replay: --offline-rate must be in 0..1000, got '-1'"},
      {{"replay", "--sweep"}, "slicesim replay --sweep: --sweep needs --out DIR"},
      {{"load", "--streams", "-1"}, "slicesim load: --streams must be in 0..4096, got '-1'"},
      {{"load", "--token-scale", "0.5"}, "slicesim load: --token-scale must be at least 1, got '0.5'"},
      {{"ymir", "--policy", "ymir"},
       "slicesim ymir: --policy must be Ymir, Ymir-elastic, Tiresias, Optimus, Pollux, Themis, SRTF or all, got "
       "'ymir'"},
      {{"ymir", "--gains-column", "gain_area"}, "slicesim ymir: --gains-column must be gain or gain_steps, got 'gain_area'"},
      {{"ymir", "--ilp-donors", "2"}, "slicesim ymir: --ilp-donors must be 0 or 1, got '2'"},
      {{"ymir", "--load", "-1"}, "slicesim ymir: --load must be > 0, got '-1'"},
      {{"ymir", "--gpus", "10", "--nodes", "4"}, "slicesim ymir: --gpus (10) must be a multiple of --nodes (4)"},
      {{"ymir", "--ilp-window", "0"}, "slicesim ymir: --ilp-window must be at least 1, got '0'"},
      {{"synth-data", "--task", "fa-major"}, "slicesim synth-data: --out FILE is required"},
      {{"synth-data", "--task", "fa-major", "--out", "x.csv"},
       "slicesim synth-data: --out must end in .jsonl or .bin, got 'x.csv'"},
      {{"synth-data", "--task", "sst2", "--out", "x.jsonl"},
       "slicesim synth-data: unknown synthetic task 'sst2' (known: "},
      {{"synth-data", "--task", "fa-major", "--out", "x.jsonl", "--examples", "0"},
       "slicesim synth-data: examples must be at least 1, got 0"},
  });
}

TEST(SlicesimUsage, UnknownCommandExitsTwo) {
  const Result r = RunSlicesim({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("slicesim: unknown command 'frobnicate'"));
}

// Not usage errors: the command line is well formed, the run fails (even
// where the library reports the failure as InvalidArgument, as bench-sim's
// sweep does for an output directory it cannot create).
TEST(SlicesimUsage, FailuresWhileRunningExitOne) {
  Result r = RunSlicesim({"ymir", "--trace", "/nonexistent/slicesched/jobs.csv"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/slicesched/jobs.csv"));
  r = RunSlicesim({"gmg", "--config", "/nonexistent/slicesched/slicesim.yaml"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/slicesched/slicesim.yaml"));
  r = RunSlicesim({"bench-sim", "--sweep", "/dev/null/sweep"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot create /dev/null/sweep"));
}

// Whether this slicesim has its LibTorch command groups (a build without
// LibTorch does not link them and says so, exit 1).
bool SlicesimHasLibTorch() {
  const Result r = RunSlicesim({"overhead", "--window", "0"});
  return r.err.find("built without LibTorch") == std::string::npos;
}

TEST(SlicesimUsage, LibTorchCommandsSayWhenTheBuildHasNoLibTorch) {
  if (SlicesimHasLibTorch()) GTEST_SKIP() << "this slicesim has LibTorch";
  for (const char* command : {"overhead", "generate-direct", "fidelity", "make-backbone", "ymir-estimators",
                              "ymir-lut"}) {
    const Result r = RunSlicesim({command});
    EXPECT_EQ(r.code, 1) << command << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(std::string("slicesim ") + command +
                                 ": this slicesim was built without LibTorch (SLICESCHED_WITH_TORCH=OFF)"));
  }
}

TEST(SlicesimUsage, LibTorchCommandsCheckTheirOptionsToo) {
  if (!SlicesimHasLibTorch()) GTEST_SKIP() << "this slicesim was built without LibTorch";
  ExpectUsage({
      {{"overhead", "--model", "huge"}, "slicesim overhead: --model must be tiny, small or llama3-8b, got 'huge'"},
      {{"overhead", "--only", "both"}, "slicesim overhead: --only must be direct or scheduled, got 'both'"},
      {{"overhead", "--device", "tpu"}, "slicesim overhead: --device must be cpu or cuda, got 'tpu'"},
      {{"fidelity", "--device", "tpu"}, "slicesim fidelity: --device must be cpu or cuda, got 'tpu'"},
      {{"overhead", "--window", "0"}, "slicesim overhead: --window must be at least 1, got '0'"},
      {{"overhead", "--pin", "--no-pin"}, "slicesim overhead: --pin and --no-pin contradict each other; give one"},
      {{"fidelity", "--iterations", "0"}, "slicesim fidelity: --iterations must be at least 1, got '0'"},
      {{"generate-direct", "--max-tokens", "4"}, "slicesim generate-direct: --prompt is required"},
      {{"generate-direct", "--prompt", "1,2", "--max-tokens", "4", "--top-p", "1.5"},
       "slicesim generate-direct: top_p must be in [0, 1], got '1.5'"},
      {{"generate-direct", "--prompt", "1,2", "--max-tokens", "0"},
       "slicesim generate-direct: max_tokens must be at least 1, got '0'"},
      {{"generate-direct", "--prompt", "1,2", "--max-tokens", "4", "--temperature", "-1"},
       "slicesim generate-direct: temperature must be finite and at least 0, got '-1'"},
      {{"overhead", "--window", "2", "--wake-batch", "3"},
       "slicesim overhead: --wake-batch must be in 1..2 (at most --window), got '3'"},
      {{"fidelity", "--train-batch", "0"}, "slicesim fidelity: --train-batch must be at least 1, got '0'"},
      {{"fidelity", "--drift-smoothing", "1.5"}, "slicesim fidelity: --drift-smoothing must be in [0, 1], got '1.5'"},
      {{"generate-direct", "--prompt", "1,x", "--max-tokens", "4"},
       "slicesim generate-direct: --prompt: 'x' is not a token id"},
  });
}

// A backbone file names its model (make-backbone writes slicesched.model);
// ymir-estimators reads it and refuses a --model that contradicts it.
TEST(SlicesimUsage, YmirEstimatorsTakesTheModelFromTheBackboneFile) {
  if (!SlicesimHasLibTorch()) GTEST_SKIP() << "this slicesim was built without LibTorch";
  const std::string path = ::testing::TempDir() + "/usage_gloss.safetensors";
  {
    const std::string header =
        R"({"__metadata__":{"slicesched.model":"gloss"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << header << std::string(4, '\0');
  }
  ExpectUsage({
      {{"ymir-estimators", "--backbone", path, "--model", "tiny"},
       "slicesim ymir-estimators: --model tiny but " + path + " is a 'gloss' backbone"},
      {{"ymir-estimators", "--model", "huge"},
       "slicesim ymir-estimators: --model: no model preset named 'huge' (presets: gloss, llama3-8b, small, tiny)"},
  });
  std::filesystem::remove(path);
}

TEST(SlicesimUsage, YmirLibTorchCommandsCheckTheirOptionsToo) {
  if (!SlicesimHasLibTorch()) GTEST_SKIP() << "this slicesim was built without LibTorch";
  ExpectUsage({
      {{"make-backbone", "--seed", "3"}, "slicesim make-backbone: --out is required"},
      {{"make-backbone", "--out", "b.safetensors", "--rounds", "0"},
       "slicesim make-backbone: pretraining: rounds must be at least 1, got '0'"},
      {{"make-backbone", "--out", "b.safetensors", "--steps", "0"},
       "slicesim make-backbone: pretraining: steps_per_round (slicesim make-backbone --steps) must be at least 1, "
       "got '0'"},
      {{"make-backbone", "--out", "b.safetensors", "--method", "sgd"},
       "slicesim make-backbone: --method must be lora or full, got 'sgd'"},
      {{"make-backbone", "--out", "b.safetensors", "--model", "huge"},
       "slicesim make-backbone: --model: no model preset named 'huge' (presets: gloss, llama3-8b, small, tiny)"},
      {{"make-backbone", "--out", "b.safetensors", "--learning-rate", "-1"},
       "slicesim make-backbone: pretraining: learning_rate and lora_alpha must be > 0"},
      {{"ymir-lut", "--out", "l.csv", "--iterations", "0"},
       "slicesim ymir-lut: LUT profile: iterations must be at least 1, got '0'"},
      // YmirExperimentOptions::Validate(), before the backbone is pretrained;
      // once exit 1.
      {{"ymir-estimators", "--steps", "5", "--probe-steps", "10"},
       "slicesim ymir-estimators: Ymir experiment: normal_steps (slicesim --steps) must be >= probe_steps"},
      {{"ymir-estimators", "--tasks", "nosuch,fa-major,fb-major"},
       "slicesim ymir-estimators: --tasks: unknown synthetic task 'nosuch' (known: "},
      {{"ymir-estimators", "--seed", "-1"}, "slicesim ymir-estimators: --seed must be at least 0, got '-1'"},
      {{"ymir-lut", "--iterations", "1"}, "slicesim ymir-lut: --out is required"},
      {{"ymir-lut", "--out", "l.csv", "--amp", "0,2"}, "slicesim ymir-lut: LUT profile: amp values must be 0 or 1, got '2'"},
      {{"ymir-lut", "--out", "l.csv", "--parallelism", "data,tensor"},
       "slicesim ymir-lut: --parallelism: values must be data or pipeline, got 'data,tensor'"},
      {{"ymir-lut", "--out", "l.csv", "--ckpt", "1,x"},
       "slicesim ymir-lut: --ckpt: '1,x' is not a comma-separated integer list"},
      {{"ymir-lut", "--out", "l.csv", "--devices", "1,two"},
       "slicesim ymir-lut: --devices: '1,two' is not a comma-separated integer list"},
  });
}

}  // namespace
