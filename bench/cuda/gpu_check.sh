#!/usr/bin/env bash
# One call on the GPU machine: the GPU tests, decode speed of the 35B-A3B geometry, and where one
# decode step's time goes (docs/PERFORMANCE.md). Run it from the repository root with the build
# carried (build/lode, build/lode_tests, build/runtime-libs); results go under ${OUT:-gpu-check}.
#
#   bench/cuda/gpu_check.sh          # tests, decode at depth 0, per-kernel table
#   bench/cuda/gpu_check.sh table    # also the table for the ud-q4_k_xl-like and q8_0 models
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
models=${TMPDIR:-/tmp}
build/lode synth -o "$models/m35.gguf" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl >/dev/null 2>&1 &
synth=$!

LODE_REQUIRE_GPU=1 timeout 300 build/lode_tests \
  --gtest_filter='CudaExperts.*:CudaKv.*:CudaMatvec.*:CudaForward.*:CudaVram.*:GpuProbe.*:Cli*:LodeMini.*:KvQuality.*:Q8Twin*:HostExperts.*:SpinPool.*' \
  >"$out/tests.txt" 2>&1
echo "GPU tests: exit $?"
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|actual" "$out/tests.txt" | cut -c1-200 | head -30
wait "$synth"

timeout 120 build/lode bench -m "$models/m35.gguf" -p 16 -d 0 -n 128 -r 3 2>&1 | tee "$out/decode.txt" | grep tg
if [ "${1:-}" = table ]; then
  build/lode synth -o "$models/q8.gguf" --preset qwen3.6-35b-a3b --recipe q8_0 >/dev/null 2>&1
  for m in m35 q8; do
    timeout 200 build/lode bench -m "$models/$m.gguf" -p 512,8192 -d 0,8192,32768 -n 128 -r 3 >"$out/table_$m.txt" 2>&1
    cat "$out/table_$m.txt"
  done
fi
ncu=/usr/local/cuda/bin/ncu
if [ -x "$ncu" ]; then
  timeout 120 "$ncu" --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
    build/lode bench -m "$models/m35.gguf" -p 16 -n 2 -d 0 -r 1 >"$out/ncu.csv" 2>"$out/ncu.err"
  python3 bench/cuda/decode_kernels.py "$out/ncu.csv" | tee "$out/decode_kernels.md" | head -25
fi
