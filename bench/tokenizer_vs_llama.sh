#!/usr/bin/env bash
# Tokenizer speed, lode beside llama.cpp's CPU build in the same run, on the same model and text:
#   bench/tokenizer_vs_llama.sh [MODEL.gguf] [TEXT_FILE]
# Defaults: a tiny synth model carrying Qwen3's tokenizer (made once under build/bench) and the
# tokenizer corpus's 100 KB mixed case repeated 10 times (1 MB: prose, code, CJK, Arabic, emoji...).
# Each side times only its encode call (model loading excluded); llama.cpp reports its best of 3.
set -euo pipefail
cd "$(dirname "$0")/.."
lode=${LODE_BUILD_DIR:-build}/lode
work=${LODE_BUILD_DIR:-build}/bench
mkdir -p "$work"
model=${1:-$work/tiny-qwen3-tokenizer.gguf}
text=${2:-$work/mixed-1mb.txt}
if [ ! -f "$model" ]; then
  "$lode" synth --preset tiny --layers 1 --recipe q8_0 --tokenizer "$(tools/tokenizer/fetch)" -o "$model" 2>/dev/null
fi
if [ ! -f "$text" ]; then
  python3 - "$text" <<'PY'
import json, sys
cases = json.load(open("tests/data/tokenizer/corpus.json"))["cases"]
text = next(c["text"] for c in cases if c["name"] == "mixed_100k")
open(sys.argv[1], "w", encoding="utf-8").write(text * 10)
PY
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo -n "lode:      "
for i in 1 2 3; do "$lode" tokenize -m "$model" -f "$text" 2>&1 >/dev/null; done | sort -t'(' -k2 -rn | head -n 1
echo -n "llama.cpp: "
tools/oracle/llama_run "$model" --tokenize "$text" 2>&1 >/dev/null
