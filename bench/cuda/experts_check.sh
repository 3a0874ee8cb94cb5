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
#   MISS_PATHS="gpu cpu auto" bench/cuda/experts_check.sh # each budget with each --miss-path (default auto)
#   LODE=other/lode LABEL=other bench/cuda/experts_check.sh  # bench another build (rows labelled LABEL_...)
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
  # Each test in its own process (as ctest runs them), so one test's fault cannot fail the rest; a
  # test that hits an illegal memory access runs again under compute-sanitizer.
  # The host twin's kernels run on the GPU host's CPU too (AVX-512 there, AVX2 here).
  filter=${TESTS:-'CudaExperts.*:CudaForward.*:CudaKv.*:CudaMatvec.*:CudaVram.*:GpuProbe.*:Cli*:LodeMini.*:Q8Twin*:HostExperts.*:SpinPool.*'}
  build/lode_tests --gtest_list_tests --gtest_filter="$filter" |
    awk '/^[^ ]/{suite=$1} /^  /{print suite $1}' >"$out/test_names.txt"
  : >"$out/tests.txt"
  failed=0
  while read -r t; do
    LODE_REQUIRE_GPU=1 timeout 300 build/lode_tests --gtest_filter="$t" >"$out/one.txt" 2>&1
    rc=$?
    cat "$out/one.txt" >>"$out/tests.txt"
    if [ $rc -ne 0 ]; then
      failed=$((failed + 1))
      echo "FAILED $t (exit $rc)"
      grep -E "Failure|Expected|Which is|actual|exception" "$out/one.txt" | cut -c1-300 | head -8
      if grep -q "illegal memory access" "$out/one.txt" && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
        timeout 200 /usr/local/cuda/bin/compute-sanitizer --print-limit 5 build/lode_tests --gtest_filter="$t" \
          >"$out/sanitizer.txt" 2>&1
        grep -E "Invalid|at 0x|by thread|Address|=========     " "$out/sanitizer.txt" | head -20
      fi
    fi
  done <"$out/test_names.txt"
  echo "GPU tests: $(wc -l <"$out/test_names.txt") run, $failed failed, after ${SECONDS}s"
  grep -E "\[ cuda \].*(experts|budget)" "$out/tests.txt" | cut -c1-240 | head -20
fi
wait
# One bench per model and budget, each with its own nvidia-smi peak (the whole process, CUDA context
# and cuBLAS workspaces included: what a peer's figure at "equal VRAM" is compared with).
bench_one() {  # label, model, budget MiB, extra bench flags
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/smi_$1.txt" 2>/dev/null &
  local smi=$!
  timeout "${BENCH_TIMEOUT:-200}" "${LODE:-build/lode}" bench -m "$2" --kv "${KV:-fp16}" --ctx "${CTX:-32768}" -p "${PROMPTS:-8192}" \
    -n "${GENERATE:-128}" -r "${REPEATS:-2}" --vram-budget "$3" "${@:4}" >"$out/bench_$1.txt" 2>&1
  local rc=$?
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
  echo "== $1 (exit $rc, ${SECONDS}s, nvidia-smi peak $(sort -n "$out/smi_$1.txt" | tail -1) MiB)"
  grep -E "^(pp|tg|VRAM plan|decode misses)|error" "$out/bench_$1.txt" | cut -c1-400
}
models_to_run=${MODELS_TO_RUN:-m35 m35-skew}
for m in $models_to_run; do
  [ -s "$models/$m.gguf" ] || continue
  for b in ${budgets//,/ }; do
    for p in ${MISS_PATHS:-auto}; do bench_one "${LABEL:+${LABEL}_}${m}_${b}_$p" "$models/$m.gguf" "$b" --miss-path "$p"; done
  done
done
