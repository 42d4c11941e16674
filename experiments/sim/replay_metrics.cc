#include "slicesched/experiments/replay_metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_format.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/strings.h"

namespace slicesched {

namespace {

// Idle gaps of one unit in [begin, end] as sorted disjoint intervals.
std::vector<BusyInterval> IdleGaps(const std::vector<BusyInterval>& busy, int64_t begin, int64_t end) {
  std::vector<BusyInterval> gaps;
  if (end <= begin) return gaps;
  int64_t cursor = begin;
  for (const BusyInterval& iv : MergeIntervals(busy)) {
    const int64_t s = std::max(iv.start_ns, begin);
    const int64_t e = std::min(iv.end_ns, end);
    if (e <= s) continue;  // outside the window
    if (s > cursor) gaps.push_back({cursor, s});
    cursor = std::max(cursor, e);
  }
  if (cursor < end) gaps.push_back({cursor, end});
  return gaps;
}

int64_t TotalLength(const std::vector<BusyInterval>& intervals) {
  int64_t total = 0;
  for (const BusyInterval& iv : intervals) total += iv.end_ns - iv.start_ns;
  return total;
}

// Length of the intersection of two sorted, disjoint interval lists.
int64_t IntersectionLength(const std::vector<BusyInterval>& a, const std::vector<BusyInterval>& b) {
  int64_t total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t s = std::max(a[i].start_ns, b[j].start_ns);
    const int64_t e = std::min(a[i].end_ns, b[j].end_ns);
    if (e > s) total += e - s;
    if (a[i].end_ns < b[j].end_ns) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

}  // namespace

std::vector<BusyInterval> MergeIntervals(std::vector<BusyInterval> intervals) {
  intervals.erase(std::remove_if(intervals.begin(), intervals.end(),
                                 [](const BusyInterval& iv) { return iv.end_ns <= iv.start_ns; }),
                  intervals.end());
  std::sort(intervals.begin(), intervals.end(), [](const BusyInterval& a, const BusyInterval& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  std::vector<BusyInterval> merged;
  merged.reserve(intervals.size());
  for (const BusyInterval& iv : intervals) {
    if (!merged.empty() && iv.start_ns <= merged.back().end_ns) {
      merged.back().end_ns = std::max(merged.back().end_ns, iv.end_ns);
    } else {
      merged.push_back(iv);
    }
  }
  return merged;
}

std::vector<IdleSlice> IdleSlices(const std::vector<std::vector<BusyInterval>>& busy, int64_t begin_ns,
                                  int64_t end_ns) {
  std::vector<IdleSlice> slices;
  for (size_t u = 0; u < busy.size(); ++u) {
    for (const BusyInterval& gap : IdleGaps(busy[u], begin_ns, end_ns)) {
      slices.push_back({static_cast<int>(u), gap.start_ns, gap.end_ns});
    }
  }
  return slices;
}

IdleSliceSummary SummarizeIdleSlices(const std::vector<IdleSlice>& slices, double span_s, int units,
                                     double min_ms, double max_ms) {
  IdleSliceSummary s;
  s.total_count = slices.size();
  std::vector<double> filtered;
  int64_t total_idle_ns = 0;
  for (const IdleSlice& slice : slices) {
    total_idle_ns += slice.end_ns - slice.start_ns;
    const double d = slice.duration_ms();
    if (d > min_ms && d < max_ms) filtered.push_back(d);
  }
  s.total_idle_s = static_cast<double>(total_idle_ns) / 1e9;
  s.count = filtered.size();
  std::sort(filtered.begin(), filtered.end());
  s.p50_ms = QuantileOfSorted(filtered, 0.50);
  s.p90_ms = QuantileOfSorted(filtered, 0.90);
  s.p99_ms = QuantileOfSorted(filtered, 0.99);
  double filtered_ms = 0, below_p99_ms = 0;
  for (double d : filtered) {
    filtered_ms += d;
    if (d < s.p99_ms) below_p99_ms += d;
  }
  s.filtered_idle_s = filtered_ms / 1e3;
  s.share_of_idle_below_p99 = filtered_ms > 0 ? below_p99_ms / filtered_ms : 0;
  const double capacity_s = span_s * units;
  s.utilization = capacity_s > 0 ? 1.0 - s.total_idle_s / capacity_s : 0;
  return s;
}

IdleOverlap ComputeIdleOverlap(const std::vector<std::vector<BusyInterval>>& busy, int64_t begin_ns,
                               int64_t end_ns) {
  IdleOverlap overlap;
  const size_t n = busy.size();
  if (n == 0 || end_ns <= begin_ns) {
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = a + 1; b < n; ++b) overlap.pairs.push_back({static_cast<int>(a), static_cast<int>(b), 0});
    }
    return overlap;
  }
  std::vector<std::vector<BusyInterval>> idle(n);
  std::vector<int64_t> idle_len(n);
  for (size_t u = 0; u < n; ++u) {
    idle[u] = IdleGaps(busy[u], begin_ns, end_ns);
    idle_len[u] = TotalLength(idle[u]);
  }

  double jaccard_sum = 0;
  int jaccard_pairs = 0;
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      const int64_t inter = IntersectionLength(idle[a], idle[b]);
      const int64_t uni = idle_len[a] + idle_len[b] - inter;
      double j = 0;
      if (uni > 0) {
        j = static_cast<double>(inter) / static_cast<double>(uni);
        jaccard_sum += j;
        ++jaccard_pairs;
      }
      overlap.pairs.push_back({static_cast<int>(a), static_cast<int>(b), j});
    }
  }
  overlap.pairwise_jaccard_mean = jaccard_pairs > 0 ? jaccard_sum / jaccard_pairs : 0;

  // Every unit is idle exactly where no unit is busy: the complement of the
  // union of all busy intervals.
  std::vector<BusyInterval> all;
  for (const auto& unit : busy) all.insert(all.end(), unit.begin(), unit.end());
  const int64_t all_idle = TotalLength(IdleGaps(all, begin_ns, end_ns));
  int64_t idle_sum = 0;
  for (int64_t len : idle_len) idle_sum += len;
  const double mean_idle = static_cast<double>(idle_sum) / static_cast<double>(n);
  overlap.all_idle_share = mean_idle > 0 ? static_cast<double>(all_idle) / mean_idle : 0;
  return overlap;
}

std::vector<double> TimeBetweenTokensMs(const std::vector<std::vector<int64_t>>& token_ns) {
  std::vector<double> gaps;
  for (const std::vector<int64_t>& tokens : token_ns) {
    for (size_t i = 1; i < tokens.size(); ++i) gaps.push_back(static_cast<double>(tokens[i] - tokens[i - 1]) / 1e6);
  }
  return gaps;
}

absl::Status WriteIdleSlicesCsv(const std::string& path, const std::vector<IdleSlice>& slices) {
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(StrCat("cannot write ", path));
  out << "unit,start_s,end_s,duration_ms\n";
  for (const IdleSlice& s : slices) {
    out << absl::StrFormat("%d,%.9f,%.9f,%.6f\n", s.unit, static_cast<double>(s.start_ns) / 1e9,
                           static_cast<double>(s.end_ns) / 1e9, s.duration_ms());
  }
  out.flush();
  if (!out) return absl::InternalError(StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::Status WriteIdleOverlapCsv(const std::string& path, const IdleOverlap& overlap) {
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(StrCat("cannot write ", path));
  out << "unit_a,unit_b,jaccard\n";
  for (const IdleOverlapPair& p : overlap.pairs) {
    out << absl::StrFormat("%d,%d,%.6f\n", p.unit_a, p.unit_b, p.jaccard);
  }
  out.flush();
  if (!out) return absl::InternalError(StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace slicesched
