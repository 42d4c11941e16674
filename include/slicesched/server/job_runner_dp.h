// Data parallelism of the fine-tuning job runner (server/job_runner.h): how
// many micro-batch streams a job runs on the devices the planner gave it,
// which devices each stream may use, and the seconds per iteration the
// planner is offered for each GPU count. Pure functions, torch-free.
//
// Streams. A job of pipeline_parallel pp given g devices runs m = g / pp
// streams; stream i is bounded to devices [i*pp, (i+1)*pp) of the set (a pp2
// job on {0,1,2,3} gets {0,1} and {2,3}). An iteration of grad_accumulation
// GA micro-batches then runs in ceil(GA / m) waves of up to m concurrent
// micro-batches (all of one iteration), one AdamW step at its end.
//
// Offered counts. g = m * pp within [gpus.min, gpus.max] and at most the
// cluster's devices; gpus.min always, a larger g only when it needs fewer
// waves than the previous offered count (m > GA, or 3 streams for GA = 4,
// would hold devices without finishing an iteration sooner).
//
// Times for an offered count g, in this order:
//   measured   the job's own measured iterations on g devices (EMA);
//   lut        with a time LUT (planner.time_lut): t(min) x LUT(g) /
//              LUT(min), both looked up (interpolation allowed) under
//              DpLutKey; t(min) is the job's measured (or LUT-profiled)
//              time at gpus.min, so the LUT gives the scaling and the
//              job's own measurement the level;
//   estimated  micro x ceil(GA / m) + waves x sync x (m - 1), micro = the
//              job's measured seconds per micro-batch, sync = the measured
//              extra seconds per additional concurrent stream of a wave
//              (DpInputs::sync_per_stream_s, from waves run on this
//              deployment), else default_sync_fraction x micro.
// The count gpus.min itself is always the job's measured time (profiling,
// then every iteration).
#pragma once

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "slicesched/ymir/time_lut.h"

namespace slicesched {

struct DpShape {
  int pipeline_parallel = 1;
  int min_gpus = 1;
  int max_gpus = 1;
  int64_t grad_accumulation = 1;
  int64_t batch_size = 1;
};

// Streams for a device set of `devices` (>= 1 even when devices < pp).
int DpStreams(const DpShape& shape, int devices);
// The device group of each of `streams` streams (see above).
std::vector<std::vector<uint32_t>> DpStreamDevices(const std::vector<uint32_t>& devices, int pipeline_parallel,
                                                   int streams);
// Waves per iteration with `streams` streams: ceil(GA / streams).
int64_t DpWaves(const DpShape& shape, int streams);
// The GPU counts offered to the planner (ascending; gpus.min first).
std::vector<int> DpOfferedGpuCounts(const DpShape& shape, int cluster_devices);
// The LUT key of the job on g devices: devices = streams (data) for pp 1,
// else g (pipeline); grad_accum = waves; local_batch = batch_size.
ymir::LutKey DpLutKey(const DpShape& shape, int gpus);

enum class DpTimeSource { kMeasured, kLut, kEstimated };
std::string_view DpTimeSourceName(DpTimeSource s);  // "measured", "lut", "estimated"

struct DpInputs {
  double min_iter_s = 0;              // seconds per iteration at gpus.min (> 0)
  double micro_s = 0;                 // seconds per micro-batch, one stream (> 0)
  std::map<int, double> measured_s;   // gpus -> measured seconds per iteration
  const ymir::TimeLut* lut = nullptr;  // planner.time_lut, or null
  double sync_per_stream_s = -1;      // measured; < 0 = not measured yet
  double default_sync_fraction = 0.1;
};

struct DpTime {
  int gpus = 0;
  double seconds = 0;
  DpTimeSource source = DpTimeSource::kEstimated;
};

// One entry per DpOfferedGpuCounts count.
std::vector<DpTime> DpIterTimes(const DpShape& shape, const DpInputs& in, int cluster_devices);

}  // namespace slicesched
