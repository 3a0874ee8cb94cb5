#!/usr/bin/env bash
# One call on the GPU machine for the K/V cache formats (docs/KV.md): optionally the GPU tests, then
# `lode bench` per format on the 35B-A3B geometry (ud-q4_k_xl-like): an 8K prompt, and decode at
# depths 0 to 250,000 in a 262,144-position context (depths reached with random cells: --fill
# random). Run it from the repository root with the build carried (build/lode, build/lode_tests,
# build/runtime-libs); results go under ${OUT:-kv-check}. Formats that would start after BUDGET
# seconds (default 540) are left for the next call, which reuses the model while the machine is warm.
#
#   bench/cuda/kv_check.sh tests                 # GPU tests, then every format
#   bench/cuda/kv_check.sh q4 k8v4               # just these formats
set -uo pipefail
out=${OUT:-kv-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
model=${TMPDIR:-/tmp}/m35.gguf
budget=${BUDGET:-540}
if [ ! -s "$model" ]; then
  build/lode synth -o "$model.part" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl >"$out/synth.txt" 2>&1 &&
    mv "$model.part" "$model" &
fi
if [ "${1:-}" = tests ]; then
  shift
  timeout 330 build/lode_tests --gtest_filter='CudaKv.*:CudaMatvec.*:CudaForward.*:CudaVram.*:GpuProbe.*:Cli*:LodeMini.*' \
    >"$out/tests.txt" 2>&1
  echo "GPU tests: exit $? after ${SECONDS}s"
  grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|actual|differs|\[ cuda \].*(format|attention)" "$out/tests.txt" |
    cut -c1-220 | head -60
fi
wait
formats=("$@")
[ ${#formats[@]} -eq 0 ] && formats=(fp16 fp32 int8 k8v32 k32v8 q4 k8v4 q4-unrotated)
for f in "${formats[@]}"; do
  if [ $SECONDS -gt "$budget" ]; then echo "not run (time): $f"; continue; fi
  timeout 150 build/lode bench -m "$model" --kv "$f" -p 8192 -d 0,4096,32768,131072,250000 --fill random \
    --ctx 262144 -n 64 -r 2 >"$out/bench_$f.txt" 2>&1
  echo "== $f (exit $?, ${SECONDS}s)"
  grep -E "^(pp|tg|peak)|K/V|error|lode:" "$out/bench_$f.txt" | cut -c1-200
done
