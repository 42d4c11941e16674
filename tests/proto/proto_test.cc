// The generated protobuf code builds, links and round-trips.
#include <gtest/gtest.h>

#include "slicesched/v1/gmg.pb.h"

namespace {

TEST(ProtoTest, GmgDumpRoundTrips) {
  slicesched::v1::GmgDump dump;
  dump.set_taken_at_ns(42);
  auto* d = dump.add_devices();
  d->set_name("gpu0");
  d->set_memory_bytes(int64_t{64} << 30);
  auto* n = dump.add_nodes();
  n->set_id(7);
  n->set_state(slicesched::v1::NODE_STATE_RUNNING);
  n->add_preds(3);
  std::string wire;
  ASSERT_TRUE(dump.SerializeToString(&wire));
  slicesched::v1::GmgDump back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.taken_at_ns(), 42);
  EXPECT_EQ(back.devices(0).name(), "gpu0");
  EXPECT_EQ(back.nodes(0).state(), slicesched::v1::NODE_STATE_RUNNING);
  EXPECT_EQ(back.nodes(0).preds(0), 3u);
  EXPECT_FALSE(back.ParseFromString("\xff\xff\xff"));
}

}  // namespace
