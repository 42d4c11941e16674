// What ran where and when: the data behind Admin.Timeline.
//
// The master records one TimelineEntry per finished operator or transfer
// (from the backend's completion Feedback) in a TimelineRing, a bounded
// ring of the most recent `capacity` intervals; the operators and transfers
// running at the time of a query are added by the master from the GMG.
// Neither type takes locks: both live on the master's loop thread.
//
// Predictions: `predicted_end` is the actual start plus the duration the
// estimators predicted for that operator (or transfer) just before its
// completion was learned from — the same prediction the online MAPE scores
// (sched/learner.h). The scheduler does not record a per-node plan in the
// GMG (NodeTimes::predicted_* stay unset), so the predicted interval starts
// where the actual one does and shows the estimator's error, not queueing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "slicesched/common/json.h"  // JsonQuote (timeline tests and callers)
#include "slicesched/common/units.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {

struct TimelineEntry {
  uint64_t node_id = 0;
  uint64_t instance_id = 0;
  std::string name;  // template op name, or "transfer"
  PriorityClass priority_class = PriorityClass::kOnline;
  std::string label;        // the instance's label (a Generate request's client tag, e.g. "batch 3/q-7")
  uint16_t device = 0;      // transfers: the source
  int32_t dst_device = -1;  // transfers only
  Timestamp start;
  Timestamp end = Timestamp::Never();            // Never() while running
  Timestamp predicted_end = Timestamp::Never();  // Never() when unknown
  bool is_transfer() const { return dst_device >= 0; }
  bool running() const { return end == Timestamp::Never(); }
};

struct TimelineResult {
  std::vector<TimelineEntry> events;  // ascending start (then node id)
  bool truncated = false;             // max_events dropped older events
};

class TimelineRing {
 public:
  // `capacity` >= 1 finished entries are kept; older ones are dropped.
  explicit TimelineRing(size_t capacity);

  void Add(TimelineEntry e);
  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t dropped() const { return dropped_; }  // evicted by the bound

  // The finished entries plus `running` that overlap [since, until]
  // (running ones extend to `until`), sorted by start. When more than
  // `max_events` (>= 1) match, the ones that started last are kept and
  // `truncated` is set.
  TimelineResult Query(Timestamp since, Timestamp until, size_t max_events,
                       const std::vector<TimelineEntry>& running) const;

 private:
  const size_t capacity_;
  std::deque<TimelineEntry> entries_;  // in completion order
  uint64_t dropped_ = 0;
};

// The Chrome "Trace Event Format" JSON object of `events` (chrome://tracing,
// Perfetto): one process, and per device four threads (tids):
//   1 + 4*d      "<device>"                      actual operator intervals
//   2 + 4*d      "<device> predicted"            [start, predicted_end]
//   3 + 4*d      "<device> transfers out"        actual transfers from d
//   4 + 4*d      "<device> transfers predicted"
// Complete events ("ph":"X") with ts/dur in microseconds of the daemon's
// steady clock; args carry node/instance ids, class, dst and, on the actual
// event, predicted_end_us and error_pct. Running entries end at `now` and
// have "running": true. `device_names[d]` names device d (a missing name is
// rendered as "device<d>").
std::string ChromeTraceJson(const std::vector<TimelineEntry>& events, const std::vector<std::string>& device_names,
                            Timestamp now);

}  // namespace slicesched
