#include "slicesched/ymir/time_lut.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "gtest/gtest.h"

namespace slicesched::ymir {
namespace {

LutKey K(int64_t d, int64_t ga, int64_t b, int64_t frozen = 0) {
  return LutKey{.devices = d, .grad_accum = ga, .local_batch = b, .frozen_layers = frozen};
}

// A grid whose true time is t = 0.01 + 0.002 b ga for 1 device, and 1.25x that
// on 2 devices (communication).
TimeLut Grid() {
  TimeLut lut(0.5);
  for (int64_t d : {1, 2}) {
    for (int64_t ga : {1, 2}) {
      for (int64_t b : {4, 8, 16}) {
        const double t = (0.01 + 0.002 * double(b * ga)) * (d == 2 ? 1.25 : 1.0);
        EXPECT_TRUE(lut.Set(K(d, ga, b), t, 3).ok());
      }
    }
  }
  return lut;
}

TEST(TimeLut, MeasuredKeysAreExact) {
  const TimeLut lut = Grid();
  auto r = lut.Lookup(K(2, 2, 8));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->interpolated);
  EXPECT_DOUBLE_EQ(r->seconds, (0.01 + 0.002 * 16) * 1.25);
  ASSERT_EQ(r->source.size(), 1u);
  EXPECT_EQ(r->source[0], K(2, 2, 8));
}

TEST(TimeLut, MissingKeysAreInterpolatedAndMarked) {
  const TimeLut lut = Grid();
  // Between batches 8 and 16 on one axis: linear, exact for this grid.
  auto r = lut.Lookup(K(1, 1, 12));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->interpolated);
  EXPECT_NEAR(r->seconds, 0.01 + 0.002 * 12, 1e-12);
  ASSERT_EQ(r->source.size(), 2u);
  EXPECT_EQ(r->source[0], K(1, 1, 8));
  EXPECT_EQ(r->source[1], K(1, 1, 16));
  // Two axes at once (batch 6, accumulation 3 = extrapolated): bilinear.
  auto two = lut.Lookup(K(1, 3, 6));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->interpolated);
  EXPECT_NEAR(two->seconds, 0.01 + 0.002 * 6 * 3, 1e-12);
  EXPECT_EQ(two->source.size(), 4u);
  // Extrapolation below the range is floored at half the nearest value.
  auto small = lut.Lookup(K(1, 1, 1));
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->interpolated);
  EXPECT_NEAR(small->seconds, std::max(0.01 + 0.002 * 1, 0.5 * (0.01 + 0.002 * 4)), 1e-12);
  // Devices between 1 and 2 do not exist, but 3 devices extrapolate.
  auto d3 = lut.Lookup(K(3, 1, 4));
  ASSERT_TRUE(d3.ok());
  EXPECT_TRUE(d3->interpolated);
  EXPECT_NEAR(d3->seconds, 0.018 * 1.5, 1e-12);
}

TEST(TimeLut, CategoricalKeysAreNeverInterpolated) {
  const TimeLut lut = Grid();
  LutKey amp = K(1, 1, 8);
  amp.amp = true;
  auto r = lut.Lookup(amp);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  LutKey pp = K(1, 1, 8);
  pp.parallelism = Parallelism::kPipeline;
  EXPECT_EQ(lut.Lookup(pp).status().code(), absl::StatusCode::kNotFound);
  // Frozen layers were profiled at one value only: another value cannot be
  // interpolated, and the error says along which axis.
  auto f = lut.Lookup(K(1, 1, 8, 2));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(f.status().message()).find("frozen_layers"), std::string::npos) << f.status();
  EXPECT_EQ(lut.Lookup(K(0, 1, 8)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TimeLut, FeedbackUpdatesByEwmaAndAddsMeasuredKeys) {
  TimeLut lut = Grid();  // alpha 0.5
  const double before = lut.Lookup(K(1, 1, 8))->seconds;  // 0.026
  ASSERT_TRUE(lut.Update(K(1, 1, 8), 0.036).ok());
  EXPECT_NEAR(lut.Lookup(K(1, 1, 8))->seconds, 0.5 * before + 0.5 * 0.036, 1e-15);
  EXPECT_EQ(lut.entries().at(K(1, 1, 8)).samples, 4);
  // Interpolated lookups see the update.
  EXPECT_NEAR(lut.Lookup(K(1, 1, 12))->seconds, 0.5 * (0.031 + 0.042), 1e-12);
  // Feedback for an unmeasured key makes it measured.
  EXPECT_TRUE(lut.Lookup(K(1, 1, 12))->interpolated);
  ASSERT_TRUE(lut.Update(K(1, 1, 12), 0.05).ok());
  auto r = lut.Lookup(K(1, 1, 12));
  EXPECT_FALSE(r->interpolated);
  EXPECT_DOUBLE_EQ(r->seconds, 0.05);
  EXPECT_EQ(lut.Update(K(1, 1, 12), -1.0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TimeLut, SaveLoadRoundTripAndBadFiles) {
  TimeLut lut = Grid();
  LutKey special = K(2, 1, 8, 1);
  special.amp = true;
  special.grad_checkpoint = true;
  special.parallelism = Parallelism::kPipeline;
  ASSERT_TRUE(lut.Set(special, 0.123456789, 7).ok());
  const std::string path =
      (std::filesystem::temp_directory_path() / ("time_lut_test_" + std::to_string(::getpid()) + ".csv")).string();
  ASSERT_TRUE(lut.Save(path).ok());
  auto back = TimeLut::Load(path, 0.5);
  std::filesystem::remove(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->entries().size(), lut.entries().size());
  for (const auto& [k, e] : lut.entries()) {
    ASSERT_TRUE(back->entries().count(k)) << k.ToString();
    EXPECT_NEAR(back->entries().at(k).seconds, e.seconds, 1e-9 * e.seconds);
    EXPECT_EQ(back->entries().at(k).samples, e.samples);
  }
  EXPECT_EQ(back->ToCsv(), lut.ToCsv());

  const std::string header =
      "devices,grad_accum,local_batch,frozen_layers,amp,grad_checkpoint,parallelism,seconds,samples\n";
  auto bad = TimeLut::FromCsv(header + "1,1,8,0,0,0,data,0.1,1\n1,1,x,0,0,0,data,0.1,1\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("line 3"), std::string::npos) << bad.status();
  EXPECT_FALSE(TimeLut::FromCsv(header + "1,1,8,0,0,0,tensor,0.1,1\n").ok());
  EXPECT_FALSE(TimeLut::FromCsv(header + "1,1,8,0,0,0,data,-0.1,1\n").ok());
  EXPECT_FALSE(TimeLut::FromCsv(header + "1,1,8,0,0,0,data,0.1,1\n1,1,8,0,0,0,data,0.2,1\n").ok());
  EXPECT_FALSE(TimeLut::FromCsv("seconds\n").ok());
  EXPECT_EQ(TimeLut::Load("/nonexistent/lut.csv").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace slicesched::ymir
