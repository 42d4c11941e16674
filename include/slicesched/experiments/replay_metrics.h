// Idle-slice metrics of a trace replay: the measurements behind the paper's
// Figure 1 (CDF of idle-slice durations) and its "cross-GPU idle time overlap
// does not exceed 20%" finding.
//
// A *unit* is whatever the caller measures: one GPU, or one model instance
// (the set of GPUs it is pinned to, whose busy intervals the caller merges
// into one list). busy[u] holds the busy intervals of unit u as half-open
// [start_ns, end_ns) ranges; they may be unsorted and may overlap (they are
// merged here), and intervals with end_ns <= start_ns are ignored. Everything
// is clipped to the observation window [begin_ns, end_ns].
//
// All functions are O(n log n) in the number of intervals (sort + linear
// sweeps), except that the pairwise overlap is linear per pair of units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace slicesched {

struct BusyInterval {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// A maximal gap between busy intervals of one unit inside the window,
// including the gap before the first and after the last busy interval.
struct IdleSlice {
  int unit = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  double duration_ms() const { return static_cast<double>(end_ns - start_ns) / 1e6; }
};

// Sorts by start and unions overlapping or touching intervals; drops empty
// ones (end_ns <= start_ns). The result is sorted and pairwise disjoint with
// gaps of at least 1 ns between consecutive intervals.
std::vector<BusyInterval> MergeIntervals(std::vector<BusyInterval> intervals);

// The idle slices of every unit within [begin_ns, end_ns], ordered by unit,
// then by start. Slices have positive length. A unit with no busy interval
// yields one slice spanning the whole window. Empty if end_ns <= begin_ns.
std::vector<IdleSlice> IdleSlices(const std::vector<std::vector<BusyInterval>>& busy, int64_t begin_ns,
                                  int64_t end_ns);

// Summary of idle slices as in the paper's Figure 1.
//
//   count                    slices with min_ms < duration < max_ms (the
//                            paper's 10 ms / 20 s filter, both exclusive)
//   total_idle_s             idle time of ALL slices (unfiltered), seconds
//   p50_ms, p90_ms, p99_ms   percentiles of the filtered durations; linear
//                            interpolation between closest ranks (numpy's
//                            default); 0 when no slice passes the filter
//   share_of_idle_below_p99  sum of durations of filtered slices strictly
//                            shorter than p99_ms / sum of durations of all
//                            filtered slices (paper: 95.6%); 0 if none
//   utilization              1 - total_idle_s / (span_s * units), i.e. busy
//                            fraction of the window averaged over units
//                            (span_s = window length; 0 if span_s * units <= 0)
//   total_count              all slices (unfiltered)
//   filtered_idle_s          idle time of the filtered slices, seconds
struct IdleSliceSummary {
  size_t count = 0;
  double total_idle_s = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double share_of_idle_below_p99 = 0;
  double utilization = 0;
  size_t total_count = 0;
  double filtered_idle_s = 0;
};

IdleSliceSummary SummarizeIdleSlices(const std::vector<IdleSlice>& slices, double span_s, int units,
                                     double min_ms = 10, double max_ms = 20000);

// Jaccard index of the idle sets of units a and b (a < b).
struct IdleOverlapPair {
  int unit_a = 0;
  int unit_b = 0;
  double jaccard = 0;
};

// How much idle time different units share. With idle_i the set of instants
// in [begin_ns, end_ns] at which unit i is idle (complement of its merged
// busy intervals) and |.| the measure (length) of a set:
//
//   pairwise_jaccard_mean  mean over unordered unit pairs i < j of
//                          |idle_i ∩ idle_j| / |idle_i ∪ idle_j|.
//                          Pairs where both units are never idle (empty
//                          union) are left out of the mean; 0 if no pair
//                          remains (including fewer than 2 units).
//   all_idle_share         |∩_i idle_i| / mean_i |idle_i|: the fraction of
//                          an average unit's idle time during which EVERY
//                          unit is idle at once (what a job that needs all
//                          units simultaneously could use). 0 if no unit is
//                          ever idle; 1 for a single unit that is idle.
//   pairs                  the per-pair Jaccard indices, every pair i < j in
//                          order (an empty-union pair has jaccard 0 here).
//
// The paper reports "cross-GPU idle time overlap does not exceed 20%"
// without a formula; we report both readings.
struct IdleOverlap {
  double pairwise_jaccard_mean = 0;
  double all_idle_share = 0;
  std::vector<IdleOverlapPair> pairs;
};

IdleOverlap ComputeIdleOverlap(const std::vector<std::vector<BusyInterval>>& busy, int64_t begin_ns,
                               int64_t end_ns);

// Time between tokens: for each request, the gaps between the completion
// times of its consecutive tokens (token_ns[r], ascending; the first token is
// the prefill's), in ms, all requests together in request order. A request
// with fewer than two tokens adds nothing.
std::vector<double> TimeBetweenTokensMs(const std::vector<std::vector<int64_t>>& token_ns);

// CSV with header `unit,start_s,end_s,duration_ms`, one row per slice.
absl::Status WriteIdleSlicesCsv(const std::string& path, const std::vector<IdleSlice>& slices);

// CSV with header `unit_a,unit_b,jaccard`, one row per pair (read by
// bench/plots/plot_replay.py for the overlap heatmap).
absl::Status WriteIdleOverlapCsv(const std::string& path, const IdleOverlap& overlap);

}  // namespace slicesched
