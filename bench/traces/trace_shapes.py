#!/usr/bin/env python3
"""Writes traces in the Azure LLM format (TIMESTAMP,ContextTokens,GeneratedTokens)
whose shapes differ from the shared code trace, for checking that a replay
result is not specific to that one trace.

  bench/traces/trace_shapes.py OUT_DIR [--azure FILE]

Shapes (seeded, so every run writes the same files):
  conv.csv     conversation-like: contexts lognormal (median 1,000, capped at
               7,000), outputs lognormal (median 230), arrivals a sinusoid
               with a 5-minute period
  conv2.csv    the Azure 2023 conversation trace's published medians:
               contexts median 1,020, outputs median 129 (lognormal)
  bursty.csv   short prompts and outputs, 30 s bursts every 90 s
  longout.csv  short contexts with long outputs (100-1,500 / 150-350 tokens)
  chat.csv     the --azure trace's arrivals and contexts, its outputs
               resampled from a lognormal with median 181 (needs --azure)
"""
import argparse
import csv
import math
import os
import random


def stamp(t):
    ms = int(t * 1000)
    return "2023-11-16 %02d:%02d:%02d.%03d0000" % (18 + ms // 3600000, ms // 60000 % 60, ms // 1000 % 60, ms % 1000)


def write_generated(path, seed, draw, span_s=3500):
    rnd = random.Random(seed)
    t = 0.0
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        while t < span_s:
            gap, context, output = draw(rnd, t)
            t += gap
            f.write("%s,%d,%d\n" % (stamp(t), context, output))


def conv(rnd, t):
    rate = 2.0 * (1 + 0.6 * math.sin(2 * math.pi * t / 300))
    return (rnd.expovariate(rate), max(1, min(7000, int(rnd.lognormvariate(math.log(1000), 0.8)))),
            max(1, min(2000, int(rnd.lognormvariate(math.log(230), 0.7)))))


def conv2(rnd, t):
    rate = 2.0 * (1 + 0.5 * math.sin(2 * math.pi * t / 600))
    return (rnd.expovariate(rate), max(1, min(16000, int(rnd.lognormvariate(math.log(1020), 0.65)))),
            max(1, min(4000, int(rnd.lognormvariate(math.log(129), 1.0)))))


def bursty(rnd, t):
    rate = 6.0 if (t % 90) < 30 else 0.5
    return rnd.expovariate(rate), rnd.randint(50, 500), rnd.randint(20, 100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--azure", help="an Azure-format trace to derive chat.csv from")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    write_generated(os.path.join(a.out_dir, "conv.csv"), 7, conv)
    write_generated(os.path.join(a.out_dir, "conv2.csv"), 11, conv2)
    write_generated(os.path.join(a.out_dir, "bursty.csv"), 7, bursty)
    rnd = random.Random(5)
    t = 0.0
    with open(os.path.join(a.out_dir, "longout.csv"), "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for _ in range(4000):
            t += rnd.expovariate(2.0)
            f.write("%s,%d,%d\n" % (stamp(t), rnd.randint(100, 1500), rnd.randint(150, 350)))
    if a.azure:
        rnd = random.Random(3)
        with open(a.azure) as src, open(os.path.join(a.out_dir, "chat.csv"), "w") as f:
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
            for row in csv.DictReader(src):
                out = max(1, min(2000, int(rnd.lognormvariate(math.log(181), 0.8))))
                f.write("%s,%s,%d\n" % (row["TIMESTAMP"], row["ContextTokens"], out))
    print("wrote", ", ".join(sorted(os.listdir(a.out_dir))), "in", a.out_dir)


if __name__ == "__main__":
    main()
