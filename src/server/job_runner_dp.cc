#include "slicesched/server/job_runner_dp.h"

#include <algorithm>
#include <cstddef>
#include <optional>

namespace slicesched {

int DpStreams(const DpShape& shape, int devices) {
  return std::max(1, devices / std::max(1, shape.pipeline_parallel));
}

std::vector<std::vector<uint32_t>> DpStreamDevices(const std::vector<uint32_t>& devices, int pipeline_parallel,
                                                   int streams) {
  std::vector<std::vector<uint32_t>> out;
  const auto pp = static_cast<size_t>(std::max(1, pipeline_parallel));
  for (int i = 0; i < streams; ++i) {
    const size_t from = static_cast<size_t>(i) * pp;
    if (from + pp > devices.size()) break;
    out.emplace_back(devices.begin() + static_cast<std::ptrdiff_t>(from),
                     devices.begin() + static_cast<std::ptrdiff_t>(from + pp));
  }
  if (out.empty()) out.push_back(devices);  // fewer devices than pp: one stream on all of them
  return out;
}

int64_t DpWaves(const DpShape& shape, int streams) {
  const int64_t ga = std::max<int64_t>(1, shape.grad_accumulation);
  const int64_t m = std::max(1, streams);
  return (ga + m - 1) / m;
}

std::vector<int> DpOfferedGpuCounts(const DpShape& shape, int cluster_devices) {
  std::vector<int> out = {shape.min_gpus};
  const int pp = std::max(1, shape.pipeline_parallel);
  int64_t waves = DpWaves(shape, DpStreams(shape, shape.min_gpus));
  for (int g = shape.min_gpus + pp; g <= std::min(shape.max_gpus, cluster_devices); g += pp) {
    const int64_t w = DpWaves(shape, DpStreams(shape, g));
    if (w < waves) {
      out.push_back(g);
      waves = w;
    }
  }
  return out;
}

ymir::LutKey DpLutKey(const DpShape& shape, int gpus) {
  ymir::LutKey k;
  const int streams = DpStreams(shape, gpus);
  k.parallelism = shape.pipeline_parallel > 1 ? ymir::Parallelism::kPipeline : ymir::Parallelism::kData;
  k.devices = shape.pipeline_parallel > 1 ? gpus : streams;
  k.grad_accum = DpWaves(shape, streams);
  k.local_batch = std::max<int64_t>(1, shape.batch_size);
  return k;
}

std::string_view DpTimeSourceName(DpTimeSource s) {
  switch (s) {
    case DpTimeSource::kMeasured: return "measured";
    case DpTimeSource::kLut: return "lut";
    case DpTimeSource::kEstimated: return "estimated";
  }
  return "?";
}

std::vector<DpTime> DpIterTimes(const DpShape& shape, const DpInputs& in, int cluster_devices) {
  std::vector<DpTime> out;
  std::optional<double> lut_min;
  if (in.lut != nullptr) {
    auto r = in.lut->Lookup(DpLutKey(shape, shape.min_gpus));
    if (r.ok() && r->seconds > 0) lut_min = r->seconds;
  }
  for (int g : DpOfferedGpuCounts(shape, cluster_devices)) {
    DpTime t;
    t.gpus = g;
    if (g == shape.min_gpus) {
      t.seconds = in.min_iter_s;
      t.source = DpTimeSource::kMeasured;
      out.push_back(t);
      continue;
    }
    if (auto m = in.measured_s.find(g); m != in.measured_s.end() && m->second > 0) {
      t.seconds = m->second;
      t.source = DpTimeSource::kMeasured;
      out.push_back(t);
      continue;
    }
    if (lut_min.has_value()) {
      auto r = in.lut->Lookup(DpLutKey(shape, g));
      if (r.ok() && r->seconds > 0) {
        t.seconds = in.min_iter_s * r->seconds / *lut_min;
        t.source = DpTimeSource::kLut;
        out.push_back(t);
        continue;
      }
    }
    const int streams = DpStreams(shape, g);
    const auto waves = static_cast<double>(DpWaves(shape, streams));
    const double sync = in.sync_per_stream_s >= 0 ? in.sync_per_stream_s : in.default_sync_fraction * in.micro_s;
    t.seconds = waves * (in.micro_s + sync * static_cast<double>(streams - 1));
    t.source = DpTimeSource::kEstimated;
    out.push_back(t);
  }
  return out;
}

}  // namespace slicesched
