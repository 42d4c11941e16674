#!/usr/bin/python3
"""Plots DIR/bench_sim.csv (from `slicesim bench-sim --sweep DIR`) as DIR/bench_sim.png:
simulation time (construction included) against simulated operators, one line
per device count, with the paper's 176.8 ops/ms for reference."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(out_dir):
    rows = list(csv.DictReader(open(f"{out_dir}/bench_sim.csv")))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for devices in sorted({int(r["devices"]) for r in rows}):
        pts = sorted((int(r["simulated_ops"]), float(r["construct_us"]) + float(r["simulate_us"]), float(r["ops_per_ms"]))
                     for r in rows if int(r["devices"]) == devices)
        ax1.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], marker="o", label=f"{devices} devices")
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"{devices} devices")
    xs = [int(r["simulated_ops"]) for r in rows]
    ax1.plot([min(xs), max(xs)], [min(xs) / 176.8, max(xs) / 176.8], "k--", label="paper (176.8 ops/ms)")
    ax1.set_xlabel("simulated operators")
    ax1.set_ylabel("construction + simulation (ms)")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.grid(True, which="both", alpha=0.3)
    ax2.axhline(20000, color="r", linestyle=":", label="target 20,000")
    ax2.set_xlabel("simulated operators")
    ax2.set_ylabel("simulated operators per ms")
    ax2.set_xscale("log")
    ax2.legend()
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle("slicesched simulator: time vs operators (one core)")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/bench_sim.png", dpi=110)
    print(f"wrote {out_dir}/bench_sim.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
