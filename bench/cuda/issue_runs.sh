#!/usr/bin/env bash
# The GPU runs the open issues wait for (17 to 19; 20's need several GPUs: bench/cuda/gpu_check.sh
# and tests/test_cuda_pipeline.cpp there), one device call per part, each ending inside the call's
# 600 s. In the repository root of the GPU machine, with build/device carried (bench/cuda/pack.sh;
# NODE=1 for `served` and `stress`); results under $OUT (at most 8 files come back).
#
#   bench/cuda/issue_runs.sh suite     # every test with LODE_REQUIRE_GPU=1, in 4 shards at once
#       (FILTER='CudaRows.*:Engine*' LIMIT=240: some of them first, as the tests of code no GPU
#        has run yet; all of them passed on an H100 at stop 60)
#   bench/cuda/issue_runs.sh floors    # lode bench on the 35B synth: the issues' floors, one file each
#   bench/cuda/issue_runs.sh mini      # lode-mini with and without drafts on held-out text (BEFORE: another lode),
#       then its steps and verify windows kernel by kernel (lode bench --profile)
#   bench/cuda/issue_runs.sh sanitize  # racecheck and synccheck over the window and armed-draft tests (TESTS: others)
#   bench/cuda/issue_runs.sh prompts   # where a prompt of 256 tokens and passes of 4 and 8 of them go
#   bench/cuda/issue_runs.sh groupcode # the group and lm-head kernels' executed instructions, line by line
#   bench/cuda/issue_runs.sh tier      # the expert tier's steps of several rows: their GPU tests, then
#       windows under 12 GiB and steps of sequences under 16 GiB (BEFORE=path/to/another/lode: the
#       same runs with it, alternating; ROUNDS=2 rounds)
#   bench/cuda/issue_runs.sh drafts    # drafts of several sequences at once (issue 19): their GPU tests, then
#       lode bench --sequence-windows with drafting on lode-mini and the 35B synth with an MTP block, and
#       lode-mini served with --mtp-sequences 1 and 4 (bench/cuda/served_drafts.py: no Node needed)
#   bench/cuda/issue_runs.sh served    # lode serve + tools/load at 1 to 64 streams, --prompt-tokens 0 and 1024
#   bench/cuda/issue_runs.sh stress    # long prompts arriving, 10% disconnects, a 16 GiB budget
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
  [ -n "${SERVE_MODEL:-}" ] || [ -f "$m35" ] || build/lode synth -o "$m35" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl \
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
  grep -LE "tests? from .* ran\." "$out"/suite_*.txt | sed 's/^/did not finish: /'
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
  # Issue 19: lode-mini with and without MTP (>= 1.2x), greedy, the run log's speed lines (with
  # drafts: where a verify step's wall time goes, drafting / verifying / following).
  for mtp in 0 1 2 3; do
    timeout 60 build/lode run -m models/lode-mini.gguf --backend cuda -p "The ls command" --temp 0 -n 512 \
      --mtp $mtp 2>&1 | grep -iE "tok/s|window|accept" | sed "s/^/mini --mtp $mtp: /"
  done | tee "$out/mini_mtp.txt"
  # Sampling from the device's top candidates against greedy on the 35B (one sequence).
  for temp in 0 0.7; do
    timeout 90 build/lode run -m "$m35" --backend cuda -p "The ls command" --temp $temp -n 256 --ignore-eos 2>&1 |
      grep -iE "tok/s" | sed "s/^/35B --temp $temp: /"
  done | tee -a "$out/mini_mtp.txt"
}

# The CPU miss path in steps of several rows (docs/EXPERTS.md, "In a step of several rows"): the
# tests that compare such steps under a budget, each miss path, with one-token steps in VRAM; then
# verify windows under 12 GiB (issue 19: a window of 2 at most 1.15 one-token steps) and steps of
# 4 and 16 sequences under 16 GiB (issue 18), with BEFORE's build beside them when given.
tier() {
  synth_35b
  LODE_REQUIRE_GPU=1 timeout 200 build/lode_tests \
    --gtest_filter='CudaWindow.*:CudaRows.*:CudaExperts.*:CudaMtp.*:MissServer.*:HostExperts.*:MissSplit.*' \
    >"$out/tier_tests.txt" 2>&1
  grep -E "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \]" "$out/tier_tests.txt"
  local build
  for round in $(seq "${ROUNDS:-2}"); do
    for build in build/lode ${BEFORE:-}; do
      timeout 120 $build bench -m "$m35" --kv fp16 --ctx 4096 -p 256 -n 32 -r 2 --window 2,4 --vram-budget 12288 2>&1 |
        grep -E "^tg|^window|rror" | sed "s|^|$build, round $round: |"
      timeout 120 $build bench -m "$m35" --kv fp16 --ctx 4096 -p 256 -n 32 -r 2 --sequences 4,16 --vram-budget 16384 \
        2>&1 | grep -E "^tg|sequences @|rror" | sed "s|^|$build, round $round: |"
    done
  done | tee "$out/tier.txt"
}

# Drafts of several sequences at once (docs/MTP.md, "Drafts of several sequences in one step of the
# block"): the tests, then what a step of S sequences' windows and their drafts cost against steps
# of one token each, and lode-mini served with drafts for one sequence at a time and for four.
drafts() {
  local m=${TMPDIR:-/tmp}/m35mtp.gguf
  [ -f "$m" ] || build/lode synth -o "$m" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl --mtp \
    --tokenizer tools/mini/tokenizer.json >/dev/null &
  LODE_REQUIRE_GPU=1 timeout 200 build/lode_tests --gtest_filter='CudaMtp.*:ServerConcurrency.*:CliServe.Drafts*' \
    >"$out/drafts_tests.txt" 2>&1
  grep -E "^\[  (PASSED|FAILED) |tests? ran|^\[  FAILED  \]" "$out/drafts_tests.txt"
  wait
  for model in models/lode-mini.gguf "$m"; do
    timeout 120 build/lode bench -m "$model" --ctx 4096 -p 64 -n 16 -r 2 --sequences 1,4,16 --sequence-windows 2,3 2>&1 |
      grep -E "sequences|^tg|rror" | sed "s|^|$model: |"
  done | tee "$out/drafts_bench.txt"
  for args in "--mtp 0" "--mtp 2 --mtp-sequences 1" "--mtp 2 --mtp-sequences 4"; do
    SERVE_MODEL=models/lode-mini.gguf start_server --parallel 4 --ctx 2048 $args || return 1
    echo "$args: $(timeout 120 python3 bench/cuda/served_drafts.py http://127.0.0.1:8090 4 6 200)"
    status_line
    stop_server
  done 2>&1 | tee "$out/drafts_served.txt"
}

# Issue 19's lode-mini line: `lode run --mtp N` (N = 0 to 3) on 5 held-out slices of about 1,000
# characters (offsets 0, 11,000, ... 44,000 of tests/data/mini/heldout_sample.txt, 128 tokens each)
# and on floors' prompt (1,024 tokens), each a process; with BEFORE (another lode) the same runs
# with it, alternating, ROUNDS rounds (default 2); MTPS: other values of N. A line a run: its speed
# and MTP summary; then each build's medians against its --mtp 0 (bench/cuda/mini_summary.py).
mini() {
  local slices=${TMPDIR:-/tmp}/slices build n o round
  mkdir -p "$slices"
  for o in 0 11000 22000 33000 44000; do
    python3 -c "import sys; sys.stdout.write(open('tests/data/mini/heldout_sample.txt').read()[$o:$o + 1000])" \
      >"$slices/$o.txt"
  done
  mini_run() {  # build, --mtp, label, run's arguments...
    local b=$1 m=$2 label=$3
    shift 3
    echo "$b --mtp $m $label: $(timeout 60 "$b" run -m models/lode-mini.gguf --backend cuda --temp 0 --mtp "$m" "$@" \
      2>&1 >/dev/null | grep -E "^prompt:|rror" | sed 's/; seed.*//')"
  }
  for round in $(seq "${ROUNDS:-2}"); do
    for build in build/lode ${BEFORE:-}; do
      for n in ${MTPS:-0 1 2 3}; do
        for o in 0 11000 22000 33000 44000; do mini_run "$build" $n "slice $o" -f "$slices/$o.txt" -n 128 --ignore-eos; done
        mini_run "$build" $n "floors' prompt" -p "The ls command" -n 1024
      done
    done
  done | tee "$out/mini.txt"
  python3 bench/cuda/mini_summary.py "$out/mini.txt" | tee "$out/mini_summary.md"
  # Where lode-mini's one-token step and verify windows of 2 and 3 go, kernel by kernel (a step of
  # it is launch-bound: what a window adds is kernels on the chain).
  timeout 90 build/lode bench -m models/lode-mini.gguf --ctx 4096 -p 64 -n 16 -r 1 --window 2,3 --profile \
    >"$out/mini_profile.txt" 2>&1
  grep -E "^tg|^window" "$out/mini_profile.txt"
}

# compute-sanitizer's racecheck and synccheck over the window tests (the DeltaNet step kernel stages
# a window's inputs in shared memory and alternates its norm's halves by token: stop 84) and the
# armed drafts' test. TESTS: another gtest filter.
sanitize() {
  local tool t=${TESTS:-CudaWindow.RowsGetTheBitsOfOneTokenStepsOnLodeMini:CudaWindow.ACutWindowLeavesTheStateOfTheTokensItKeeps:CudaMtp.DraftsArmedInTheVerifyStepAreTheDraftsOfStepsOfTheirOwn}
  for tool in racecheck synccheck; do
    LODE_REQUIRE_GPU=1 timeout 250 /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --print-limit 10 \
      build/lode_tests --gtest_filter="$t" >"$out/sanitize_$tool.txt" 2>&1
    echo "$tool (exit $?): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/sanitize_$tool.txt" | tr '\n' ' ')"
  done
}

# Where a served prompt step goes: one prompt of 256 tokens, then passes of 4 and 8 of them
# together, phase by phase (lode bench --profile --prompts-together).
prompts() {
  synth_35b
  timeout 300 build/lode bench -m "$m35" -p 256 -n 4 -r 1 --ctx 4096 --prompts-together 4,8 --profile \
    >"$out/prompts.txt" 2>&1
  grep -E "^pp|prompts of" "$out/prompts.txt"
  sed -n '/-token prompt goes/,/^[^ ]/p; /prompts of .* in one pass go/,/^[^ ]/p' "$out/prompts.txt"
}

# Executed instructions and warp stalls, SASS line by SASS line (Nsight Compute's source counters,
# read by bench/cuda/sass_counts.py), with the launch's throughput and stall summaries: the
# expert-group kernel for a step of 16 rows' gate|up and 64 rows' down, and the lm head's staged
# tiles for 16 and 64 rows (issue 18's steps of many sequences; these kernels are issue-bound,
# docs/SERVER.md). CASES: other "kernel-regex=bench_cuda_matvec case" pairs, separated by ";".
groupcode() {
  local ncu=/usr/local/cuda/bin/ncu pair regex case tag
  local cases=${CASES:-"group_staged=experts gate|up by group, 16 rows;group_staged=experts down by group, 64 rows;q8_staged_kernel=lm head, 16 inputs;q8_staged_kernel=lm head, 64 inputs"}
  IFS=';' read -ra pairs <<<"$cases"
  for pair in "${pairs[@]}"; do
    regex=${pair%%=*} case=${pair#*=}
    tag=$(echo "$case" | tr -cd 'a-z0-9' | tail -c 12)
    timeout 120 $ncu --clock-control none --kernel-name "regex:$regex" --launch-skip 3 --launch-count 1 \
      --section SourceCounters --section InstructionStats --section SpeedOfLight --section WarpStateStats \
      --section Occupancy -f -o "/tmp/code_$tag" build/bench_cuda_matvec "$case" >"$out/code_$tag.log" 2>&1
    $ncu -i "/tmp/code_$tag.ncu-rep" --page details >>"$out/code_$tag.log" 2>&1
    $ncu -i "/tmp/code_$tag.ncu-rep" --page source --csv --print-source sass >"/tmp/code_$tag.csv" 2>&1
    gzip -c "/tmp/code_$tag.csv" >"$out/code_$tag.csv.gz"  # (for sass_counts.py's cut points afterwards)
    echo "$case:"
    python3 bench/cuda/sass_counts.py "/tmp/code_$tag.csv" | tee "$out/code_$tag.txt" | head -30
  done
}

# A server on $SERVE_MODEL (default the 35B synth) with the given options, on port 8090; waits for
# /health (the load takes a while). BACKEND=cpu and SERVE_MODEL=models/lode-mini.gguf try the
# script on a machine without a GPU; LODE=path/to/another/lode serves with that build.
start_server() {
  "${LODE:-build/lode}" serve -m "${SERVE_MODEL:-$m35}" --backend "${BACKEND:-cuda}" --port 8090 "$@" >>"$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 180); do
    curl -sf localhost:8090/health >/dev/null && return 0
    kill -0 "$server" 2>/dev/null || { echo "lode serve $* exited (serve.log says why)"; return 1; }
    sleep 1
  done
  echo "lode serve $* did not answer /health in 180 s"
  stop_server
  return 1
}
stop_server() { kill "$server"; wait "$server" 2>/dev/null; }
status_line() { curl -s localhost:8090/v1/status | head -c 2000; echo; }
# /v1/status once no request and no sequence is active and every K/V position is free again
# (abandoned requests are cancelled at the worker's next step), saying whether that came within 20 s.
settled_status() {
  local check='import json, sys
s = json.load(sys.stdin)
m = s["memory"]
sys.exit(0 if s["sequences"]["active"] == 0 and s["requests"]["active"] == 0
         and m["kv_pool_free_positions"] == m["kv_pool_positions"] else 1)'
  local settled="not settled after 20 s"
  for _ in $(seq 40); do
    curl -s localhost:8090/v1/status | python3 -c "$check" && settled="settled" && break
    sleep 0.5
  done
  echo "$settled: $(status_line)"
}

# One load run, its report as one labelled line: load LABEL load.mjs-options... Skipped, saying so,
# once the part has run DEADLINE seconds (default 500), so that what ran comes back inside the
# call's 600 s.
load() {
  local label=$1
  shift
  if ((SECONDS > ${DEADLINE:-500})); then echo "$label: skipped, the part has run ${SECONDS} s"; return; fi
  echo "$label: $(timeout 150 node tools/load/load.mjs --url http://127.0.0.1:8090 --json "$@")"
}

# Issue 18's served table: 1, 4, 16 and 64 concurrent streams (200-word prompts, half shared, 128
# tokens), with prompts read one a step (--prompt-tokens 0) and 1,024 prompt tokens a step, the
# default (PTS: other values); sampled streams (top candidates on the device) at 64 for 1,024.
served() {
  command -v node >/dev/null || { echo "served: no node (pack with NODE=1)"; return 1; }
  synth_35b
  for pt in ${PTS:-0 1024}; do
    start_server --parallel 64 --ctx 4096 --prompt-tokens $pt || return 1
    for c in 1 4 16 64; do
      load "--prompt-tokens $pt, c$c" --concurrency $c --requests $((4 * c)) --prompt-words 200 --max-tokens 128 \
        --shared-prefix 0.5
    done
    [ $pt = 1024 ] && load "--prompt-tokens $pt, c64, temperature 0.7" --concurrency 64 --requests 256 \
      --prompt-words 200 --max-tokens 128 --shared-prefix 0.5 --temperature 0.7
    status_line
    stop_server
  done 2>&1 | tee "$out/served.txt"
}

# Issue 18's other served lines: 16 streams' inter-token latency alone and while 8K-token prompts
# arrive; 500 requests at 16 concurrent with 10% abandoned, then /v1/status (sequences, requests and
# pages back to zero); and 1 and 16 streams under a 16 GiB budget (the expert tier).
stress() {
  command -v node >/dev/null || { echo "stress: no node (pack with NODE=1)"; return 1; }
  synth_35b
  local pt=${PROMPT_TOKENS:-1024} long_words=${LONG_WORDS:-8000}  # (about a token a word)
  {
    start_server --parallel 16 --ctx 12288 --prompt-tokens $pt || return 1
    load "c16 alone" --concurrency 16 --requests 64 --prompt-words 200 --max-tokens 128
    load "long prompts" --concurrency 2 --requests 6 --prompt-words "$long_words" --shared-prefix 0 --max-tokens 8 \
      --seed 5 >"$out/long.txt" &
    local long=$!
    load "c16 with long prompts arriving" --concurrency 16 --requests 64 --prompt-words 200 --max-tokens 128
    wait $long
    cat "$out/long.txt"
    load "500 requests, c16, 10% abandoned" --concurrency 16 --requests 500 --prompt-words 100 --max-tokens 64 \
      --disconnect 0.1 --seed 3
    settled_status
    stop_server
    start_server --parallel 16 --ctx 4096 --prompt-tokens $pt --vram-budget 16384 || return 1
    load "16 GiB, c1" --concurrency 1 --requests 4 --prompt-words 200 --max-tokens 128
    load "16 GiB, c16" --concurrency 16 --requests 32 --prompt-words 200 --max-tokens 128
    status_line
    stop_server
  } 2>&1 | tee "$out/stress.txt"
}

case "${1:-}" in
  suite | floors | mini | sanitize | prompts | groupcode | tier | drafts | served | stress) "$1" ;;
  *) echo "usage: bench/cuda/issue_runs.sh suite|floors|mini|sanitize|prompts|groupcode|tier|drafts|served|stress" >&2; exit 2 ;;
esac
