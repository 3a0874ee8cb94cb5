#!/usr/bin/env bash
# lode's int8 and q4 K/V caches beside llama.cpp's q8_0 and q4_0 (its npm CPU build, the oracle in
# tools/oracle) on the same model and tokens: the prompt's speed, and mean KL / top-1 agreement of
# every position's next-token distribution against each engine's own f16 cache (docs/KV.md).
# llama.cpp runs with flash attention on in every case (it needs it for a quantized V cache).
# Usage: tools/kv/llama_cpu_compare.sh MODEL.gguf TEXT_FILE [TOKENS=2048] [THREADS=2]
set -euo pipefail
model=$1 text=$2 n=${3:-2048} threads=${4:-2}
here="$(cd "$(dirname "$0")" && pwd)"
lode="${LODE:-$here/../../build/lode}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$lode" tokenize -m "$model" -f "$text" 2>/dev/null | tr ' ' '\n' > "$work/all_ids"
head -n "$n" "$work/all_ids" | paste -sd, > "$work/ids"
ids="$(cat "$work/ids")"
echo "$(tr ',' '\n' < "$work/ids" | wc -l) tokens of $text, $threads threads"
for kv in fp16 int8 q4; do
  printf 'lode  --kv %-5s ' "$kv"
  "$lode" logits -m "$model" --tokens "$ids" --kv "$kv" --threads "$threads" -o "$work/lode_$kv.f32" 2>&1 | sed 's/^wrote [^(]*//'
done
for t in f16 q8_0 q4_0; do
  printf 'llama.cpp %-5s ' "$t"
  "$here/../oracle/llama_run" "$model" --tokens "@$work/ids" -o "$work/llama_$t.f32" --threads "$threads" \
    --flash-attn --cache-type-k "$t" --cache-type-v "$t" 2>&1 | grep '^prompt:'
done
vocab=$(( $(stat -c %s "$work/lode_fp16.f32") / 4 / $(tr ',' '\n' < "$work/ids" | wc -l) ))
for pair in "lode_fp16 lode_int8" "lode_fp16 lode_q4" "llama_f16 llama_q8_0" "llama_f16 llama_q4_0" "lode_fp16 llama_f16"; do
  set -- $pair
  printf '%-10s vs %-11s ' "$1" "$2"
  "$lode" compare-logits "$work/$1.f32" "$work/$2.f32" --vocab "$vocab" --tokens "$ids"
done
