#!/usr/bin/python3
"""Plots a capacity sweep (`slicesim replay --sweep --out DIR`).

Usage: /usr/bin/python3 bench/plots/plot_sweep.py DIR

Reads DIR/sweep.csv (util,load_scale,policy,max_sustained_offline_rate,harvest_at_saturation,
tok_per_s_at_saturation,slo_at_saturation,...; one row per utilisation and policy) and writes
  DIR/sweep_harvest.png    harvest of Static-Online's idle GPU time at saturating offline load
                           vs online utilisation, one line per policy
  DIR/sweep_tok_per_s.png  token throughput at saturating offline load vs online utilisation,
                           and the highest offline rate sustained with the online SLO kept
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, "sweep.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{out_dir}/sweep.csv has no rows")
    policies = list(dict.fromkeys(r["policy"] for r in rows))

    def series(policy, key):
        pts = sorted((float(r["util"]), float(r[key])) for r in rows if r["policy"] == policy)
        return [p[0] * 100 for p in pts], [p[1] for p in pts]

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        x, y = series(p, "harvest_at_saturation")
        ax.plot(x, [100 * v for v in y], marker="o", label=p)
    ax.set_xlabel("Static-Online GPU utilisation (%)")
    ax.set_ylabel("harvest of idle GPU time (%)")
    ax.set_title("Harvest at saturating offline load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "sweep_harvest.png"), dpi=120)

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for p in policies:
        x, y = series(p, "tok_per_s_at_saturation")
        a.plot(x, y, marker="o", label=p)
        x, y = series(p, "max_sustained_offline_rate")
        b.plot(x, y, marker="o", label=p)
    a.set_xlabel("Static-Online GPU utilisation (%)")
    a.set_ylabel("tok/s")
    a.set_title("Token throughput at saturating offline load")
    b.set_xlabel("Static-Online GPU utilisation (%)")
    b.set_ylabel("offline req/s")
    b.set_title("Highest offline rate sustained (SLO kept)")
    for axis in (a, b):
        axis.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "sweep_tok_per_s.png"), dpi=120)


if __name__ == "__main__":
    main()
