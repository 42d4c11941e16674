#include "slicesched/gmg/accelerator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace slicesched {
namespace {

using ::testing::HasSubstr;

AcceleratorSet Parse(const std::string& text, ConfigErrors* errors) {
  auto root = LoadYamlString(text, "cluster.yaml");
  EXPECT_TRUE(root.ok()) << root.status();
  ConfigReader r(*root, "cluster.yaml", errors);
  return AcceleratorSet::FromConfig(r, errors);
}

TEST(AcceleratorSetTest, ExpandsCountsAndLinks) {
  ConfigErrors errors;
  AcceleratorSet set = Parse(R"(
devices:
  - {name: gpu, count: 4, type: A16, memory: 64GiB, backend: virtual}
  - {name: host, type: cpu, memory: 2GiB, backend: cpu}
links:
  default: {bandwidth: 12GB/s, latency: 20us}
  pairs:
    - {between: [gpu0, gpu1], bandwidth: 24GB/s, latency: 8us}
)", &errors);
  ASSERT_TRUE(errors.ok()) << errors.ToStatus();
  ASSERT_EQ(set.size(), 5u);
  EXPECT_EQ(set.device(DeviceId(3)).name, "gpu3");
  EXPECT_EQ(set.device(DeviceId(3)).memory, Bytes::GiB(64));
  EXPECT_EQ(set.device(DeviceId(4)).backend, DeviceBackend::kCpu);
  EXPECT_DOUBLE_EQ(set.link(DeviceId(0), DeviceId(1)).bandwidth_bytes_per_s, 24e9);
  EXPECT_DOUBLE_EQ(set.link(DeviceId(1), DeviceId(0)).bandwidth_bytes_per_s, 24e9);
  EXPECT_DOUBLE_EQ(set.link(DeviceId(0), DeviceId(2)).bandwidth_bytes_per_s, 12e9);
  EXPECT_EQ(set.link(DeviceId(0), DeviceId(2)).latency, Duration::Micros(20));
  // 12 MB over 12 GB/s plus 20 us.
  EXPECT_EQ(set.link(DeviceId(0), DeviceId(2)).TransferTime(Bytes(12000000)),
            Duration::Micros(1020));
  EXPECT_EQ(*set.FindDevice("host"), DeviceId(4));
  EXPECT_FALSE(set.FindDevice("gpu9").ok());
}

// A typo at the cluster level used to be ignored: `link:` left every pair on
// the built-in prior without a word.
TEST(AcceleratorSetTest, UnknownClusterKeyIsAnError) {
  ConfigErrors errors;
  Parse(R"(devices: [{name: gpu, memory: 1GiB}]
link:
  default: {bandwidth: 12GB/s, latency: 20us}
)", &errors);
  ASSERT_FALSE(errors.ok());
  EXPECT_THAT(std::string(errors.ToStatus().message()),
              HasSubstr("cluster.yaml:2:1: unknown field 'link' (expected one of: devices, links)"));
}

TEST(AcceleratorSetTest, ErrorsNameFieldAndPosition) {
  ConfigErrors errors;
  Parse(R"(devices:
  - {name: gpu, memory: lots}
  - {name: gpu, memory: 1GiB, backend: quantum}
links:
  default: {bandwidth: fast}
)", &errors);
  ASSERT_FALSE(errors.ok());
  const std::string msg(errors.ToStatus().message());
  EXPECT_THAT(msg, HasSubstr("cluster.yaml:2:"));
  EXPECT_THAT(msg, HasSubstr("devices[0].memory"));
  EXPECT_THAT(msg, HasSubstr("unknown backend 'quantum'"));
  EXPECT_THAT(msg, HasSubstr("links.default.bandwidth"));
}

TEST(AcceleratorSetTest, RejectsDuplicatesAndUnknownLinkEnds) {
  ConfigErrors errors;
  Parse(R"(devices:
  - {name: a, memory: 1GiB}
  - {name: a, memory: 1GiB}
)", &errors);
  EXPECT_THAT(std::string(errors.ToStatus().message()), HasSubstr("duplicate device name 'a'"));

  ConfigErrors e2;
  Parse(R"(devices:
  - {name: a, memory: 1GiB}
  - {name: b, memory: 1GiB}
links:
  pairs:
    - {between: [a, zz], bandwidth: 1GB/s}
)", &e2);
  EXPECT_THAT(std::string(e2.ToStatus().message()), HasSubstr("no device named 'zz'"));
}

// backend: cuda names its CUDA device: `device: N` counts up from N over
// `count`, a list gives one index per device (two logical devices may share
// one GPU); `ordinal` is the older name. Elsewhere the key is refused.
TEST(AcceleratorSetTest, CudaDevicesNameTheirGpu) {
  ConfigErrors errors;
  AcceleratorSet set = Parse(R"(devices:
  - {name: gpu, count: 2, memory: 70GiB, backend: cuda, device: 1}
  - {name: half, count: 2, memory: 30GiB, backend: cuda, device: [0, 0]}
  - {name: solo, memory: 30GiB, backend: cuda, ordinal: 3}
  - {name: first, memory: 30GiB, backend: cuda}
)", &errors);
  ASSERT_TRUE(errors.ok()) << errors.ToStatus();
  ASSERT_EQ(set.size(), 6u);
  EXPECT_EQ(set.device(DeviceId(0)).backend, DeviceBackend::kCuda);
  EXPECT_EQ(set.device(DeviceId(0)).ordinal, 1);
  EXPECT_EQ(set.device(DeviceId(1)).ordinal, 2);
  EXPECT_EQ(set.device(DeviceId(2)).ordinal, 0);
  EXPECT_EQ(set.device(DeviceId(3)).ordinal, 0);
  EXPECT_EQ(set.device(DeviceId(4)).ordinal, 3);
  EXPECT_EQ(set.device(DeviceId(5)).ordinal, 0);
}

TEST(AcceleratorSetTest, CudaDeviceIndexErrorsNameTheField) {
  struct Case {
    const char* devices;
    const char* message;
  };
  const Case cases[] = {
      {"  - {name: g, memory: 1GiB, backend: cpu, device: 0}\n",
       "devices[0].device: is the CUDA device index, only for backend cuda (this device's backend is 'cpu')"},
      {"  - {name: g, memory: 1GiB, backend: cuda, device: -1}\n",
       "devices[0].device: must be a CUDA device index from 0, got -1"},
      {"  - {name: g, count: 3, memory: 1GiB, backend: cuda, device: [0, 1]}\n",
       "lists 2 CUDA device indices for 3 devices: give one per device"},
      {"  - {name: g, memory: 1GiB, backend: cuda, device: 0, ordinal: 0}\n",
       "devices[0].ordinal: is the older name of 'device': give one of them"},
      {"  - {name: g, memory: 1GiB, backend: cuda, device: zero}\n", "devices[0].device"},
  };
  for (const Case& c : cases) {
    ConfigErrors errors;
    Parse(std::string("devices:\n") + c.devices, &errors);
    ASSERT_FALSE(errors.ok()) << c.devices;
    EXPECT_THAT(std::string(errors.ToStatus().message()), HasSubstr(c.message)) << c.devices;
  }
}

TEST(AcceleratorSetTest, ParseBandwidth) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("12GB/s"), 12e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1GiB/s"), 1073741824.0);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("5e9"), 5e9);
  EXPECT_FALSE(ParseBandwidth("fast").ok());
  EXPECT_FALSE(ParseBandwidth("-1GB/s").ok());
  EXPECT_FALSE(ParseBandwidth("0").ok());
}

}  // namespace
}  // namespace slicesched
