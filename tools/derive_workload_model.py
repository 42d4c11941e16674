#!/usr/bin/env python3
"""Derives slicesched::BuiltInWorkloadModel's defaults from an Azure LLM trace.

Usage:
  python3 tools/derive_workload_model.py [TRACE_CSV] [--windows N]

TRACE_CSV defaults to ../shared/traces/azure_llm_code_2023.csv (relative to the
repository root). Only the Python standard library is used. The script prints

  1. the trace's summary (same definitions as slicesched::Summarize),
  2. the fitted model parameters, ready to paste into
     include/slicesched/workload/trace.h, and
  3. how closely the model reproduces the trace: it simulates N 60-minute
     windows (the same algorithm as GenerateBuiltInWorkload, with Python's RNG)
     and reports the median and 10-90% range of each statistic.

The model (see trace.h for the C++ side):

  * Lengths: context and output tokens are independent (the trace's log-log
    correlation is about 0), each a log-normal with the trace's median and p90,
    rounded to the nearest integer and clamped to the trace's [min, max].
  * Arrivals: an ON/OFF Cox process. OFF periods (no requests) and ON periods
    (bursts) alternate; their lengths are log-normal. Each burst draws its own
    rate from a log-normal and emits Poisson arrivals at that rate. The
    intensity path is then scaled so that its integral over the window equals
    mean_rate * duration, so every window has the trace's mean rate up to
    Poisson noise while the burst structure stays random.
  * Fit: the trace is cut into bursts at inter-arrival gaps longer than
    GAP_S. Gaps longer than GAP_S are OFF periods; a burst of n >= 2 requests
    spanning s seconds has ON length s * n / (n - 1) and rate (n - 1) / s.
    Each log-normal takes the mean and standard deviation of the logs.
"""

import argparse
import bisect
import csv
import math
import os
import random
import statistics

GAP_S = 3.0  # inter-arrival gap that separates two bursts
Z90 = 1.2815515655446004  # standard normal 90% quantile


def parse_ts(s):
    """'YYYY-MM-DD HH:MM:SS[.fffffff]' -> seconds (days since a fixed epoch)."""
    date, _, clock = s.strip().partition(" ")
    y, mo, d = (int(x) for x in date.split("-"))
    hh, mm, rest = clock.split(":")
    sec, _, frac = rest.partition(".")
    # days from civil (proleptic Gregorian), as in trace.cc
    y2 = y - (mo <= 2)
    era = y2 // 400
    yoe = y2 - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    t = days * 86400 + int(hh) * 3600 + int(mm) * 60 + int(sec)
    return t + (int(frac) / 10 ** len(frac) if frac else 0.0)


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    reqs = sorted((parse_ts(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                  for r in rows)
    t0 = reqs[0][0]
    return [(t - t0, c, o) for t, c, o in reqs]


def pct(sorted_vals, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_vals:
        return 0.0
    h = (len(sorted_vals) - 1) * q
    i = int(math.floor(h))
    j = min(i + 1, len(sorted_vals) - 1)
    return sorted_vals[i] + (h - i) * (sorted_vals[j] - sorted_vals[i])


def arrival_stats(arrivals, duration=None):
    """Rate, inter-arrival CV/p50, per-minute p50/p90, share of empty seconds."""
    a = sorted(arrivals)
    span = a[-1] - a[0] if len(a) > 1 else 0.0
    ia = [a[i + 1] - a[i] for i in range(len(a) - 1)]
    mean = statistics.fmean(ia) if ia else 0.0
    cv = statistics.pstdev(ia) / mean if len(ia) > 1 and mean > 0 else 0.0
    horizon = duration if duration is not None else a[-1] + 1e-9
    minutes = [0] * max(1, int(math.ceil(horizon / 60.0)))
    seconds = [0] * max(1, int(math.ceil(horizon)))
    for t in a:
        minutes[min(int(t // 60), len(minutes) - 1)] += 1
        seconds[min(int(t), len(seconds) - 1)] += 1
    pm = sorted(minutes)
    return {
        "rate": len(a) / span if span > 0 else 0.0,
        "ia_cv": cv,
        "ia_p50": pct(sorted(ia), 0.5),
        "min_p50": pct(pm, 0.5),
        "min_p90": pct(pm, 0.9),
        "empty_s": sum(1 for c in seconds if c == 0) / len(seconds),
    }


def lognormal_fit(values):
    logs = [math.log(v) for v in values]
    return statistics.fmean(logs), statistics.pstdev(logs)


def fit(reqs):
    arrivals = [r[0] for r in reqs]
    ctx = sorted(r[1] for r in reqs)
    out = sorted(r[2] for r in reqs)
    span = arrivals[-1] - arrivals[0]
    m = {
        "mean_rate_per_s": len(arrivals) / span,
        "context_median": pct(ctx, 0.5),
        "context_p90": pct(ctx, 0.9),
        "context_min": ctx[0],
        "context_max": ctx[-1],
        "output_median": pct(out, 0.5),
        "output_p90": pct(out, 0.9),
        "output_min": out[0],
        "output_max": out[-1],
    }
    bursts, cur, offs = [], [arrivals[0]], []
    for prev, t in zip(arrivals, arrivals[1:]):
        if t - prev > GAP_S:
            bursts.append(cur)
            offs.append(t - prev)
            cur = [t]
        else:
            cur.append(t)
    bursts.append(cur)
    ons, rates = [], []
    for b in bursts:
        n, s = len(b), b[-1] - b[0]
        if n >= 2 and s > 0:
            ons.append(s * n / (n - 1))
            rates.append((n - 1) / s)
    m["off_log_mu"], m["off_log_sigma"] = lognormal_fit(offs)
    m["on_log_mu"], m["on_log_sigma"] = lognormal_fit(ons)
    m["burst_rate_log_mu"], m["burst_rate_log_sigma"] = lognormal_fit(rates)
    m["_bursts"] = len(bursts)
    return m


def generate(m, duration, rng):
    """Python twin of GenerateBuiltInWorkload (arrival times only)."""
    on_mean = math.exp(m["on_log_mu"] + m["on_log_sigma"] ** 2 / 2)
    off_mean = math.exp(m["off_log_mu"] + m["off_log_sigma"] ** 2 / 2)
    on = rng.random() < on_mean / (on_mean + off_mean)
    t, segs = 0.0, []
    while t < duration:
        if on:
            d = math.exp(rng.gauss(m["on_log_mu"], m["on_log_sigma"]))
            lam = math.exp(rng.gauss(m["burst_rate_log_mu"], m["burst_rate_log_sigma"]))
            segs.append((t, min(t + d, duration), lam))
        else:
            d = math.exp(rng.gauss(m["off_log_mu"], m["off_log_sigma"]))
        t += d
        on = not on
    total = sum((e - s) * lam for s, e, lam in segs)
    if total <= 0:
        return []
    scale = m["mean_rate_per_s"] * duration / total
    out = []
    for s, e, lam in segs:
        x = s
        while True:
            x += rng.expovariate(lam * scale)
            if x >= e:
                break
            out.append(x)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "shared", "traces", "azure_llm_code_2023.csv")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=default)
    ap.add_argument("--windows", type=int, default=200, help="60-minute windows to simulate")
    args = ap.parse_args()

    reqs = load(args.trace)
    m = fit(reqs)
    tr = arrival_stats([r[0] for r in reqs])
    print(f"trace: {args.trace}")
    print(f"  requests {len(reqs)}, span {reqs[-1][0]:.1f} s, bursts (gap > {GAP_S} s) {m['_bursts']}")
    ctx = sorted(r[1] for r in reqs)
    out = sorted(r[2] for r in reqs)
    print(f"  context p50 {pct(ctx, .5):.1f} p90 {pct(ctx, .9):.1f} p99 {pct(ctx, .99):.1f} "
          f"mean {statistics.fmean(ctx):.1f} min {ctx[0]} max {ctx[-1]}")
    print(f"  output  p50 {pct(out, .5):.1f} p90 {pct(out, .9):.1f} p99 {pct(out, .99):.1f} "
          f"mean {statistics.fmean(out):.1f} min {out[0]} max {out[-1]}")

    print("\nfitted BuiltInWorkloadModel defaults:")
    for k, v in m.items():
        if not k.startswith("_"):
            print(f"  {k} = {v:.6g}")
    on_mean = math.exp(m["on_log_mu"] + m["on_log_sigma"] ** 2 / 2)
    off_mean = math.exp(m["off_log_mu"] + m["off_log_sigma"] ** 2 / 2)
    print(f"  (mean ON {on_mean:.2f} s, mean OFF {off_mean:.2f} s, ON share "
          f"{on_mean / (on_mean + off_mean):.3f}, burst rate median "
          f"{math.exp(m['burst_rate_log_mu']):.2f}/s)")

    rng = random.Random(1)
    sims = [arrival_stats(generate(m, 3600.0, rng), 3600.0) for _ in range(args.windows)]
    cr, cs, co = random.Random(2), [], []
    for _ in range(20000):
        c = math.exp(cr.gauss(math.log(m["context_median"]), math.log(m["context_p90"] / m["context_median"]) / Z90))
        o = math.exp(cr.gauss(math.log(m["output_median"]), math.log(m["output_p90"] / m["output_median"]) / Z90))
        cs.append(min(max(round(c), m["context_min"]), m["context_max"]))
        co.append(min(max(round(o), m["output_min"]), m["output_max"]))
    cs.sort()
    co.sort()
    print(f"\nmodel vs trace ({args.windows} simulated 60-minute windows: median [p10, p90]):")
    for key, label in [("rate", "mean rate (req/s)"), ("ia_cv", "inter-arrival CV"),
                       ("ia_p50", "inter-arrival p50 (s)"), ("min_p50", "requests/minute p50"),
                       ("min_p90", "requests/minute p90"), ("empty_s", "share of empty seconds")]:
        vals = sorted(s[key] for s in sims)
        print(f"  {label:24s} trace {tr[key]:8.3f}   model {pct(vals, .5):8.3f} "
              f"[{pct(vals, .1):.3f}, {pct(vals, .9):.3f}]")
    print(f"  {'context p50 / p90':24s} trace {pct(ctx, .5):.0f} / {pct(ctx, .9):.0f}   "
          f"model {pct(cs, .5):.0f} / {pct(cs, .9):.0f}  (mean {statistics.fmean(ctx):.0f} vs "
          f"{statistics.fmean(cs):.0f})")
    print(f"  {'output p50 / p90':24s} trace {pct(out, .5):.0f} / {pct(out, .9):.0f}   "
          f"model {pct(co, .5):.0f} / {pct(co, .9):.0f}  (mean {statistics.fmean(out):.1f} vs "
          f"{statistics.fmean(co):.1f})")


if __name__ == "__main__":
    main()
