#include "slicesched/server/timeline.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "slicesched/common/strings.h"

namespace slicesched {

TimelineRing::TimelineRing(size_t capacity) : capacity_(capacity) {
  ABSL_RAW_CHECK(capacity >= 1, "TimelineRing needs a capacity of at least 1");
}

void TimelineRing::Add(TimelineEntry e) {
  entries_.push_back(std::move(e));
  while (entries_.size() > capacity_) {
    entries_.pop_front();
    ++dropped_;
  }
}

TimelineResult TimelineRing::Query(Timestamp since, Timestamp until, size_t max_events,
                                   const std::vector<TimelineEntry>& running) const {
  ABSL_RAW_CHECK(max_events >= 1, "TimelineRing::Query needs max_events >= 1");
  TimelineResult r;
  auto overlaps = [&](const TimelineEntry& e) {
    const Timestamp end = e.running() ? until : e.end;
    return e.start <= until && end >= since;
  };
  for (const TimelineEntry& e : entries_) {
    if (overlaps(e)) r.events.push_back(e);
  }
  for (const TimelineEntry& e : running) {
    if (overlaps(e)) r.events.push_back(e);
  }
  std::sort(r.events.begin(), r.events.end(), [](const TimelineEntry& a, const TimelineEntry& b) {
    return a.start != b.start ? a.start < b.start : a.node_id < b.node_id;
  });
  if (r.events.size() > max_events) {
    r.events.erase(r.events.begin(), r.events.end() - static_cast<std::ptrdiff_t>(max_events));
    r.truncated = true;
  }
  return r;
}

namespace {

// Microseconds with the nanosecond remainder (trace viewers accept fractions).
std::string Micros(int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(ns) / 1000.0);
  return buf;
}

void Complete(std::string* out, const std::string& name, std::string_view cat, int tid, int64_t start_ns,
              int64_t end_ns, const std::string& args) {
  if (out->back() != '[') *out += ",\n";
  *out += StrCat("{\"name\":", JsonQuote(name), ",\"cat\":\"", cat, "\",\"ph\":\"X\",\"pid\":1,\"tid\":", tid,
                 ",\"ts\":", Micros(start_ns), ",\"dur\":", Micros(std::max<int64_t>(0, end_ns - start_ns)),
                 ",\"args\":{", args, "}}");
}

void Metadata(std::string* out, const char* what, int tid, const std::string& value, int sort_index) {
  if (out->back() != '[') *out += ",\n";
  *out += StrCat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":1,\"tid\":", tid,
                 ",\"args\":{\"name\":", JsonQuote(value), "}}");
  if (sort_index >= 0) {
    *out += StrCat(",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":", tid,
                   ",\"args\":{\"sort_index\":", sort_index, "}}");
  }
}

}  // namespace

std::string ChromeTraceJson(const std::vector<TimelineEntry>& events, const std::vector<std::string>& device_names,
                            Timestamp now) {
  std::set<int> devices;
  for (size_t d = 0; d < device_names.size(); ++d) devices.insert(static_cast<int>(d));
  for (const TimelineEntry& e : events) devices.insert(e.device);
  auto name_of = [&](int d) {
    return static_cast<size_t>(d) < device_names.size() ? device_names[static_cast<size_t>(d)] : StrCat("device", d);
  };

  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  Metadata(&out, "process_name", 0, "sliced", -1);
  for (int d : devices) {
    const std::string n = name_of(d);
    Metadata(&out, "thread_name", 1 + 4 * d, n, 4 * d);
    Metadata(&out, "thread_name", 2 + 4 * d, StrCat(n, " predicted"), 4 * d + 1);
    Metadata(&out, "thread_name", 3 + 4 * d, StrCat(n, " transfers out"), 4 * d + 2);
    Metadata(&out, "thread_name", 4 + 4 * d, StrCat(n, " transfers predicted"), 4 * d + 3);
  }
  for (const TimelineEntry& e : events) {
    const int base = 1 + 4 * e.device + (e.is_transfer() ? 2 : 0);
    const int64_t end = e.running() ? std::max(now.nanos(), e.start.nanos()) : e.end.nanos();
    std::string common = StrCat("\"node\":", e.node_id, ",\"instance\":", e.instance_id,
                                ",\"class\":", JsonQuote(ToStd(PriorityClassName(e.priority_class))));
    if (e.is_transfer()) common += StrCat(",\"dst\":", JsonQuote(name_of(e.dst_device)));
    if (!e.label.empty()) common += StrCat(",\"label\":", JsonQuote(e.label));
    std::string actual = common;
    if (e.running()) actual += ",\"running\":true";
    const bool predicted = e.predicted_end != Timestamp::Never();
    if (predicted) {
      actual += StrCat(",\"predicted_end_us\":", Micros(e.predicted_end.nanos()));
      if (!e.running() && end > e.start.nanos()) {
        const double err =
            100.0 * static_cast<double>(e.predicted_end.nanos() - end) / static_cast<double>(end - e.start.nanos());
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.2f", err);
        actual += StrCat(",\"error_pct\":", buf);
      }
    }
    // Batch jobs' work has a category of its own, so a trace viewer can
    // select or colour it apart from the other offline work.
    const std::string_view cat = e.label.starts_with("batch ") ? "batch" : "op";
    Complete(&out, e.name, cat, base, e.start.nanos(), end, actual);
    if (predicted) Complete(&out, e.name, cat, base + 1, e.start.nanos(), e.predicted_end.nanos(), common);
  }
  out += "]}\n";
  return out;
}

}  // namespace slicesched
