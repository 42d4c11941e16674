// Workload traces: loading, summarizing and transforming request and job
// traces for replay, plus a built-in synthetic workload for users without
// trace files.
//
// Two real traces are supported (see ../shared/traces/README.md in the
// development checkout; the files are never part of this repository):
//
//   * LLM inference requests in the Azure LLM inference trace format
//     (Splitwise, ISCA'24): TIMESTAMP, ContextTokens, GeneratedTokens.
//   * GPU-cluster training jobs in the Pollux/Philly job-table format:
//     timestamp, duration, num_gpus and an optional tenant (cluster) column.
//
// CSV dialect accepted by both loaders: the first line is a header; columns
// are matched by name, case-insensitively, in any order, and extra columns are
// ignored. Fields are separated by ',' and trimmed of spaces and tabs; a field
// wrapped in double quotes has them removed (quoted fields may not contain
// commas). Lines end in LF or CRLF, the last line may lack its newline, blank
// lines are skipped and a leading UTF-8 byte-order mark is ignored.
// Timestamps are "YYYY-MM-DD HH:MM:SS" (or 'T' between date and time) with an
// optional '.' and 0-9 fractional digits, no time zone; they are only used
// relative to each other. Rows need not be sorted: the loaders sort them by
// time (stably, so ties keep file order).
//
// Every error is absl::InvalidArgumentError (absl::NotFoundError when the file
// cannot be opened) whose message starts with "<path>:<line>: " and names the
// problem and the offending text, e.g.
//   "trace.csv:17: column 'ContextTokens': expected a non-negative integer, got '-3'".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

// One inference request.
struct Request {
  double arrival_s = 0;          // seconds since the trace's first request
  int64_t context_tokens = 0;    // prompt (input) tokens
  int64_t generated_tokens = 0;  // output tokens

  bool operator==(const Request&) const = default;
};

// Loads a CSV in the Azure LLM inference trace format: a header naming
// TIMESTAMP, ContextTokens and GeneratedTokens (any order, other columns
// ignored) and one request per line. Token counts must be non-negative
// integers. Returns the requests sorted by arrival, arrival_s relative to the
// earliest request (which therefore arrives at 0). An empty file, a file with
// a header but no rows, a missing column, a short row, a malformed or
// impossible timestamp and a negative or non-integer token count are errors.
absl::StatusOr<std::vector<Request>> LoadAzureLlmTrace(const std::string& path);

// Summary statistics of a request trace. Percentiles interpolate linearly
// between closest ranks (numpy's default). All fields are 0 for an empty
// trace.
struct TraceSummary {
  size_t requests = 0;
  double span_s = 0;           // last arrival - first arrival
  double mean_rate_per_s = 0;  // requests / span_s (0 when span_s is 0)
  double interarrival_cv = 0;  // stddev / mean of the gaps between arrivals
  double context_p50 = 0, context_p90 = 0, context_p99 = 0;
  double output_p50 = 0, output_p90 = 0, output_p99 = 0;
  double context_mean = 0, output_mean = 0;
};

// Summarizes `requests` (which need not be sorted).
TraceSummary Summarize(const std::vector<Request>& requests);

// --- Transformations for trace replay. Lengths are never changed. ---------

// Compresses time by `scale`: every arrival_s becomes arrival_s / scale, so
// scale 2 replays the trace at twice the request rate with the same burst
// structure, and scale 0.5 at half the rate. `scale` must be finite and
// positive (checked).
std::vector<Request> ScaleLoad(const std::vector<Request>& requests, double scale);

// Keeps each request independently with probability `keep` (0 < keep <= 1),
// deterministically for a seed: the timeline, its bursts and lulls stay where
// they are, only thinner. Replay uses this for load scales below 1, so a
// replay window still covers the same stretch of the trace.
std::vector<Request> Thin(const std::vector<Request>& requests, double keep, uint64_t seed);

// The requests that arrive in [start_s, start_s + duration_s), in input
// order, with arrival_s - start_s as their arrival: the window's start is the
// new time 0, so idle time at the start of the window is kept. Empty when
// duration_s <= 0.
std::vector<Request> Window(const std::vector<Request>& requests, double start_s,
                            double duration_s);

// Shifts the trace in time by `fraction` of its period, wrapping around, and
// returns it sorted by arrival. The trace is treated as one period of a
// periodic arrival process: with first arrival t0, span S and n requests the
// period is P = S * n / (n - 1) (so the wrap-around gap from the last request
// to the first is the mean gap), and an arrival t becomes
// t0 + ((t - t0 + fraction * P) mod P). Only the fractional part of
// `fraction` matters (1.25 is 0.25; -0.25 is 0.75), so 0 returns the trace
// (sorted) unchanged. Used to emulate different days on different instances:
// instance k of 4 replays CyclicShift(day, k / 4.0). Traces with fewer than
// two requests or a zero span are returned sorted. `fraction` must be finite
// (checked).
std::vector<Request> CyclicShift(const std::vector<Request>& requests, double fraction);

// --- Built-in workload model ------------------------------------------------
//
// A synthetic stand-in for the Azure LLM code trace (2023-11-16, 8,819
// requests over 3,436 s), for users without the trace file.
//
// Arrivals: an ON/OFF Cox (doubly stochastic Poisson) process. OFF periods
// (no requests) and ON periods (bursts) alternate; their lengths are
// log-normal. Every burst draws its own rate from a log-normal and emits
// Poisson arrivals at that rate. The first period is ON with probability
// E[ON] / (E[ON] + E[OFF]). With normalize_rate (the default), all burst rates
// of a generated window are then multiplied by one factor so that the
// integral of the intensity over [0, duration) is mean_rate_per_s * duration:
// every window has the trace's mean rate up to Poisson noise
// (+-1/sqrt(requests)) while which seconds are busy stays random. Without it
// the raw process is used: with the defaults its long-run mean rate is about
// 3.45 req/s (the log-normal fits overstate the mean ON length: 18.7 s vs
// 12.8 s in the trace) and a 60-minute window's rate has p10-p90 2.6-4.5 req/s.
//
// Lengths: context and output tokens are independent (their log-log
// correlation in the trace is -0.005), each log-normal with the given median
// and 90th percentile, rounded to the nearest integer and clamped to
// [min, max].
//
// The defaults come from tools/derive_workload_model.py run on
// ../shared/traces/azure_llm_code_2023.csv (the Azure LLM inference trace
// 2023, code service). The script cuts the trace into bursts at gaps longer
// than 3 s and fits each log-normal to the logs' mean and standard deviation.
// It also measures how closely the model matches the trace; median [p10, p90]
// over 400 simulated 60-minute windows versus the trace:
//   mean rate             2.60 [2.55, 2.70] req/s   vs 2.57
//   inter-arrival CV      13.1 [10.2, 19.2]         vs 13.2
//   inter-arrival p50     0.080 [0.061, 0.103] s    vs 0.064
//   requests/minute p50   109 [74, 133]             vs 112
//   requests/minute p90   369 [308, 446]            vs 399
//   share of idle seconds 0.65 [0.57, 0.73]         vs 0.73
//   context p50/p90 1476/5154 vs 1469/5188; output p50/p90 13/54 vs 13/55
//   (means: context 2150 vs 2048, output 25.0 vs 27.9).
// Not modelled: the trace's millisecond-scale clustering inside bursts (17% of
// its gaps are under 1 ms; the model's bursts are Poisson), and any daily
// pattern (the trace covers one hour).
struct BuiltInWorkloadModel {
  // Arrivals.
  double mean_rate_per_s = 2.56669;  // target rate when normalize_rate
  bool normalize_rate = true;
  double off_log_mu = 2.88046;  // OFF length: median e^2.88 = 17.8 s, mean 36 s
  double off_log_sigma = 1.19167;
  double on_log_mu = 2.0489;  // ON (burst) length: median 7.8 s, mean 18.7 s
  double on_log_sigma = 1.32448;
  double burst_rate_log_mu = 2.23139;  // rate within a burst: median 9.3 req/s
  double burst_rate_log_sigma = 0.458441;

  // Context (prompt) tokens.
  double context_median = 1469;
  double context_p90 = 5187.6;
  int64_t context_min = 3;
  int64_t context_max = 7437;

  // Output (generated) tokens.
  double output_median = 13;
  double output_p90 = 55;
  int64_t output_min = 6;
  int64_t output_max = 1899;
};

// Generates requests arriving in [0, duration_s), sorted by arrival (the
// first request need not arrive at 0: the window may start idle). The same
// model, duration and seed always give the same vector: randomness comes from
// one std::mt19937_64 seeded with `seed`, turned into uniform, exponential
// and normal variates by this library's own code (not <random>'s
// distributions, whose output differs between standard libraries). Empty when
// duration_s <= 0. ON and OFF periods shorter than 1 ms count as 1 ms.
std::vector<Request> GenerateBuiltInWorkload(const BuiltInWorkloadModel& model,
                                             double duration_s, uint64_t seed);

// --- Training-job traces ----------------------------------------------------

// One training job.
struct Job {
  double submit_s = 0;    // seconds since the trace's earliest submission
  double duration_s = 0;  // run time
  int num_gpus = 0;
  std::string tenant;  // virtual cluster / team; empty when the trace has none

  bool operator==(const Job&) const = default;
};

// Loads a job table such as the Pollux-derived Philly trace: a header naming
// timestamp (YYYY-MM-DD HH:MM:SS, fraction allowed), duration (seconds,
// finite, >= 0), num_gpus (integer >= 1) and optionally a tenant column named
// `tenant` or, failing that, `cluster`; other columns are ignored. Returns
// the jobs sorted by submission (stably), submit_s relative to the earliest.
// Errors as for LoadAzureLlmTrace.
absl::StatusOr<std::vector<Job>> LoadJobTrace(const std::string& path);

}  // namespace slicesched
