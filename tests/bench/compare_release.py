#!/usr/bin/env python3
"""The table of tests/bench/compare_release.sh.

    compare_release.py RESULTS_DIR RELEASE

RESULTS_DIR holds BENCH-SIDE-ROUND.txt, the stdout of bench_e2e (BENCH
e2e) and bench_pipeline (pipeline) of the release (SIDE release) and of
this tree (new). For every figure both print: the median over the rounds
of each side, new/old of the medians, and each side's spread (max - min
over the median). Then per benchmark and unit the geometric mean of the
ratios. Figures marked "lower" are better when smaller; a figure missing
from some run is listed, not compared. Exits 1 when no figure of a
benchmark could be parsed (its output format changed).
"""
import collections
import math
import os
import re
import statistics
import sys

NUM = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"


def num(s):
    return float(s.replace(",", ""))


def parse_e2e(text):
    """The table's rows: records/s, first s, CPU s/GB, pipe us/rec."""
    out = {}
    rows = False
    for line in text.splitlines():
        if line.startswith("  configuration"):
            rows = True
            continue
        if rows and not line.strip():
            break
        if not rows:
            continue
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) != 8:
            continue
        name, rps, _, _, first, _, cpu, pipe = cols
        out[("records/s", name)] = num(rps)
        for unit, v in (("first s", first), ("CPU s/GB", cpu),
                        ("pipe us/rec", pipe)):
            if v != "-":
                out[(unit, name)] = num(v)
    return out


def parse_pipeline(text):
    """Every figure row (GB/s, img/s) under its section, and the per-image
    time with stage timers on."""
    out = {}
    section = ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            m = re.match(r"note: (.*), " + NUM + r" us/image with stage", line)
            if m:
                out[("us/image", m.group(1) + ", stage timers on")] = \
                    num(m.group(2))
            elif ":" not in line and not line.startswith("figure"):
                section = line.strip()
            continue
        m = re.match(r"^  (\S.*?)\s+" + NUM + r" (\S+/s)\s", line)
        if m:
            out[(m.group(3), f"{section}: {m.group(1)}")] = num(m.group(2))
    return out


LOWER = {"first s", "CPU s/GB", "pipe us/rec", "us/image"}
PARSERS = {"e2e": parse_e2e, "pipeline": parse_pipeline}


def spread(v):
    m = statistics.median(v)
    return (max(v) - min(v)) / m * 100 if m else 0.0


def fmt(v):
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    d, release = argv[1], argv[2]
    runs = collections.defaultdict(list)  # (bench, side) -> [figures]
    cpus = collections.defaultdict(list)  # bench_pipeline's CPU share
    for f in sorted(os.listdir(d)):
        m = re.fullmatch(r"(e2e|pipeline)-(release|new)-(\d+)\.txt", f)
        if m:
            with open(os.path.join(d, f)) as fh:
                text = fh.read()
            runs[(m.group(1), m.group(2))].append(PARSERS[m.group(1)](text))
            c = re.search(r"threads got (\d+)% of their wall time", text)
            if c:
                cpus[(m.group(1), m.group(2))].append(int(c.group(1)))
    status = 0
    for bench in ("e2e", "pipeline"):
        old, new = runs.get((bench, "release")), runs.get((bench, "new"))
        if not old or not new:
            continue
        keys = [k for k in old[0] if all(k in r for r in old + new)]
        lost = sorted(set().union(*old, *new) - set(keys))
        print(f"bench_{bench}: medians of {len(old)} runs of the release "
              f"{release} (old) and {len(new)} of this tree (new), "
              f"run alternately")
        print(f"  {'unit':<11} {'figure':<58} {'old':>11} {'new':>11} "
              f"{'new/old':>7}  spread old, new")
        ratios = collections.defaultdict(list)
        for unit, name in keys:
            o = [r[(unit, name)] for r in old]
            n = [r[(unit, name)] for r in new]
            mo, mn = statistics.median(o), statistics.median(n)
            ratio = mn / mo if mo else float("nan")
            if mo and mn:
                ratios[unit].append(ratio)
            low = " (lower)" if unit in LOWER else ""
            print(f"  {unit:<11} {name[:58]:<58} {fmt(mo):>11} {fmt(mn):>11} "
                  f"{ratio:7.3f}  {spread(o):4.0f}%, {spread(n):4.0f}%{low}")
        for unit, v in ratios.items():
            g = math.exp(sum(math.log(x) for x in v) / len(v))
            print(f"  {unit}: new/old geometric mean {g:.3f} over {len(v)} "
                  f"figures (from {min(v):.3f} to {max(v):.3f})"
                  f"{', lower is better' if unit in LOWER else ''}")
        for unit, name in lost:
            print(f"  not in every run, not compared: {unit} {name}")
        if not keys:
            print(f"  no figure parsed from bench_{bench}'s output: has its "
                  f"format changed?")
            status = 1
        cpu = [c for side in ("release", "new")
               for c in cpus.get((bench, side), [])]
        if cpu:
            print(f"  the measuring threads got {min(cpu)}% to {max(cpu)}% "
                  f"of their wall time on a CPU (100%: a quiet machine)")
        print()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
