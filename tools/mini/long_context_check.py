#!/usr/bin/env python3
"""Long-context cross-check of lode against transformers on lode-mini: for one held-out needle case
at ~4k and ~16k tokens, the whole text as a single window (lode ppl's definition with ctx >= its
length), scored by transformers in float32 on the GPU machine. lode then scores the same files:
    lode ppl -m lode-mini-f32.gguf -f needle_16k.txt --ctx 17000 --backend cpu
Usage: python3 tools/mini/long_context_check.py --ckpt DIR --corpus DIR --out DIR
"""
import argparse
import json
import math
import pathlib

import torch
import transformers
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", type=pathlib.Path, required=True)
    ap.add_argument("--corpus", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(args.ckpt / "tokenizer.json"))
    model = transformers.Qwen3_5MoeForCausalLM.from_pretrained(str(args.ckpt), dtype=torch.float32).cuda().eval()
    model.set_attn_implementation("sdpa")
    results = {}
    for size in ("4k", "16k"):
        with open(args.corpus / f"needles_eval_{size}.jsonl", encoding="utf-8") as f:
            case = json.loads(f.readline())
        text = case["prompt"] + case["answer"]
        (args.out / f"needle_{size}.txt").write_text(text, encoding="utf-8")
        ids = tok.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            x = torch.tensor([ids], device="cuda")
            logits = model(input_ids=x).logits[0].double()
            nll = -torch.log_softmax(logits[:-1], -1).gather(1, x[0, 1:, None]).sum().item()
        results[size] = {"tokens": len(ids), "nll_sum": nll, "ppl": math.exp(nll / (len(ids) - 1))}
        print(size, results[size], flush=True)
    (args.out / "long_context.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
