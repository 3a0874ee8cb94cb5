#!/usr/bin/env bash
# One call on the GPU machine, after experts_check.sh left the models in ${MODELS:-/tmp}: the
# placement from a routing profile on the skewed model (lode profile, then --expert-profile), and
# the chain the K/V formats exist for: a 16 GiB budget with a 262,144-position context in fp16,
# int8, k8v4 and q4, each format's experts in VRAM and its decode speed (docs/EXPERTS.md).
set -uo pipefail
out=${OUT:-experts-chain}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/build/runtime-libs:${LD_LIBRARY_PATH:-}
models=${MODELS:-/tmp}
if [ -s "$models/m35-skew.gguf" ]; then
  build/lode profile -m "$models/m35-skew.gguf" -f tests/data/mini/heldout_sample.txt -o "$out/skew_profile.json" \
    --ctx 4096 >"$out/profile.txt" 2>&1
  echo "== profile (exit $?, ${SECONDS}s)"; tail -2 "$out/profile.txt" | cut -c1-300
  for b in ${PROFILE_BUDGETS:-12288,4096}; do
    timeout 200 build/lode bench -m "$models/m35-skew.gguf" --kv fp16 --ctx 32768 -p 8192 -n 128 -r 2 \
      --vram-budget "$b" --expert-profile "$out/skew_profile.json" >"$out/bench_profile_$b.txt" 2>&1
    echo "== skew with its profile at $b MiB (exit $?, ${SECONDS}s)"
    grep -E "^(pp|tg|VRAM plan)|error" "$out/bench_profile_$b.txt" | cut -c1-300
  done
fi
for f in ${FORMATS:-fp16 int8 k8v4 q4}; do
  timeout 150 build/lode bench -m "$models/m35.gguf" --kv "$f" --ctx 262144 -p 512 -d 0,131072 --fill random -n 64 -r 2 \
    --vram-budget 16384 >"$out/bench_262k_$f.txt" 2>&1
  echo "== 262K context, 16 GiB, $f (exit $?, ${SECONDS}s)"
  grep -E "^(pp|tg|VRAM plan)|error" "$out/bench_262k_$f.txt" | cut -c1-300
done
