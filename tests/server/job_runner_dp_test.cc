#include "slicesched/server/job_runner_dp.h"

#include <gtest/gtest.h>

#include <vector>

namespace slicesched {
namespace {

TEST(JobRunnerDpTest, StreamsAndDeviceGroups) {
  const DpShape pp1{.pipeline_parallel = 1, .min_gpus = 1, .max_gpus = 4, .grad_accumulation = 4, .batch_size = 16};
  EXPECT_EQ(DpStreams(pp1, 1), 1);
  EXPECT_EQ(DpStreams(pp1, 3), 3);
  const DpShape pp2{.pipeline_parallel = 2, .min_gpus = 2, .max_gpus = 4, .grad_accumulation = 4, .batch_size = 16};
  EXPECT_EQ(DpStreams(pp2, 4), 2);
  EXPECT_EQ(DpStreams(pp2, 1), 1);  // fewer devices than pp: still one stream
  EXPECT_EQ(DpStreamDevices({2, 3, 0, 1}, 2, 2), (std::vector<std::vector<uint32_t>>{{2, 3}, {0, 1}}));
  EXPECT_EQ(DpStreamDevices({0, 1, 2}, 1, 3), (std::vector<std::vector<uint32_t>>{{0}, {1}, {2}}));
  EXPECT_EQ(DpStreamDevices({5}, 2, 1), (std::vector<std::vector<uint32_t>>{{5}}));
  EXPECT_EQ(DpWaves(pp1, 1), 4);
  EXPECT_EQ(DpWaves(pp1, 3), 2);
  EXPECT_EQ(DpWaves(pp1, 8), 1);
}

// Only counts that finish an iteration in fewer waves are offered, bounded
// by gpus.max and the cluster.
TEST(JobRunnerDpTest, OfferedCountsSkipDominatedOnes) {
  DpShape s{.pipeline_parallel = 1, .min_gpus = 1, .max_gpus = 8, .grad_accumulation = 4, .batch_size = 16};
  EXPECT_EQ(DpOfferedGpuCounts(s, 8), (std::vector<int>{1, 2, 4}));  // 3 needs 2 waves like 2
  EXPECT_EQ(DpOfferedGpuCounts(s, 3), (std::vector<int>{1, 2}));
  s.grad_accumulation = 1;
  EXPECT_EQ(DpOfferedGpuCounts(s, 8), (std::vector<int>{1}));  // nothing to run in parallel
  s.max_gpus = 1;
  s.grad_accumulation = 4;
  EXPECT_EQ(DpOfferedGpuCounts(s, 8), (std::vector<int>{1}));
  DpShape p{.pipeline_parallel = 2, .min_gpus = 2, .max_gpus = 8, .grad_accumulation = 3, .batch_size = 8};
  EXPECT_EQ(DpOfferedGpuCounts(p, 8), (std::vector<int>{2, 4, 6}));
}

TEST(JobRunnerDpTest, LutKeys) {
  DpShape s{.pipeline_parallel = 1, .min_gpus = 1, .max_gpus = 4, .grad_accumulation = 4, .batch_size = 16};
  ymir::LutKey k = DpLutKey(s, 2);
  EXPECT_EQ(k.devices, 2);
  EXPECT_EQ(k.grad_accum, 2);
  EXPECT_EQ(k.local_batch, 16);
  EXPECT_EQ(k.parallelism, ymir::Parallelism::kData);
  DpShape p{.pipeline_parallel = 2, .min_gpus = 2, .max_gpus = 4, .grad_accumulation = 2, .batch_size = 8};
  k = DpLutKey(p, 4);
  EXPECT_EQ(k.devices, 4);
  EXPECT_EQ(k.grad_accum, 1);
  EXPECT_EQ(k.parallelism, ymir::Parallelism::kPipeline);
}

// Measured beats the LUT, the LUT beats the estimate; the estimate uses the
// measured sync cost once there is one.
TEST(JobRunnerDpTest, TimesPerCountBySource) {
  const DpShape s{.pipeline_parallel = 1, .min_gpus = 1, .max_gpus = 4, .grad_accumulation = 4, .batch_size = 16};
  DpInputs in;
  in.min_iter_s = 0.4;
  in.micro_s = 0.1;
  std::vector<DpTime> t = DpIterTimes(s, in, 4);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].gpus, 1);
  EXPECT_DOUBLE_EQ(t[0].seconds, 0.4);
  EXPECT_EQ(t[0].source, DpTimeSource::kMeasured);
  // 2 waves of (0.1 + 0.1 x 0.1 sync x 1 extra stream).
  EXPECT_EQ(t[1].gpus, 2);
  EXPECT_DOUBLE_EQ(t[1].seconds, 2 * (0.1 + 0.01));
  EXPECT_EQ(t[1].source, DpTimeSource::kEstimated);
  EXPECT_DOUBLE_EQ(t[2].seconds, 1 * (0.1 + 3 * 0.01));
  in.sync_per_stream_s = 0.05;
  t = DpIterTimes(s, in, 4);
  EXPECT_DOUBLE_EQ(t[1].seconds, 2 * (0.1 + 0.05));

  ymir::TimeLut lut;
  ASSERT_TRUE(lut.Set(DpLutKey(s, 1), 2.0).ok());  // d=1 ga=4 b=16
  ASSERT_TRUE(lut.Set(DpLutKey(s, 2), 1.5).ok());  // d=2 ga=2 b=16
  in.lut = &lut;
  t = DpIterTimes(s, in, 4);
  EXPECT_EQ(t[1].source, DpTimeSource::kLut);
  EXPECT_DOUBLE_EQ(t[1].seconds, 0.4 * 1.5 / 2.0);  // the job's level, the LUT's scaling
  // d=4 ga=1 is not measured and cannot be interpolated from these two keys
  // (one measured value on the grad_accum axis per devices value): estimated.
  EXPECT_EQ(t[2].source, DpTimeSource::kEstimated);
  in.measured_s[2] = 0.33;
  t = DpIterTimes(s, in, 4);
  EXPECT_EQ(t[1].source, DpTimeSource::kMeasured);
  EXPECT_DOUBLE_EQ(t[1].seconds, 0.33);
  EXPECT_EQ(DpTimeSourceName(DpTimeSource::kLut), "lut");
}

}  // namespace
}  // namespace slicesched
