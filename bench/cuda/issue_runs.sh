#!/usr/bin/env bash
# The GPU runs the open issues wait for (17 to 19; 20's need several GPUs: bench/cuda/gpu_check.sh
# and tests/test_cuda_pipeline.cpp there), one device call per part, each ending inside the call's
# 600 s. In the repository root of the GPU machine, with build/device carried (bench/cuda/pack.sh;
# NODE=1 for `served`); results under $OUT (at most 8 files come back).
#
#   bench/cuda/issue_runs.sh suite     # every test with LODE_REQUIRE_GPU=1, in 4 shards at once
#   bench/cuda/issue_runs.sh floors    # lode bench on the 35B synth: the issues' floors, one file each
#   bench/cuda/issue_runs.sh served    # lode serve + tools/load: prompts one a step against 4,096 tokens a step
#
# Each part prints the lines to read; the files hold the rest.
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/cuda/unpack.sh || { echo "issue_runs: could not unpack build/device/pack.tar.xz"; exit 1; }
out=${OUT:-issue-runs}
mkdir -p "$out"
models=${TMPDIR:-/tmp}
m35=$models/m35t.gguf
synth_35b() {  # lode-mini's tokenizer embedded: the server's requests need one
  [ -f "$m35" ] || build/lode synth -o "$m35" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl \
    --tokenizer tools/mini/tokenizer.json >/dev/null
}

suite() {
  local shards=${SHARDS:-4} limit=${LIMIT:-540}
  for i in $(seq 0 $((shards - 1))); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i LODE_REQUIRE_GPU=1 timeout "$limit" \
      build/lode_tests --gtest_filter="${FILTER:-*}" >"$out/suite_$i.txt" 2>&1 &
  done
  wait
  grep -hE "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \]" "$out"/suite_*.txt | sort | uniq -c
  grep -L "tests ran" "$out"/suite_*.txt | sed 's/^/did not finish: /'
}

floors() {
  synth_35b
  local b="timeout 170 build/lode bench -m $m35"
  # Issue 17: tg128 at depth 0 (>= 600), and at depth 131,072 each K/V format against fp16.
  $b -p 512 -n 128 -r 3 >"$out/depth0.txt" 2>&1
  for kv in fp16 int8 k8v4; do
    $b --kv $kv --ctx 262144 --fill random -d 131072 -p 16 -n 64 -r 2 2>&1 | grep -E "^tg|ceilings" | sed "s/^/$kv: /"
  done >"$out/depth131072.txt"
  # Issue 18: steps of 16 and 64 sequences (4x and 8x one's), prompts read together.
  $b -p 256 -n 32 -r 2 --ctx 4096 --sequences 16,64 --prompts-together 4,16 >"$out/rows.txt" 2>&1
  # Issue 19: verify windows at full VRAM (<= 1.3 steps) and under 12 GiB (<= 1.15).
  $b -p 256 -n 32 -r 2 --ctx 4096 --window 2,3,4 --vram-budget 0,12288 >"$out/windows.txt" 2>&1
  grep -hE "^(pp|tg|window|[0-9]+ (sequences|prompts))|ceilings|budget" "$out"/depth0.txt "$out"/depth131072.txt \
    "$out"/rows.txt "$out"/windows.txt
  # Issue 19: lode-mini with and without MTP (>= 1.2x), greedy, the run log's speed lines.
  for mtp in 0 2; do
    timeout 60 build/lode run -m models/lode-mini.gguf --backend cuda -p "The ls command" --temp 0 -n 512 \
      --mtp $mtp 2>&1 | grep -iE "tok/s|window|accept" | sed "s/^/mini --mtp $mtp: /"
  done | tee "$out/mini_mtp.txt"
  # Sampling from the device's top candidates against greedy on the 35B (one sequence).
  for temp in 0 0.7; do
    timeout 90 build/lode run -m "$m35" --backend cuda -p "The ls command" --temp $temp -n 256 --ignore-eos 2>&1 |
      grep -iE "tok/s" | sed "s/^/35B --temp $temp: /"
  done | tee -a "$out/mini_mtp.txt"
}

served() {
  command -v node >/dev/null || { echo "served: no node (pack with NODE=1)"; return 1; }
  synth_35b
  for pt in 0 4096; do  # (greedy streams; then, with 4,096, sampled ones: top candidates on the device)
    build/lode serve -m "$m35" --backend cuda --parallel 64 --ctx 4096 --prompt-tokens $pt --port 8090 \
      >"$out/serve_$pt.log" 2>&1 &
    local server=$!
    for _ in $(seq 120); do curl -sf localhost:8090/health >/dev/null && break; sleep 1; done
    local runs=("16 0" "64 0")
    [ $pt = 4096 ] && runs+=("64 0.7")
    for run in "${runs[@]}"; do
      read -r c temp <<<"$run"
      echo "--prompt-tokens $pt, concurrency $c, temperature $temp: $(timeout 100 node tools/load/load.mjs \
        --url http://127.0.0.1:8090 --concurrency $c --requests $((4 * c)) --prompt-words 200 --max-tokens 128 \
        --shared-prefix 0.5 --temperature $temp --json)"
    done
    curl -s localhost:8090/v1/status | head -c 2000
    echo
    kill $server
    wait $server 2>/dev/null
  done | tee "$out/served.txt"
}

case "${1:-}" in
  suite | floors | served) "$1" ;;
  *) echo "usage: bench/cuda/issue_runs.sh suite|floors|served" >&2; exit 2 ;;
esac
