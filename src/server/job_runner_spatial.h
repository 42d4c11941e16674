// Internal to the job runner (job_runner.h): the data plumbing of spatial
// joint training and of the stop-loss reference of a spatial pairing, apart
// from the runner's control flow. Torch-free TU (executor/train/train_ops.h
// only), in the LibTorch library sliced_torch with the runner.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/ymir/iteration_estimator.h"

namespace slicesched::spatial_internal {

// One job's micro-batch in a joint step: its task slot and its rows.
struct JointPart {
  int64_t slot = 0;
  const executor::TrainBatch* batch = nullptr;  // one task (row_task empty)
};

// The rows of `parts`, in order, as one mixed batch: every row left-padded
// to the longest row of all parts (token 0, label -1), row_task = its part's
// slot, row_pad = its leading pad positions (the added ones plus its own
// row_pad), so the training operators mask them (train_ops.h "Padding") and
// each row computes what it computes in its job's own micro-batch.
// InvalidArgument when there is no part, a batch is missing or malformed
// (tokens and labels int64 [B, S] of the same shape).
absl::StatusOr<executor::TrainBatch> MixMicroBatches(std::span<const JointPart> parts);

// The metric a job is expected to have after `step` optimizer steps of normal
// training, from a measured normal run of the same task (`run`: its
// (step, metric) evaluations, increasing steps; a job that trained alone
// from a fresh state): the run's own evaluation at `step`; between two of
// its evaluations, linear interpolation; beyond its last one, for a loss or
// perplexity metric the iteration estimator's extrapolation
// (ymir::FitLossCurve of the run's points, in loss units: perplexity through
// its log; needs 3 distinct steps). nullopt before the run's first
// evaluation, and beyond its last one for accuracy (the estimator predicts
// losses) or when the fit fails.
enum class MetricKind { kAccuracy, kLoss, kPerplexity };
std::optional<double> NormalReference(std::span<const std::pair<int64_t, double>> run, int64_t step,
                                      MetricKind kind);

}  // namespace slicesched::spatial_internal
