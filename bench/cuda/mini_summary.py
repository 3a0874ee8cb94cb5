#!/usr/bin/env python3
"""Summarises bench/cuda/issue_runs.sh mini's lines: for each build and --mtp N, the held-out
slices' decode tokens/s (median and range over slices and rounds) and floors' prompt's, each against
the same build's --mtp 0, with the drafts accepted and the ms per verify step (issue 19's lode-mini
line asks 1.2x at lode-mini's own acceptance).

    python3 bench/cuda/mini_summary.py issue-runs/mini.txt
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"^(?P<build>\S+) --mtp (?P<n>\d+) (?P<label>.+?): (?P<rest>.*)$")
SPEED = re.compile(r"generated: \d+ tokens in [\d.]+ s \(([\d.]+) tok/s\)")
ACCEPTED = re.compile(r"MTP: (\d+) of (\d+) drafts accepted")
STEP = re.compile(r"verify step of ([\d.]+) ms")


def read(path):
    runs = defaultdict(list)  # (build, n, held-out or prompt) -> [(tok/s, accepted, drafted, ms)]
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            speed = SPEED.search(line) if m else None
            if not speed:
                continue
            kind = "prompt" if "prompt" in m["label"] else "held-out"
            accepted = ACCEPTED.search(line)
            step = STEP.search(line)
            runs[(m["build"], int(m["n"]), kind)].append(
                (float(speed[1]), int(accepted[1]) if accepted else 0, int(accepted[2]) if accepted else 0,
                 float(step[1]) if step else None))
    return runs


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    runs = read(sys.argv[1])
    if not runs:
        sys.exit(f"mini_summary: no run lines in {sys.argv[1]}")
    print("| build | --mtp | text | decode tok/s, median (range) | against --mtp 0 | drafts accepted | ms a verify step |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for (build, n, kind), rows in sorted(runs.items()):
        speeds = [r[0] for r in rows]
        median = statistics.median(speeds)
        base = runs.get((build, 0, kind))
        ratio = f"{median / statistics.median(r[0] for r in base):.2f}x" if base and n > 0 else ""
        accepted, drafted = sum(r[1] for r in rows), sum(r[2] for r in rows)
        share = f"{accepted} of {drafted} ({100.0 * accepted / drafted:.1f}%)" if drafted else ""
        steps = [r[3] for r in rows if r[3] is not None]
        ms = f"{min(steps):.3f}-{max(steps):.3f}" if steps else ""
        print(f"| {build} | {n} | {kind} | {median:,.1f} ({min(speeds):,.1f}-{max(speeds):,.1f}) | {ratio} | {share} | {ms} |")


if __name__ == "__main__":
    main()
