#!/usr/bin/env bash
# Decode speed of two or more lode builds, interleaved on one GPU machine (runs drift by ~3% over a
# call, so A/B figures come from alternating runs in one call), on the 35B-A3B ud-q4_k_xl-like
# synth; then, with PROFILE=1, `lode bench --profile` of the first build. Run it from the
# repository root with the builds and build/runtime-libs carried; results go under ${OUT:-decode-ab}.
#
#   bench/cuda/decode_ab.sh build/ab/lode-base build/lode          # 3 rounds, depth 0
#   ROUNDS=2 DEPTH=8192 bench/cuda/decode_ab.sh old/lode new/lode  # another depth
#   BUDGET=12288 bench/cuda/decode_ab.sh old/lode new/lode         # under a VRAM budget (expert tier)
#
# Each build prints one line per round: "<build> <round> tg128 @ depth D  T tokens/s ...".
set -uo pipefail
out=${OUT:-decode-ab}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
[ $# -ge 2 ] || { echo "usage: $0 LODE_A LODE_B [LODE_C ...]" >&2; exit 2; }
mkdir -p "${MODELS:-/tmp}"
model=${MODELS:-/tmp}/m35.gguf
if [ ! -s "$model" ]; then
  "$1" synth -o "$model.part" --preset qwen3.6-35b-a3b --recipe ud-q4_k_xl >"$out/synth.txt" 2>&1 &&
    mv "$model.part" "$model" || { echo "synth failed: $(tail -3 "$out/synth.txt")"; exit 1; }
fi
depth=${DEPTH:-0}
# The context: the depth and room for the runs; under a budget at least 32768 positions, as
# docs/EXPERTS.md's runs.
ctx=$((depth + 4096))
budget=()
if [ -n "${BUDGET:-}" ]; then
  budget=(--vram-budget "$BUDGET")
  [ "$ctx" -lt 32768 ] && ctx=32768
fi
for round in $(seq "${ROUNDS:-3}"); do
  for lode in "$@"; do
    name=$(echo "$lode" | tr '/' '_')
    timeout 200 "$lode" bench -m "$model" --kv "${KV:-fp16}" --ctx "$ctx" -p 512 -d "$depth" -n 128 -r 3 \
      --fill random "${budget[@]}" >"$out/bench_${name}_$round.txt" 2>&1
    echo "$lode $round $(grep -E '^tg' "$out/bench_${name}_$round.txt" | cut -c1-300)"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  timeout 300 "$1" bench -m "$model" --kv "${KV:-fp16}" --ctx 4096 -p 512 -n 64 -r 1 --profile >"$out/profile.txt" 2>&1
  grep -A22 "what each kernel class costs" "$out/profile.txt"
fi
