#!/usr/bin/env bash
# One call on the GPU machine for the expert tier (docs/EXPERTS.md): optionally the GPU tests, then
# `lode bench` of the 35B-A3B ud-q4_k_xl-like synth, uniform routing and --route-skew 1, fp16 K/V,
# a 32768-position context, under each VRAM budget. Run it from the repository root with the
# build carried (build/lode, build/lode_tests, build/runtime-libs); results go under
# ${OUT:-experts-check}. Models are written to ${MODELS:-/tmp} once per machine.
#
#   bench/cuda/experts_check.sh tests                    # GPU tests, then the budgets below
#   BUDGETS=24576,12288,4096 bench/cuda/experts_check.sh  # just these budgets (MiB)
#   SKEW=0 bench/cuda/experts_check.sh                   # uniform routing only
set -uo pipefail
out=${OUT:-experts-check}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
models=${MODELS:-/tmp}
budgets=${BUDGETS:-24576,16384,12288,8192,4096}
synth() {  # name, extra synth flags
  [ -s "$models/$1.gguf" ] && return
  build/lode synth -o "$models/$1.gguf.part" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl "${@:2}" \
    >"$out/synth_$1.txt" 2>&1 && mv "$models/$1.gguf.part" "$models/$1.gguf"
}
synth m35 &
[ "${SKEW:-1}" = 1 ] && synth m35-skew --route-skew 1 &
if [ "${1:-}" = tests ]; then
  LODE_REQUIRE_GPU=1 timeout 400 build/lode_tests \
    --gtest_filter='CudaExperts.*:CudaForward.*:CudaKv.*:CudaMatvec.*:CudaVram.*:GpuProbe.*:Cli*:LodeMini.*' \
    >"$out/tests.txt" 2>&1
  echo "GPU tests: exit $? after ${SECONDS}s"
  grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is|actual|\[ cuda \].*(experts|VRAM|budget)" "$out/tests.txt" |
    cut -c1-240 | head -60
fi
wait
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 300 >"$out/smi.txt" 2>/dev/null &
smi=$!
for m in m35 m35-skew; do
  [ -s "$models/$m.gguf" ] || continue
  timeout "${BENCH_TIMEOUT:-280}" build/lode bench -m "$models/$m.gguf" --kv fp16 --ctx 32768 -p "${PROMPTS:-8192}" \
    -n "${GENERATE:-128}" -r "${REPEATS:-2}" --vram-budget "$budgets" >"$out/bench_$m.txt" 2>&1
  echo "== $m (exit $?, ${SECONDS}s)"
  grep -E "^(pp|tg|peak|VRAM plan|experts in)|error" "$out/bench_$m.txt" | cut -c1-260
done
kill "$smi" 2>/dev/null
echo "nvidia-smi peak used MiB: $(sort -n "$out/smi.txt" | tail -1)"
