
#include "job_runner_spatial.h"

#include <algorithm>
#include <cmath>

#include "slicesched/common/strings.h"

namespace slicesched::spatial_internal {

using executor::Tensor;
using executor::TrainBatch;

absl::StatusOr<TrainBatch> MixMicroBatches(std::span<const JointPart> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("MixMicroBatches: no micro-batch to mix");
  int64_t len = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const TrainBatch* b = parts[p].batch;
    if (b == nullptr || !b->tokens.defined() || !b->labels.defined() || b->tokens.shape().size() != 2 ||
        b->tokens.shape() != b->labels.shape()) {
      return absl::InvalidArgumentError(
          StrCat("MixMicroBatches: part ", p, " (slot ", parts[p].slot,
                 ") needs tokens and labels of one shape [B, S]"));
    }
    if (!b->row_pad.empty() && static_cast<int64_t>(b->row_pad.size()) != b->tokens.shape()[0]) {
      return absl::InvalidArgumentError(StrCat("MixMicroBatches: part ", p, " (slot ", parts[p].slot,
                                               ") has ", b->row_pad.size(), " row_pad entries for ",
                                               b->tokens.shape()[0], " rows"));
    }
    len = std::max(len, b->tokens.shape()[1]);
  }
  std::vector<int64_t> tokens, labels;
  TrainBatch out;
  for (const JointPart& part : parts) {
    const std::vector<int64_t> t = part.batch->tokens.ToInt64(), l = part.batch->labels.ToInt64();
    const int64_t rows = part.batch->tokens.shape()[0], s = part.batch->tokens.shape()[1];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < len - s; ++j) {
        tokens.push_back(0);
        labels.push_back(-1);
      }
      tokens.insert(tokens.end(), t.begin() + r * s, t.begin() + (r + 1) * s);
      labels.insert(labels.end(), l.begin() + r * s, l.begin() + (r + 1) * s);
      out.row_task.push_back(part.slot);
      const int64_t own_pad = part.batch->row_pad.empty() ? 0 : part.batch->row_pad[static_cast<size_t>(r)];
      out.row_pad.push_back(len - s + own_pad);
    }
  }
  const std::vector<int64_t> shape = {static_cast<int64_t>(out.row_task.size()), len};
  out.tokens = Tensor::FromInt64(tokens, shape);
  out.labels = Tensor::FromInt64(labels, shape);
  return out;
}

std::optional<double> NormalReference(std::span<const std::pair<int64_t, double>> run, int64_t step,
                                      MetricKind kind) {
  if (run.empty() || step < run.front().first) return std::nullopt;
  for (size_t i = 0; i < run.size(); ++i) {
    if (run[i].first == step) return run[i].second;
    if (i + 1 < run.size() && run[i].first < step && step < run[i + 1].first) {
      const double f = static_cast<double>(step - run[i].first) / static_cast<double>(run[i + 1].first - run[i].first);
      return run[i].second + f * (run[i + 1].second - run[i].second);
    }
  }
  if (kind == MetricKind::kAccuracy) return std::nullopt;
  std::vector<ymir::LossPoint> points;
  for (const auto& [s, m] : run) {
    const double loss = kind == MetricKind::kPerplexity ? std::log(m) : m;
    if (!(loss > 0) || !std::isfinite(loss)) return std::nullopt;
    points.push_back({static_cast<double>(s), loss});
  }
  absl::StatusOr<ymir::LossCurve> c = ymir::FitLossCurve(points);
  if (!c.ok()) return std::nullopt;
  const double loss = c->Loss(static_cast<double>(step));
  if (!std::isfinite(loss)) return std::nullopt;
  return kind == MetricKind::kPerplexity ? std::exp(loss) : loss;
}

}  // namespace slicesched::spatial_internal

