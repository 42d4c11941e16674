// TimelineRing (bounds, window, truncation) and the Chrome trace rendering,
// checked by parsing the JSON back (protobuf's JSON parser into a Struct).
#include "slicesched/server/timeline.h"

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace slicesched {
namespace {

TimelineEntry Op(uint64_t node, uint16_t device, int64_t start_ms, int64_t end_ms, int64_t predicted_end_ms = -1) {
  TimelineEntry e;
  e.node_id = node;
  e.instance_id = 100 + node / 10;
  e.name = "layer\"0\"";  // needs escaping in JSON
  e.device = device;
  e.start = Timestamp::FromNanos(start_ms * 1000000);
  if (end_ms >= 0) e.end = Timestamp::FromNanos(end_ms * 1000000);
  if (predicted_end_ms >= 0) e.predicted_end = Timestamp::FromNanos(predicted_end_ms * 1000000);
  return e;
}

Timestamp Ms(int64_t ms) { return Timestamp::FromNanos(ms * 1000000); }

TEST(TimelineRing, KeepsTheLastCapacityEntries) {
  TimelineRing ring(3);
  for (uint64_t i = 1; i <= 5; ++i) ring.Add(Op(i, 0, static_cast<int64_t>(i) * 10, static_cast<int64_t>(i) * 10 + 5));
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(ring.dropped(), 2u);
  TimelineResult r = ring.Query(Timestamp::Never(), Timestamp::Infinite(), 100, {});
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_EQ(r.events[0].node_id, 3u);
  EXPECT_EQ(r.events[2].node_id, 5u);
  EXPECT_FALSE(r.truncated);
}

TEST(TimelineRing, WindowRunningAndTruncation) {
  TimelineRing ring(100);
  ring.Add(Op(2, 1, 20, 30));
  ring.Add(Op(1, 0, 0, 10));  // completion order differs from start order
  ring.Add(Op(3, 0, 40, 50));
  const std::vector<TimelineEntry> running = {Op(4, 1, 45, -1)};

  // Sorted by start; running ones included.
  TimelineResult all = ring.Query(Timestamp::Never(), Ms(60), 100, running);
  ASSERT_EQ(all.events.size(), 4u);
  EXPECT_EQ(all.events[0].node_id, 1u);
  EXPECT_EQ(all.events[1].node_id, 2u);
  EXPECT_EQ(all.events[3].node_id, 4u);
  EXPECT_TRUE(all.events[3].running());

  // [25, 42]: overlaps 2 (20..30) and 3 (40..50), not 1, not 4 (starts at 45).
  TimelineResult w = ring.Query(Ms(25), Ms(42), 100, running);
  ASSERT_EQ(w.events.size(), 2u);
  EXPECT_EQ(w.events[0].node_id, 2u);
  EXPECT_EQ(w.events[1].node_id, 3u);

  // Truncation keeps the latest starts.
  TimelineResult t = ring.Query(Timestamp::Never(), Ms(60), 2, running);
  EXPECT_TRUE(t.truncated);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].node_id, 3u);
  EXPECT_EQ(t.events[1].node_id, 4u);
}

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct s;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return s;
}

TEST(ChromeTrace, ParsesWithOneTrackPerDeviceAndPrediction) {
  TimelineEntry xfer = Op(7, 0, 12, 14, 13);
  xfer.name = "transfer";
  xfer.dst_device = 1;
  xfer.priority_class = PriorityClass::kOffline;
  const std::vector<TimelineEntry> events = {Op(1, 0, 0, 10, 12), xfer, Op(2, 1, 20, 30), Op(3, 1, 40, -1, 47)};
  const std::string json = ChromeTraceJson(events, {"cpu0", "cpu1"}, Ms(45));
  google::protobuf::Struct root = ParseJson(json);
  ASSERT_TRUE(root.fields().contains("traceEvents"));
  const auto& list = root.fields().at("traceEvents").list_value();

  int complete = 0;
  std::map<int, int> per_tid;
  std::map<int, std::string> thread_names;
  for (const auto& v : list.values()) {
    const auto& f = v.struct_value().fields();
    EXPECT_EQ(f.at("pid").number_value(), 1);
    const std::string ph = f.at("ph").string_value();
    const int tid = static_cast<int>(f.at("tid").number_value());
    if (ph == "M" && f.at("name").string_value() == "thread_name") {
      thread_names[tid] = f.at("args").struct_value().fields().at("name").string_value();
    }
    if (ph != "X") continue;
    ++complete;
    ++per_tid[tid];
    EXPECT_GE(f.at("dur").number_value(), 0);
    if (tid == 1 && f.at("args").struct_value().fields().at("node").number_value() == 1) {
      EXPECT_EQ(f.at("name").string_value(), "layer\"0\"");
      EXPECT_DOUBLE_EQ(f.at("ts").number_value(), 0);
      EXPECT_DOUBLE_EQ(f.at("dur").number_value(), 10000);  // us
      EXPECT_DOUBLE_EQ(f.at("args").struct_value().fields().at("error_pct").number_value(), 20);
    }
    if (tid == 5 && f.at("args").struct_value().fields().contains("running")) {
      EXPECT_DOUBLE_EQ(f.at("dur").number_value(), 5000);  // 40 ms .. now (45 ms)
    }
  }
  // 4 actual intervals, 3 with a prediction.
  EXPECT_EQ(complete, 7);
  EXPECT_EQ(per_tid[1], 1);  // cpu0 actual
  EXPECT_EQ(per_tid[2], 1);  // cpu0 predicted
  EXPECT_EQ(per_tid[3], 1);  // cpu0 transfers out
  EXPECT_EQ(per_tid[4], 1);  // cpu0 transfers predicted
  EXPECT_EQ(per_tid[5], 2);  // cpu1 actual
  EXPECT_EQ(per_tid[6], 1);  // cpu1 predicted (the running one)
  EXPECT_EQ(thread_names[1], "cpu0");
  EXPECT_EQ(thread_names[6], "cpu1 predicted");
  EXPECT_EQ(thread_names[7], "cpu1 transfers out");
}

TEST(ChromeTrace, BatchWorkHasItsOwnCategoryAndLabel) {
  TimelineEntry batch = Op(1, 0, 0, 10);
  batch.priority_class = PriorityClass::kOffline;
  batch.label = "batch 3/q-7";
  TimelineEntry other = Op(2, 0, 10, 20);
  other.label = "chat-frontend";
  google::protobuf::Struct root = ParseJson(ChromeTraceJson({batch, other}, {"cpu0"}, Ms(30)));
  std::map<double, std::pair<std::string, std::string>> by_node;  // node -> (cat, label)
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() != "X") continue;
    const auto& args = f.at("args").struct_value().fields();
    by_node[args.at("node").number_value()] = {f.at("cat").string_value(), args.at("label").string_value()};
  }
  EXPECT_EQ(by_node[1], std::make_pair(std::string("batch"), std::string("batch 3/q-7")));
  EXPECT_EQ(by_node[2], std::make_pair(std::string("op"), std::string("chat-frontend")));
}

TEST(ChromeTrace, EmptyIsStillAValidTrace) {
  google::protobuf::Struct root = ParseJson(ChromeTraceJson({}, {}, Ms(0)));
  EXPECT_EQ(root.fields().at("traceEvents").list_value().values_size(), 1);  // process_name only
}

TEST(JsonQuote, EscapesControlCharacters) { EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\""); }

}  // namespace
}  // namespace slicesched
