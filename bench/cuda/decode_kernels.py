#!/usr/bin/env python3
"""Where one decode step's GPU time goes, kernel by kernel, from Nsight Compute's CSV.

Run lode bench under ncu with one metric, then read the last complete step:

  ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \\
      build/lode bench -m m.gguf -p 16 -n 2 -d 0 -r 1 > ncu.csv
  bench/cuda/decode_kernels.py ncu.csv

A step ends with the lm head, the product with the most blocks; the last two such launches
bound the last step. Kernels are grouped by name and launch shape (grid, block), so the same
kernel on matrices of different sizes gets a row each. Times are each kernel run alone (ncu
serialises them); a graph-launched step overlaps some of them, so the sum is an upper bound.
"""
import collections
import csv
import re
import sys


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if line.startswith('"')))


def blocks(grid):
    numbers = [int(n) for n in re.findall(r"\d+", grid)]
    product = 1
    for n in numbers:
        product *= n
    return product


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: decode_kernels.py NCU_CSV")
    rows = [r for r in rows_of(sys.argv[1]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if not rows:
        sys.exit("no gpu__time_duration.sum rows in that file: was it written with --csv --metrics gpu__time_duration.sum?")
    widest = max(blocks(r["Grid Size"]) for r in rows if "matvec" in r["Kernel Name"])
    heads = [i for i, r in enumerate(rows) if "matvec" in r["Kernel Name"] and blocks(r["Grid Size"]) == widest]
    if len(heads) < 2:
        sys.exit("fewer than two lm-head launches: run at least two decode steps (-n 2)")
    step = rows[heads[-2] + 1:heads[-1] + 1]
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for r in step:
        name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "").split("::")[-1]
        key = (name, r["Grid Size"], r["Block Size"])
        by_kernel[key][0] += 1
        by_kernel[key][1] += float(r["Metric Value"].replace(",", "")) / 1000.0  # ns -> us
    total = sum(us for _, us in by_kernel.values())
    print(f"one decode step: {len(step)} kernels, {total:.1f} us in all (each run alone)\n")
    print("| kernel | grid | block | launches | us each | us in all | share |")
    print("|---|---|---|---|---|---|---|")
    for (name, grid, block), (count, us) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {grid} | {block} | {count} | {us / count:.2f} | {us:.1f} | {100 * us / total:.1f}% |")


if __name__ == "__main__":
    main()
