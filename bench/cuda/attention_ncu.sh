#!/usr/bin/env bash
# Decode attention alone, per K/V format, at one depth (docs/KV.md): Nsight Compute times the first
# two layers' decode attention launches (the tensor-core or the float32 kernel, and the merge) of a
# decode step at that depth (reached with --fill random), with registers, achieved occupancy and
# DRAM throughput. Run from the repository root on the GPU machine with the build carried; results
# under ${OUT:-attn}.
#
#   bench/cuda/attention_ncu.sh MODEL [LODE_BINARY] [DEPTH] [FORMATS...]
set -uo pipefail
model=$1
lode=${2:-build/lode}
depth=${3:-250000}
shift $(($# < 3 ? $# : 3))
formats=("$@")
[ ${#formats[@]} -eq 0 ] && formats=(fp16 q4)
out=${OUT:-attn}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
ncu=/usr/local/cuda/bin/ncu
metrics=gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
for f in "${formats[@]}"; do
  name=$(basename "$lode")_${f}_$depth
  timeout 150 "$ncu" --clock-control none --csv --kernel-name regex:'attention_(decode|merge)' --launch-count 4 \
    --metrics "$metrics" "$lode" bench -m "$model" --kv "$f" -p 16 -d "$depth" --fill random --ctx 262144 -n 2 -r 1 \
    >"$out/$name.csv" 2>"$out/$name.err"
  echo "== $name (exit $?)"
  python3 - "$out/$name.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no rows")
head = rows[0]; ki, mi, vi, ui = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
for r in rows[1:]:
    print(f"  {r[head.index('ID')]:>3} {r[ki].split('(')[0][-32:]:32} {r[mi]:55} {r[vi]:>12} {r[ui]}")
PY
done
