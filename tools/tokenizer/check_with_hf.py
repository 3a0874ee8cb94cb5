#!/usr/bin/env python3
"""Recompute tests/data/tokenizer/reference.json with Hugging Face `tokenizers` (the Rust library).

    python3 tools/tokenizer/check_with_hf.py PATH/tokenizer.json [CORPUS.json REFERENCE.json]

The reference was made by a JavaScript port; this checks it against the original. For every case,
each variant (qwen2, qwen35: the Split regex) and mode (special: all added tokens recognised;
plain: only the added tokens not marked special are, done with HF's encode_special_tokens, which is
transformers' split_special_tokens), it encodes the text without BOS/EOS and compares the ids.
Composed cases (not valid UTF-8) are recomputed by the README's rule, with Python's UTF-8 decoder
finding the maximal invalid subparts. It also compares the stored pre-tokenizer pieces with HF's
Split on the NFC text. Prints counts of identical cases and the first differences; exit code 1 if
anything differs. Needs only the standard library and `tokenizers`.
"""

import copy
import json
import pathlib
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, pre_tokenizers

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "tokenizer"
MAX_SHOWN = 5


def tokenizer_with_regex(base, regex):
    doc = copy.deepcopy(base)
    splits = [p for p in doc["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    assert len(splits) == 1, "expected exactly one Split pre-tokenizer"
    splits[0]["pattern"] = {"Regex": regex}
    return Tokenizer.from_str(json.dumps(doc))


def byte_token_ids(vocab):
    """GPT-2's byte-to-character table (printable Latin-1 bytes stay, the rest go to U+0100 up)."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(0x100 + i) for i, b in enumerate(others)}
    return [vocab[chars[b]] for b in range(256)]


def utf8_parts(data):
    """Cuts bytes into (valid text, None) and (None, invalid bytes) parts, one per maximal subpart."""
    parts, i = [], 0
    while i < len(data):
        try:
            parts.append((data[i:].decode("utf-8"), None))
            break
        except UnicodeDecodeError as e:
            if e.start:
                parts.append((data[i:i + e.start].decode("utf-8"), None))
            parts.append((None, data[i + e.start:i + e.end]))
            i += e.end
    return parts


def composed_ids(encode, data, byte_ids):
    ids = []
    for text, invalid in utf8_parts(data):
        ids += encode(text) if text is not None else [byte_ids[b] for b in invalid]
    return ids


def split_at_added(text, added):
    """Cuts text into (is_added, stretch), taking the longest added token at the leftmost place."""
    out, plain, i = [], "", 0
    while i < len(text):
        match = max((a for a in added if text.startswith(a, i)), key=len, default=None)
        if match:
            if plain:
                out.append((False, plain))
            out.append((True, match))
            plain, i = "", i + len(match)
        else:
            plain, i = plain + text[i], i + 1
    if plain:
        out.append((False, plain))
    return out


def hf_pieces(split, normalizer, text, added):
    pieces = []
    for is_added, stretch in split_at_added(text, added):
        if is_added:
            pieces.append(stretch)
        else:
            pieces += [p for p, _ in split.pre_tokenize_str(normalizer.normalize_str(stretch))]
    return pieces


def first_difference(a, b):
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at {n} of {len(a)}/{len(b)}: hf {a[n:n + 6]} vs reference {b[n:n + 6]}"


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    base = json.loads(pathlib.Path(sys.argv[1]).read_text(encoding="utf-8"))
    corpus_path, reference_path = (sys.argv[2:4] if len(sys.argv) == 4
                                   else (DATA / "corpus.json", DATA / "reference.json"))
    corpus = json.loads(pathlib.Path(corpus_path).read_text(encoding="utf-8"))["cases"]
    reference = json.loads(pathlib.Path(reference_path).read_text(encoding="utf-8"))
    ref_cases = {c["name"]: c for c in reference["cases"]}
    texts = [c for c in corpus if "text" in c]
    print(f"tokenizers {tokenizers.__version__}; {len(corpus)} cases, {len(corpus) - len(texts)} of them "
          f"composed; reference: {reference['source']}")
    byte_ids = byte_token_ids(base["model"]["vocab"])
    assert byte_ids == reference["byte_token_ids"], "byte-level token ids differ"

    def ids_of(case, encode):
        if "text" in case:
            return encode(case["text"])
        return composed_ids(encode, bytes.fromhex(case["hex"]), byte_ids)

    shipped = next(p for p in base["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split")
    assert shipped["pattern"]["Regex"] == reference["regex"]["qwen2"], "reference's qwen2 regex is not the file's"
    special_added = [t["content"] for t in base["added_tokens"]]
    all_ok = True
    for variant, regex in reference["regex"].items():
        # Plain mode uses HF's own split_special_tokens switch. (A JSON copy without the special
        # added tokens would not do here: HF renumbers the remaining added tokens from the vocab
        # size up, so <think> would get 151653 instead of 151667.)
        tok_special = tokenizer_with_regex(base, regex)
        tok_plain = tokenizer_with_regex(base, regex)
        if not hasattr(tok_plain, "encode_special_tokens"):
            sys.exit(f"tokenizers {tokenizers.__version__} has no encode_special_tokens; use 0.15 or newer")
        tok_plain.encode_special_tokens = True
        runs = {
            "special": lambda text, t=tok_special: t.encode(text, add_special_tokens=False).ids,
            "plain": lambda text, t=tok_plain: t.encode(text, add_special_tokens=False).ids,
        }
        for mode, encode in runs.items():
            diffs = [(c["name"], first_difference(ids, ref_cases[c["name"]][variant][mode]))
                     for c in corpus
                     if (ids := ids_of(c, encode)) != ref_cases[c["name"]][variant][mode]]
            all_ok &= not diffs
            print(f"{variant}/{mode}: {len(corpus) - len(diffs)}/{len(corpus)} identical")
            for name, where in diffs[:MAX_SHOWN]:
                print(f"  {name}: {where}")

        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        with_pieces = [c for c in texts if "pieces" in ref_cases[c["name"]]]
        diffs = [(c["name"], first_difference(p, ref_cases[c["name"]]["pieces"][variant]))
                 for c in with_pieces
                 if (p := hf_pieces(split, tok_special.normalizer, c["text"], special_added))
                 != ref_cases[c["name"]]["pieces"][variant]]
        all_ok &= not diffs
        print(f"{variant}/pieces: {len(with_pieces) - len(diffs)}/{len(with_pieces)} identical")
        for name, where in diffs[:MAX_SHOWN]:
            print(f"  {name}: {where}")
    print("OK: HF tokenizers agrees with the reference" if all_ok else "DIFFERENT: see above")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
