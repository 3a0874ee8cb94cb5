#!/usr/bin/env python3
"""Where a kernel's executed instructions go, from Nsight Compute's source counters.

Profile one launch with the SourceCounters section, then export its SASS with the counts:

  ncu --clock-control none --kernel-name regex:group_staged --launch-skip 3 --launch-count 1 \\
      --section SourceCounters -f -o rep build/bench_cuda_matvec "experts gate|up by group, 16 rows"
  ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
  bench/cuda/sass_counts.py src.csv [FIRST_LINE,...]

Counts are per launched warp (the first instruction runs once in every warp). Optional cut points
(0-based SASS line numbers, as the listing below prints them) split the kernel into parts, each
with its executed instructions and warp-stall samples; then the opcodes' totals and the hottest
instructions. An issue-bound kernel (docs/SERVER.md, "Where the group kernel's instructions go")
shows what its warps do besides the work: address arithmetic, branches, divisions.
"""
import collections
import csv
import sys


def rows_of(path):
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    header_at = next(i for i, row in enumerate(table) if "Source" in row and "Instructions Executed" in row)
    header = table[header_at]
    executed, source = header.index("Instructions Executed"), header.index("Source")
    stalls = header.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in header else None
    out = []
    for row in table[header_at + 1:]:
        if len(row) <= max(executed, source):
            continue
        text = row[source].strip()
        out.append((text, int(row[executed] or 0), int(row[stalls] or 0) if stalls is not None else 0))
    return out


def opcode(text):
    words = text.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def by_opcode(rows, column):
    """Column `column` of the rows (1: executions, 2: stall samples) summed by opcode."""
    totals = collections.Counter()
    for row in rows:
        totals[opcode(row[0])] += row[column]
    return totals


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = rows_of(sys.argv[1])
    if not rows or rows[0][1] == 0:
        sys.exit(f"{sys.argv[1]}: no executed instructions (was the SourceCounters section collected?)")
    warps = rows[0][1]
    executed = sum(e for _, e, _ in rows)
    samples = sum(s for _, _, s in rows) or 1
    print(f"{len(rows)} SASS instructions, {executed:,} executed by {warps:,} warps: {executed / warps:,.1f} a warp")
    cuts = [int(c) for c in sys.argv[2].split(",")] if len(sys.argv) > 2 else []
    bounds = [0] + cuts + [len(rows)]
    for begin, end in zip(bounds, bounds[1:]):
        part = rows[begin:end]
        e, s = sum(r[1] for r in part), sum(r[2] for r in part)
        print(f"  lines {begin:5d}-{end - 1:5d}: {e / warps:9.1f} a warp ({100 * e / executed:5.1f}%), "
              f"stall samples {100 * s / samples:5.1f}%")
    print("by opcode, a warp:")
    for name, e in by_opcode(rows, 1).most_common(20):
        print(f"  {name:10s} {e / warps:9.1f}  {100 * e / executed:5.1f}%")
    # Most executed, then most stalled on (an unrolled kernel executes every line a few times, so
    # the first list is flat there and the second says where its warps wait).
    for title, key in (("most executed", 1), ("most stalled on", 2)):
        print(f"{title} (line: executions a warp, stall samples, SASS):")
        hottest = sorted(range(len(rows)), key=lambda i: -rows[i][key])[:25]
        for i in sorted(hottest):
            text, e, s = rows[i]
            print(f"  {i:5d}: {e / warps:6.2f}  {s:5d}  {text[:70]}")
    print("stall samples by opcode:")
    for name, s in by_opcode(rows, 2).most_common(12):
        print(f"  {name:10s} {100 * s / samples:5.1f}%")


if __name__ == "__main__":
    main()
