#!/usr/bin/env python3
"""Needle ("find the fact") cases for `lode kv-quality --needles`, made by lode-mini's own evaluation
generator (tools/mini/needles.py: held-out word lists, distractors, the asked-for fact moving
evenly from the start to the end) with filler paragraphs from a text file, by default the
committed held-out sample (it is short, so long cases reuse its paragraphs).

Usage: python3 tools/kv/needle_cases.py --tokens 4096 --cases 20 [--text FILE] > cases.jsonl
"""
import argparse
import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "mini"))
import needles  # noqa: E402  (tools/mini/needles.py)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096, help="length of each case, ~4 characters a token")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--distractors", type=int, default=6)
    ap.add_argument("--text", type=pathlib.Path, default=ROOT / "tests/data/mini/heldout_sample.txt")
    args = ap.parse_args()
    filler = needles.filler_paragraphs([{"source": "heldout", "text": args.text.read_text(encoding="utf-8")}])
    if not filler:
        sys.exit(f"{args.text} has no prose paragraphs to fill the cases with")
    rng = random.Random(needles.derive_seed(f"kv-quality/{args.tokens}"))
    values = list(range(1000, 10000))
    for i in range(args.cases):
        depth = i / max(1, args.cases - 1)
        case = needles.make_case(rng, needles.EVAL_WORDS, filler, args.tokens * needles.CHARS_PER_TOKEN,
                                 args.distractors, values, depth)
        print(json.dumps({"prompt": case.prompt, "answer": case.answer, "depth": round(case.depth, 3)}))


if __name__ == "__main__":
    main()
