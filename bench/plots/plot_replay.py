#!/usr/bin/python3
"""Plots a co-location replay directory (the paper's Figures 8 and 1).

Usage: /usr/bin/python3 bench/plots/plot_replay.py DIR

Reads
  DIR/summary.csv      policy,req_per_s,tok_per_s,slo_attainment,gpu_util,ttft_p50_ms,
                       ttft_p99_ms,online_req_per_s,offline_tok_per_s
                       (slo_attainment and gpu_util are fractions 0..1), one row per policy
  DIR/idle_slices.csv  unit,start_s,end_s,duration_ms (from the Static-Online run)
  DIR/idle_overlap.csv unit_a,unit_b,jaccard (optional)
and writes
  DIR/fig8_throughput.png  request / token throughput, SLO attainment, GPU utilization
                           per policy, in the CSV's order
  DIR/fig1_idle_cdf.png    CDF of idle-slice durations in (10 ms, 20 s) with p50/p90/p99
  DIR/idle_overlap.png     pairwise Jaccard index of the units' idle time (if the CSV exists)
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIN_MS = 10.0
MAX_MS = 20000.0
COLORS = ["#9e9e9e", "#64b5f6", "#81c784", "#ffb74d", "#e57373", "#ba68c8", "#4db6ac", "#a1887f"]


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default), as in replay_metrics.cc."""
    if not sorted_values:
        return 0.0
    h = (len(sorted_values) - 1) * q
    i = int(math.floor(h))
    j = min(i + 1, len(sorted_values) - 1)
    return sorted_values[i] + (h - i) * (sorted_values[j] - sorted_values[i])


def plot_fig8(out_dir, rows):
    policies = [r["policy"] for r in rows]
    panels = [
        ("(a) Request throughput", "req/s", [float(r["req_per_s"]) for r in rows], "{:.2f}"),
        ("(b) Token throughput", "tok/s", [float(r["tok_per_s"]) for r in rows], "{:.2f}"),
        ("(c) SLO attainment", "%", [100 * float(r["slo_attainment"]) for r in rows], "{:.1f}%"),
        ("(d) GPU utilization", "%", [100 * float(r["gpu_util"]) for r in rows], "{:.1f}%"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    colors = [COLORS[i % len(COLORS)] for i in range(len(policies))]
    for ax, (title, unit, values, fmt) in zip(axes, panels):
        xs = range(len(policies))
        bars = ax.bar(xs, values, color=colors, edgecolor="black", linewidth=0.6)
        for bar, v in zip(bars, values):
            ax.annotate(fmt.format(v), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(policies, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(unit)
        top = max(values) if values else 1
        ax.set_ylim(0, (top if top > 0 else 1) * 1.15)
        if unit == "%":
            ax.set_ylim(0, min(110, max(10, top * 1.15)))
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("slicesched replay: policies compared (paper Figure 8)")
    fig.tight_layout()
    path = f"{out_dir}/fig8_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def plot_fig1(out_dir, slices, static_util):
    durations = sorted(d for d in (float(r["duration_ms"]) for r in slices) if MIN_MS < d < MAX_MS)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if durations:
        n = len(durations)
        xs = [d / 1000 for d in durations]
        ys = [(i + 1) / n for i in range(n)]
        ax.step(xs, ys, where="post", color="tab:blue", label=f"{n} idle slices")
        p50, p90, p99 = (percentile(durations, q) for q in (0.5, 0.9, 0.99))
        total = sum(durations)
        share = sum(d for d in durations if d < p99) / total if total > 0 else 0.0
        for value, name, style in ((p50, "p50", ":"), (p90, "p90", "--"), (p99, "p99", "-.")):
            ax.axvline(value / 1000, color="tab:red", linestyle=style, linewidth=1,
                       label=f"{name} = {value:.2f} ms")
        title = f"Idle slices shorter than p99 hold {100 * share:.1f}% of idle time"
    else:
        ax.text(0.5, 0.5, "no idle slice in (10 ms, 20 s)", ha="center", va="center", transform=ax.transAxes)
        title = "Idle slices shorter than p99: n/a"
    if static_util is not None:
        title += f"\n(Static-Online GPU utilization {100 * static_util:.1f}%)"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("idle-slice duration (s), 10 ms < d < 20 s")
    ax.set_ylabel("CDF")
    ax.set_xlim(0, MAX_MS / 1000)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if durations:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = f"{out_dir}/fig1_idle_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def plot_overlap(out_dir, pairs):
    units = sorted({int(r["unit_a"]) for r in pairs} | {int(r["unit_b"]) for r in pairs})
    index = {u: i for i, u in enumerate(units)}
    n = len(units)
    matrix = [[1.0 if i == j else float("nan") for j in range(n)] for i in range(n)]
    for r in pairs:
        a, b, j = index[int(r["unit_a"])], index[int(r["unit_b"])], float(r["jaccard"])
        matrix[a][b] = matrix[b][a] = j
    off = [matrix[i][j] for i in range(n) for j in range(n) if i < j and not math.isnan(matrix[i][j])]
    mean = sum(off) / len(off) if off else 0.0
    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * n, 0.9 + 0.7 * n))
    im = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
    for i in range(n):
        for j in range(n):
            if not math.isnan(matrix[i][j]):
                ax.text(j, i, f"{matrix[i][j]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if matrix[i][j] < 0.5 else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(units)
    ax.set_yticklabels(units)
    ax.set_xlabel("unit")
    ax.set_ylabel("unit")
    ax.set_title(f"Idle-time Jaccard (mean {mean:.2f})", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = f"{out_dir}/idle_overlap.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(out_dir):
    with open(f"{out_dir}/summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(f"{out_dir}/idle_slices.csv", newline="") as f:
        slices = list(csv.DictReader(f))
    plot_fig8(out_dir, rows)
    static = [r for r in rows if "static" in r["policy"].lower()]
    plot_fig1(out_dir, slices, float(static[0]["gpu_util"]) if static else None)
    overlap_csv = f"{out_dir}/idle_overlap.csv"
    if os.path.exists(overlap_csv):
        with open(overlap_csv, newline="") as f:
            pairs = list(csv.DictReader(f))
        if pairs:
            plot_overlap(out_dir, pairs)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: /usr/bin/python3 plot_replay.py DIR")
    main(sys.argv[1])
