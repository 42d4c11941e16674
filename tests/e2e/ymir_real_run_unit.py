#!/usr/bin/python3
"""Unit test of tools/ymir_real_run's arithmetic, without running sliced:
the Poisson arrivals are seeded and reproducible, the nearest-rank p99, the
per-mode summary (a job above its target beyond the noise is flagged, a
job that never completed leaves the averages undefined), and the spread of
the JCT ratios over several mixes (mean, sample sd, range) as printed.

usage: ymir_real_run_unit.py REPO_ROOT
"""

import contextlib
import importlib.machinery
import importlib.util
import io
import math
import os
import sys

REPO = sys.argv[1]
try:
    import grpc  # noqa: F401
except ImportError:
    print("SKIP: python3-grpcio is not installed")
    sys.exit(77)
path = os.path.join(REPO, "tools", "ymir_real_run")
loader = importlib.machinery.SourceFileLoader("ymir_real_run", path)
spec = importlib.util.spec_from_loader("ymir_real_run", loader)
rr = importlib.util.module_from_spec(spec)
loader.exec_module(rr)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


# Arrivals: the first at 0, increasing, the same for the same seed, other
# times for another seed; a zero gap puts every job at 0.
a1 = rr.arrivals(12, 1.5, 7)
check(a1[0] == 0.0 and all(x < y for x, y in zip(a1, a1[1:])), "arrivals start at 0 and increase: %s" % a1)
check(a1 == rr.arrivals(12, 1.5, 7), "arrivals are reproducible for one seed")
check(a1 != rr.arrivals(12, 1.5, 8), "another seed gives other arrivals")
check(rr.arrivals(3, 0, 1) == [0.0, 0.0, 0.0], "gap 0: all at once")

# Nearest-rank percentile.
check(rr.percentile([5, 1, 3, 2, 4], 99) == 5, "p99 of five values is the largest")
check(rr.percentile(list(range(1, 201)), 99) == 198, "p99 of 1..200 is 198")


def row(job, jct, loss, modes=("alone",), censored=0, decoupled=False):
    return {"job": job, "jct_s": jct, "loss": loss, "modes": list(modes), "censored": censored,
            "decoupled": decoupled}


targets = {"a": 0.40, "b": 0.30, "c": 0.50}
rows = [row("a", 4.0, 0.39, ("alone", "temporal")), row("b", 6.0, 0.30 * 1.05),
        row("c", 8.0, 0.50 * 1.2, ("spatial",), censored=1, decoupled=True)]
s = rr.summarize("ymir", rows, targets, 0.1)
check(s["avg_jct_s"] == 6.0, "average JCT: %s" % s["avg_jct_s"])
check(s["p99_jct_s"] == 8.0, "p99 JCT: %s" % s["p99_jct_s"])
check(abs(s["paired_fraction"] - 2 / 3) < 1e-12, "two of three jobs paired: %s" % s["paired_fraction"])
check(s["decoupled_jobs"] == 1 and s["censored_jobs"] == 1, "decoupled and censored counted")
check(s["worse_than_normal"] == ["c"], "only c is beyond the 10%% noise: %s" % s["worse_than_normal"])
unfinished = rr.summarize("srtf", rows[:2] + [row("c", None, None)], targets, 0.1)
check(math.isnan(unfinished["avg_jct_s"]), "a job without a JCT leaves the average undefined")
check(unfinished["worse_than_normal"] == ["c"], "a job without a final loss counts as worse")


# The spread over mixes: ratios to Ymir's average, mean, sample sd, range.
def summary(ymir, elastic, worse=()):
    return {"ymir": {"avg_jct_s": ymir, "worse_than_normal": list(worse)},
            "elastic": {"avg_jct_s": elastic, "worse_than_normal": []}}


runs = [{"seed": seed, "noise": 0.1, "targets": {}, "summary": s, "jobs": {}}
        for seed, s in [(1, summary(10.0, 12.0)), (2, summary(10.0, 14.0, ["x-3"])), (3, summary(5.0, 8.0))]]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rr.print_spread(runs)
text = out.getvalue()
print(text, end="")
lines = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines() if ln.split() and ln.split()[0] in ("ymir", "elastic")}
check(lines.get("elastic", [])[:3] == ["1.200", "1.400", "1.600"], "per-seed ratios: %s" % lines.get("elastic"))
check(lines.get("elastic", [])[3:] == ["1.400", "0.200", "1.200", "1.600"], "mean, sd, min, max: %s" % lines.get("elastic"))
check(lines.get("ymir", [])[3:5] == ["1.000", "0.000"], "ymir against itself: %s" % lines.get("ymir"))
check("x-3" in text, "a job worse than normal in any mix is named")

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("ymir_real_run_unit: all checks passed")
