#!/usr/bin/python3
"""Plots DIR/bench_sim.csv (from `slicesim bench-sim --sweep DIR`) as DIR/bench_sim.png
and DIR/bench_sim.svg: simulation time (construction included) against simulated
operators, one line per device count, with the paper's 176.8 ops/ms for reference.

With more directories (`plot_bench_sim.py OUT RUN1 RUN2 ...`), first writes
OUT/bench_sim.csv keeping, per (devices, ops) cell, the row of the fastest run
(least construction + simulation time): on a shared machine the slow runs of a
cell measure the other processes' cache pressure, not the simulator."""
import csv
import os
import sys


def merge_fastest(out_dir, run_dirs):
    best = {}
    fields = None
    for d in run_dirs:
        with open(f"{d}/bench_sim.csv") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames
            for r in reader:
                key = (int(r["devices"]), int(r["ops"]))
                t = float(r["construct_us"]) + float(r["simulate_us"])
                if key not in best or t < best[key][0]:
                    best[key] = (t, r)
    if not best:
        sys.exit("no rows in " + " ".join(run_dirs))
    os.makedirs(out_dir, exist_ok=True)
    with open(f"{out_dir}/bench_sim.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for key in sorted(best):
            w.writerow(best[key][1])
    print(f"wrote {out_dir}/bench_sim.csv (fastest of {len(run_dirs)} runs per cell)")

import matplotlib

matplotlib.use("Agg")
# Fixed SVG element ids (matplotlib salts them randomly otherwise).
matplotlib.rcParams["svg.hashsalt"] = "slicesched-bench-sim"
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
    # No creation date in the SVG, so that replotting the same CSV gives the same file.
    fig.savefig(f"{out_dir}/bench_sim.svg", metadata={"Date": None})
    print(f"wrote {out_dir}/bench_sim.png and {out_dir}/bench_sim.svg")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        merge_fastest(sys.argv[1], sys.argv[2:])
    main(sys.argv[1] if len(sys.argv) > 1 else "results")
