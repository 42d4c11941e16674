// slicesim: the offline simulator and experiment driver (`slicesim help`).
//
// The commands' logic lives in the experiments libraries; the files of this
// folder only parse arguments, one file per group of commands, each group
// registering its commands in the table (command.h).
#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "command.h"

namespace {

// Commands that run the LibTorch executors: a build without LibTorch does
// not link them, and says so instead of calling them unknown.
constexpr std::array<std::string_view, 7> kTorchCommands = {
    "overhead", "generate-direct", "fidelity", "make-backbone", "ymir-estimators", "ymir-lut", "torch-info"};

int Usage(FILE* to) {
  std::fprintf(to,
               "usage: slicesim COMMAND [options]\n\n"
               "commands:\n"
               "  gmg [--config FILE]   build a Global Mapping Graph from a slicesim config\n"
               "                        (default: the embedded configs/slicesim.yaml) and\n"
               "                        print what it holds\n"
               "  bench-sim [--devices N] [--ops K] [--repetitions R] [--warmup W] [--seed S] [--json]\n"
               "                        time the simulator on a realistic Llama3-8B snapshot\n"
               "  bench-sim --sweep DIR  the same over 8/64/512 devices x 1k..50k operators\n"
               "  accuracy [--trace FILE] [--minutes M] [--load-scale X] [--seed S] [--json]\n"
               "                        simulator and estimator accuracy against a ground-truth\n"
               "                        cluster replaying a trace (default: built-in Azure-derived model)\n"
               "  replay [--trace FILE] [--policy NAME|all] [--minutes M] [--seed S]\n"
               "         [--target-util U] [--load-scale X] [--offline-rate R] [--out DIR]\n"
               "                        the paper's co-location experiment on the virtual cluster;\n"
               "                        the load scale is fitted so that Static-Online's utilisation\n"
               "                        is U (default 0.407, the paper's Fig 8) unless --load-scale X\n"
               "  replay --sweep --out DIR [--trace FILE] [--minutes M] [--seed S] [--jobs N]\n"
               "                        capacity sweep: utilisation 0.2..0.7 x offline rate, per\n"
               "                        policy (M-minute windows per point, default 5)\n"
               "  overhead [--model tiny|small|llama3-8b] [--device cpu|cuda] [--prefills N] [--repetitions R] [--window W] [--block B] [--pin|--no-pin] [--direct-on-main] [--direct-allocator cache|default] [--wake-batch K] [--nap-us U] [--tail-spin-us U] [--priorities fcfs|equal] [--order abba|direct-first] [--only direct|scheduled] [--null] [--json]\n"
               "                        scheduled vs direct execution of N context-1 prefills on\n"
               "                        the LibTorch executors (paper Table 1; needs LibTorch)\n"
               "  generate-direct --prompt IDS --max-tokens N [--model NAME] [--weights-seed S]\n"
               "         [--safetensors FILE] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--stop IDS]\n"
               "                        the tokens a Generate request yields, computed by calling the\n"
               "                        LibTorch operators directly (IDS: comma-separated token ids;\n"
               "                        prints JSON; needs LibTorch)\n"
               "  generate-direct --batch FILE.jsonl [--model NAME] [--weights-seed S] [--safetensors FILE]\n"
               "                        the same for every request of an OpenAI Batch input file, with\n"
               "                        the seeds a batch run uses: one JSON line per custom_id\n"
               "  load [--socket PATH | --target URI] [--seconds S] [--trace FILE] [--seed N]\n"
               "       [--streams N] [--offline-streams N] [--token-scale X] [--json]\n"
               "                        drive a running sliced over gRPC: open-loop online arrivals\n"
               "                        (built-in Azure-derived model or a trace) plus offline\n"
               "                        streams, or N closed-loop streams; prints the summary\n"
               "  fidelity [--model tiny|small] [--device cpu|cuda] [--warmup N] [--calibration N] [--iterations N] [--seed S]\n"
               "           [--drift-smoothing S] [--per-op] [--json]\n"
               "                        simulator-predicted vs measured time per training and serving\n"
               "                        iteration, pp2 on 2 CPU executors (paper Table 2; needs LibTorch)\n"
               "  torch-info [--json]   the LibTorch version, the CUDA version it was built for and\n"
               "                        the CUDA devices it sees (0 without a GPU or driver)\n"
               "  synth-data --task NAME --out FILE [--seed N] [--examples K] [--sequence-length L]\n"
               "         [--num-classes C] [--family synthetic|wordnet] [--wordnet-dir DIR] [--vocab V]\n"
               "                        write a task's examples as jsonl (.jsonl) or tokens-bin (.bin):\n"
               "                        the built-in synthetic family, or WordNet's noun glosses\n"
               "                        (Debian's wordnet-base); --list prints the task names\n"
               "  ymir-gains --combine A.csv,B.csv[,...] --out FILE\n"
               "                        combine gains tables measured on other seeds: per pair the\n"
               "                        mean, spread, 95%% interval and sign (positive/negative/neutral)\n"
               "  make-backbone --out FILE [--seed S] [--rounds R] [--steps N] [--batch-size B] [--learning-rate X]\n"
               "         [--method lora|full] [--model PRESET] [--corpus synthetic|wordnet] [--wordnet-dir DIR]\n"
               "         [--cache DIR] [--json]\n"
               "                        pretrain a backbone (default the tiny preset) on the synthetic language or\n"
               "                        WordNet's glosses, by merged LoRA rounds or every weight (full), and write\n"
               "                        it as safetensors; --cache DIR keeps backbones by content hash and\n"
               "                        pretrains each once (needs LibTorch)\n"
               "  ymir-estimators [--backbone FILE | --backbone-cache DIR] [--model PRESET] [--seed S] [--steps N]\n"
               "         [--learning-rate X]\n"
               "         [--warmup-steps W] [--head zero|random] [--spatial-step mean|sum]\n"
               "         [--probe trained|head] [--probe-steps N] [--fisher-examples K]\n"
               "         [--gain steps|area] [--gain-window W]\n"
               "         [--tasks NAME[:CLASSES],...] [--family synthetic|wordnet] [--wordnet-dir DIR]\n"
               "         [--eval-every N] [--max-steps-factor F]\n"
               "         [--lora-rank R] [--sequence-length L] [--repeats N] [--eval-examples K]\n"
               "         [--iter-prefix-fraction F] [--iter-quadratic] [--stop-loss-epoch-steps N]\n"
               "         [--iter-envelope min|isotonic] [--iter-time-shift on|off] [--iter-half-life H]\n"
               "         [--iter-online on|off] [--iter-plateau-k K] [--iter-plateau-drop D]\n"
               "         [--iter-plateau-span N] [--direction none|asymmetry] [--fit-on FILE,...]\n"
               "         [--holdout-tasks NAME,...]\n"
               "         [--pairs-out FILE] [--iter-transfer-watch K] [--iter-transfer-fit time|loss]\n"
               "         [--iter-transfer-prior-points K]\n"
               "         [--label-margin M] [--language-vocab V] [--language-classes K]\n"
               "         [--lora-alpha A] [--train-examples N] [--batch-size B] [--curves-only]\n"
               "         [--similarities-only] [--fisher empirical|model] [--embed lora|lora+head]\n"
               "         [--distance normalised|cosine] [--null-runs N] [--band-k K]\n"
               "         [--gains-out FILE] [--json]  (--steps >= 20, the Task2Vec probe's steps;\n"
               "         --iter-quadratic: fit the b2 term after the warm-up too; a task name\n"
               "         may carry a data salt, NAME@K; --curves-only: the normal runs only;\n"
               "         --iter-online: a plateaued first window is not fitted, the estimate\n"
               "         waits for the drop (ymir::EstimateOnline; off: the fixed prefix);\n"
               "         --fit-on: fit the gain model on training seeds' --pairs-out files\n"
               "         instead of leave-one-out on this run; --holdout-tasks: fit it\n"
               "         without these tasks' pairs and score only theirs;\n"
               "         --iter-transfer-watch K: refine each transfer estimate after K steps\n"
               "         of the run (ymir::EstimateTransferOnline; default 16, 0 = prior only);\n"
               "         --iter-transfer-fit: the watched speed-up from the matched steps (time,\n"
               "         default) or the losses against the time-scaled normal curve (loss);\n"
               "         --iter-transfer-prior-points K: shrink it toward the predicted gain,\n"
               "         which counts as K watched points (default 4, 0 = none);\n"
               "         --iter-half-life H: the iteration fit weighs the prefix's end, half-life\n"
               "         H steps (default 12, 0 = equal weights);\n"
               "         --similarities-only: the Task2Vec similarity matrix only; pairs with\n"
               "         |gain| < K x RMS of the null runs' gains are neutral, scored apart;\n"
               "         without --backbone the backbone is pretrained on the tasks' language;\n"
               "         the defaults: the graded family with a negative level, see task2vec.h)\n"
               "                        Task2Vec similarity -> transfer gain, against gains measured\n"
               "                        by training the synthetic tasks (Ymir Table 2; needs LibTorch),\n"
               "                        the iteration estimator's errors and the stop-loss\n"
               "  ymir-lut --out FILE [--backbone FILE] [--devices 1,2] [--grad-accum 1,2]\n"
               "         [--batches 4,8,16] [--frozen 0,2] [--amp 0,1] [--ckpt 0,1]\n"
               "         [--parallelism data,pipeline] [--iterations N] [--json]\n"
               "                        profile Ymir's time LUT (seconds per training iteration) on\n"
               "                        this machine's CPU devices; writes it as CSV (needs LibTorch)\n"
               "  ymir [--trace FILE] [--jobs N] [--seed S] [--load 1|2] [--gpus G] [--nodes N]\n"
               "       [--gains FILE] [--policy NAME|all] [--json] [--round S] [--restart S]\n"
               "       [--ilp-window K] [--ilp-gap G] [--ilp-time-limit S] [--ymir-horizon S]\n"
               "       [--lambda X] [--ilp-donors 0|1] [--pair-shares 0|1]\n"
               "       [--gains-definition saved|speedup] [--gains-column gain|gain_steps]\n"
               "                        job-level comparison of the Ymir planner with Tiresias,\n"
               "                        Optimus, Pollux, Themis and SRTF on a GPU-cluster job trace\n"
               "                        (default ../shared/traces/philly_jobs_pollux.csv, 2000 jobs,\n"
               "                        240 GPUs = 60 nodes x 4; gains: a documented stand-in table)\n"
               "  help                  this text\n\n"
               "exit codes: 0 ok, 1 the command failed while running, 2 usage error (unknown\n"
               "command or option, a missing option, a bad option value)\n");
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  // This absl build (Debian's) checks lock order on every Mutex::Lock: a
  // lookup in a process-wide graph under one global spin lock, which every
  // thread's every lock takes (the executors' device threads once per
  // operator, and again per pool allocation). It is a debugging aid; the
  // tests keep it, the tools turn it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2) return Usage(stderr);
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return Usage(stdout);
  if (slicesim::CommandFn run = slicesim::FindCommand(cmd)) return run(args);
  for (std::string_view torch : kTorchCommands) {
    if (cmd == torch) {
      std::fprintf(stderr,
                   "slicesim %s: this slicesim was built without LibTorch (SLICESCHED_WITH_TORCH=OFF); the "
                   "command needs the LibTorch executors\n",
                   cmd.c_str());
      return slicesim::kExitFailed;
    }
  }
  std::fprintf(stderr, "slicesim: unknown command '%s'\n", cmd.c_str());
  return Usage(stderr);
}
