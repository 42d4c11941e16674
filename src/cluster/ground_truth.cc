#include "slicesched/cluster/ground_truth.h"

#include <algorithm>
#include <cmath>

namespace slicesched {
namespace {

// Reads a template-defined symbol (model dimension), or `fallback`.
int64_t Define(const GraphTemplate& tpl, std::string_view name, int64_t fallback) {
  auto sym = tpl.symbols().Find(name);
  if (!sym.has_value() || !tpl.defines().IsBound(*sym)) return fallback;
  return tpl.defines().Get(*sym);
}

// Reads an attribute by name from the evaluated attributes, or `fallback`.
int64_t Attr(const OpSpec& op, std::span<const int64_t> attrs, std::string_view name, int64_t fallback) {
  for (size_t i = 0; i < op.attrs.size() && i < attrs.size(); ++i) {
    if (op.attrs[i].first == name) return attrs[i];
  }
  return fallback;
}

}  // namespace

GroundTruthModel::GroundTruthModel(const AcceleratorSet& accelerators, GroundTruthOptions options)
    : accel_(&accelerators), o_(options) {
  std::mt19937_64 rng(o_.seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  skew_.resize(accelerators.size());
  for (double& s : skew_) s = 1.0 + u(rng) * o_.device_skew_pct / 100.0;
}

double GroundTruthModel::Noise(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  return 1.0 + u(rng) * o_.noise_pct / 100.0;
}

double GroundTruthModel::NominalOpNs(const GraphTemplate& tpl, int op_index, std::span<const int64_t> attrs) const {
  const OpSpec& op = tpl.op(op_index);
  const double B = static_cast<double>(Attr(op, attrs, "batch", 1));
  const double S = static_cast<double>(Attr(op, attrs, "new_tokens", 1));
  const double C = static_cast<double>(Attr(op, attrs, "context", 0));
  const double F = static_cast<double>(Attr(op, attrs, "layers", 1));
  const double H = static_cast<double>(Define(tpl, "H", 4096));
  const double NH = static_cast<double>(Define(tpl, "NH", 32));
  const double NKV = static_cast<double>(Define(tpl, "NKV", 8));
  const double HD = static_cast<double>(Define(tpl, "HD", 128));
  const double V = static_cast<double>(Define(tpl, "V", 32000));
  const double ES = static_cast<double>(Define(tpl, "ES", 2));
  const double tokens = B * S;
  // Compute efficiency rises with the tokens processed together (GEMM shape),
  // saturating at max_efficiency: non-linear in shape.
  // (+4: even a single token runs as a small GEMM, not at zero efficiency.)
  const double eff = o_.max_efficiency * (tokens + 4.0) / (tokens + o_.efficiency_half_tokens);
  switch (op.kind) {
    case OpKind::kFusedLayers:
    case OpKind::kTrainForward:
    case OpKind::kTrainBackward: {
      const double weights = static_cast<double>(op.weight_bytes.count());
      const double params = weights / ES;
      const double span = C + S;
      const double flops = 2.0 * params * tokens + 4.0 * F * B * S * span * NH * HD;
      const double bytes = weights + 2.0 * F * B * span * NKV * HD * ES + 4.0 * tokens * H * ES * F;
      const double factor = op.kind == OpKind::kTrainBackward ? 2.0 : 1.0;
      // Roofline: the slower of compute and memory, plus per-layer launch.
      const double t_compute = flops / (o_.peak_flops * eff);
      const double t_memory = bytes / o_.mem_bandwidth;
      return factor * std::max(t_compute, t_memory) * 1e9 + F * o_.launch_ns_per_layer;
    }
    case OpKind::kEmbedding:
      return tokens * H * ES / o_.mem_bandwidth * 1e9 + o_.launch_ns_per_layer;
    case OpKind::kLmHead: {
      const double flops = 2.0 * B * V * H;
      const double bytes = static_cast<double>(op.weight_bytes.count());
      return std::max(flops / (o_.peak_flops * o_.max_efficiency * B / (B + o_.efficiency_half_tokens)),
                      bytes / o_.mem_bandwidth) * 1e9 + o_.launch_ns_per_layer;
    }
    case OpKind::kSample:
      return B * V * 4.0 / o_.mem_bandwidth * 1e9 * 8.0 + o_.launch_ns_per_layer;
    case OpKind::kTrainLoss: {
      // The head's forward and its two backward GEMMs over every position.
      const double NC = static_cast<double>(Attr(op, attrs, "outputs", static_cast<int64_t>(V)));
      const double flops = 3.0 * 2.0 * tokens * NC * H;
      const double bytes = 2.0 * tokens * H * ES + 2.0 * NC * H * 4.0;
      return std::max(flops / (o_.peak_flops * eff), bytes / o_.mem_bandwidth) * 1e9 +
             o_.launch_ns_per_layer;
    }
    case OpKind::kMatmul: {
      const double b = static_cast<double>(Attr(op, attrs, "b", 1));
      const double m = static_cast<double>(Attr(op, attrs, "m", 1));
      const double n = static_cast<double>(Attr(op, attrs, "n", 1));
      const double k = static_cast<double>(Attr(op, attrs, "k", 1));
      const double e = o_.max_efficiency * (b * m) / (b * m + o_.efficiency_half_tokens);
      return std::max(2.0 * b * m * n * k / (o_.peak_flops * e), (b * m * k + b * k * n + b * m * n) * ES / o_.mem_bandwidth) * 1e9 +
             o_.launch_ns_per_layer;
    }
    default:
      return 1e6;
  }
}

Duration GroundTruthModel::OpTime(const GraphTemplate& tpl, int op, std::span<const int64_t> attrs, DeviceId device,
                                  bool overlapped, std::mt19937_64& rng) const {
  double ns = NominalOpNs(tpl, op, attrs) * skew_[device.value()] * Noise(rng);
  if (overlapped) ns *= 1.0 + o_.overlap_slowdown;
  return Duration::Nanos(static_cast<int64_t>(ns));
}

double GroundTruthModel::NominalTransferNs(DeviceId src, DeviceId dst, Bytes size) const {
  if (src == dst) return 0;
  const LinkSpec& link = accel_->link(src, dst);
  const double bytes = static_cast<double>(size.count());
  const double chunks = std::ceil(std::max(bytes, 1.0) / o_.chunk_bytes);
  return static_cast<double>(link.latency.nanos()) * 1.3 +
         bytes / (link.bandwidth_bytes_per_s * o_.link_efficiency) * 1e9 + chunks * o_.chunk_overhead_ns;
}

Duration GroundTruthModel::TransferTime(DeviceId src, DeviceId dst, Bytes size, bool overlapped,
                                        std::mt19937_64& rng) const {
  double ns = NominalTransferNs(src, dst, size) * Noise(rng);
  if (overlapped) ns *= 1.0 + o_.transfer_overlap_slowdown;
  return Duration::Nanos(static_cast<int64_t>(ns));
}

}  // namespace slicesched
