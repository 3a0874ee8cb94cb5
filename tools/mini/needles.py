#!/usr/bin/env python3
"""Synthetic look-up ("needle in a haystack") samples, so that lode-mini learns to find a fact
anywhere in its context and tests can measure whether it does.

A sample is filler text (runs of consecutive paragraphs from the corpus) with a few key-value facts
scattered in it, "The access code for the amber vault is 4817.", some of them distractors with
similar keys (same noun, other adjective; same adjective, other noun), and at the end the question
"Question: What is the access code for the amber vault?\\nAnswer: 4817". Lengths are counted in
characters, 4 characters to a token.

Training samples use the train split's paragraphs, the training word lists and their own random
stream; evaluation samples use the held-out split, word lists that share no word with the training
ones, another random stream, and answers (4-digit values) that no training sample contains.

Usage: python3 tools/mini/needles.py [--corpus DIR]   (DIR holds train.jsonl and heldout.jsonl from
corpus.py; the needle files are written next to them). corpus.py calls build() itself.
"""
import argparse
import dataclasses
import hashlib
import json
import pathlib
import random

SEED = 20240611
CHARS_PER_TOKEN = 4
TRAIN_TOKENS = (128, 1500)          # lengths of training samples, uniform in this range
TRAIN_SHARE = 0.08                  # needle text / training text
EVAL_LENGTHS = {"1k": 1024, "4k": 4096, "16k": 16384}   # tokens
EVAL_CASES = 50
EVAL_DISTRACTORS = {"1k": 4, "4k": 6, "16k": 10}
FILLER_EXCLUDED_SOURCES = {"fortunes", "fortunes-min"}   # '%'-separated jokes make poor prose

ATTRIBUTES = ("access code", "locker number", "room number", "PIN", "combination", "serial number",
              "extension number", "badge number")
TEMPLATES = ("The {attr} for the {adj} {noun} is {value}.",
             "Note: the {attr} for the {adj} {noun} is {value}.",
             "Remember that the {attr} for the {adj} {noun} is {value}.",
             "For the record, the {attr} for the {adj} {noun} is {value}.")


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    adjectives: tuple
    nouns: tuple


TRAIN_WORDS = Vocabulary(
    adjectives=("amber", "azure", "bronze", "copper", "crimson", "golden", "silver", "scarlet",
                "violet", "emerald", "ivory", "jade", "coral", "indigo", "olive", "maroon", "teal",
                "ochre", "russet", "cobalt", "granite", "marble", "wooden", "iron", "glass",
                "velvet", "northern", "southern", "eastern", "western", "hidden", "ancient",
                "quiet", "narrow", "hollow", "frozen", "sunny", "misty", "rusty", "dusty"),
    nouns=("vault", "door", "gate", "tower", "cabinet", "locker", "garden", "library", "bridge",
           "cellar", "attic", "harbor", "station", "chamber", "archive", "workshop", "greenhouse",
           "observatory", "warehouse", "lighthouse", "bakery", "chapel", "pavilion", "tunnel",
           "stable", "kitchen", "office", "studio", "laboratory", "gallery", "theater", "market",
           "barn", "cottage", "mill", "fountain", "courtyard", "dock", "hangar", "depot"),
)
EVAL_WORDS = Vocabulary(
    adjectives=("lavender", "turquoise", "magenta", "saffron", "cerulean", "beige", "charcoal",
                "peach", "mint", "plum", "slate", "tawny", "pearl", "sapphire", "ruby", "topaz",
                "oaken", "brass", "pewter", "woolen", "windy", "muddy", "sandy", "lonely", "gentle"),
    nouns=("safe", "drawer", "portal", "turret", "closet", "shed", "orchard", "museum", "viaduct",
           "crypt", "loft", "marina", "terminal", "vestibule", "repository", "forge", "conservatory",
           "planetarium", "silo", "beacon", "pantry", "abbey", "gazebo", "canal", "kennel"),
)


def derive_seed(label):
    """A seed of its own for each random stream, from the one fixed SEED."""
    return int.from_bytes(hashlib.sha256(f"{SEED}:{label}".encode()).digest()[:8], "big")


# ------------------------------------------------------------------------------------------------
# Filler

def _is_prose(paragraph):
    if not 80 <= len(paragraph) <= 2500 or paragraph.startswith((">>>", "$ ", "# ", "- ")):
        return False
    plain = sum(c.isalpha() or c in " ,.;:'\"()-?!" for c in paragraph)
    return plain / len(paragraph) >= 0.92


def filler_paragraphs(docs):
    """Per document (dicts with "source" and "text"), its prose paragraphs as one-line strings."""
    out = []
    for doc in docs:
        if doc["source"] in FILLER_EXCLUDED_SOURCES:
            continue
        paragraphs = []
        for block in doc["text"].split("\n\n"):
            # Very long blocks (a Bible chapter is one verse per line) are split at lines.
            pieces = block.split("\n") if len(block) > 2500 else [block]
            for piece in pieces:
                piece = " ".join(piece.split())
                if _is_prose(piece):
                    paragraphs.append(piece)
        if paragraphs:
            out.append(paragraphs)
    return out


def _cut_at_sentence(text, limit):
    cut = text.rfind(". ", 0, limit)
    return text[:cut + 1] if cut >= 100 else ""


def take_filler(rng, filler, budget):
    """Consecutive paragraphs from a random place in filler, at most budget characters in all
    (counting the blank line after each)."""
    d = rng.randrange(len(filler))
    p = rng.randrange(len(filler[d]))
    taken, left, misses = [], budget, 0
    while left > 80 and misses < 200:
        paragraph = filler[d][p]
        if len(paragraph) + 2 <= left:
            taken.append(paragraph)
            left -= len(paragraph) + 2
            misses = 0
        elif left >= 300 and (cut := _cut_at_sentence(paragraph, left - 2)):
            taken.append(cut)
            break
        else:
            misses += 1
        p += 1
        if p == len(filler[d]):
            d, p = (d + 1) % len(filler), 0
    return taken


# ------------------------------------------------------------------------------------------------
# Samples

@dataclasses.dataclass
class Case:
    prompt: str      # ends with "Answer:"
    answer: str      # " 4817"
    depth: float     # where the asked-for fact is, 0 (start) .. 1 (end of the filler)
    values: tuple    # every value the facts carry, the answer's first


def _distractor_keys(rng, words, attr, adj, noun, count):
    keys, target = [], (attr, adj, noun)
    while len(keys) < count:
        kind = rng.random()
        if kind < 0.35:     # same thing, other adjective: the adjective must be read
            key = (attr, rng.choice(words.adjectives), noun)
        elif kind < 0.7:    # same adjective, other thing
            key = (attr, adj, rng.choice(words.nouns))
        else:
            key = (rng.choice(ATTRIBUTES), rng.choice(words.adjectives), rng.choice(words.nouns))
        if key != target and key not in keys:
            keys.append(key)
    return keys


def make_case(rng, words, filler, target_chars, distractors, values, depth=None):
    """One sample of about target_chars characters. values: the 4-digit values it may use."""
    attr, adj, noun = rng.choice(ATTRIBUTES), rng.choice(words.adjectives), rng.choice(words.nouns)
    keys = [(attr, adj, noun)] + _distractor_keys(rng, words, attr, adj, noun, distractors)
    chosen = rng.sample(values, len(keys))
    facts = [rng.choice(TEMPLATES).format(attr=a, adj=j, noun=n, value=v)
             for (a, j, n), v in zip(keys, chosen)]
    question = f"Question: What is the {attr} for the {adj} {noun}?\nAnswer:"
    budget = target_chars - len(question) - 2 - sum(len(f) + 2 for f in facts)
    paragraphs = take_filler(rng, filler, max(0, budget))
    slots = len(paragraphs) + 1
    target_slot = rng.randrange(slots) if depth is None else min(slots - 1, round(depth * (slots - 1)))
    placed = [(target_slot, 0, facts[0])] + [(rng.randrange(slots), 1 + i, f)
                                              for i, f in enumerate(facts[1:])]
    by_slot = {}
    for slot, order, fact in sorted(placed):
        by_slot.setdefault(slot, []).append(fact)
    parts = []
    for slot in range(slots):
        parts.extend(by_slot.get(slot, []))
        if slot < len(paragraphs):
            parts.append(paragraphs[slot])
    prompt = "\n\n".join(parts + [question])
    return Case(prompt, f" {chosen[0]}", target_slot / max(1, slots - 1), tuple(chosen))


def build_eval(filler, name):
    rng = random.Random(derive_seed(f"eval/{name}"))
    values = list(range(1000, 10000))
    cases = []
    for i in range(EVAL_CASES):
        depth = i / (EVAL_CASES - 1)   # the asked-for fact moves evenly from start to end
        cases.append(make_case(rng, EVAL_WORDS, filler, EVAL_LENGTHS[name] * CHARS_PER_TOKEN,
                               EVAL_DISTRACTORS[name], values, depth))
    return cases


def build_train(filler, total_chars, excluded_values):
    rng = random.Random(derive_seed("train"))
    values = [v for v in range(1000, 10000) if v not in excluded_values]
    samples, chars = [], 0
    while chars < total_chars:
        tokens = rng.randint(*TRAIN_TOKENS)
        case = make_case(rng, TRAIN_WORDS, filler, tokens * CHARS_PER_TOKEN, rng.randint(2, 6), values)
        text = case.prompt + case.answer
        samples.append({"text": text})
        chars += len(text)
    return samples


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build(train_docs, heldout_docs, out_dir, train_chars):
    """Writes needles_train.jsonl and needles_eval_{1k,4k,16k}.jsonl; returns a summary dict."""
    out_dir = pathlib.Path(out_dir)
    eval_filler = filler_paragraphs(heldout_docs)
    summary, eval_values = {}, set()
    for name in EVAL_LENGTHS:
        cases = build_eval(eval_filler, name)
        for case in cases:
            eval_values |= set(case.values)
        _write_jsonl(out_dir / f"needles_eval_{name}.jsonl",
                     [{"prompt": c.prompt, "answer": c.answer, "depth": round(c.depth, 3)} for c in cases])
        summary[f"eval_{name}"] = {"cases": len(cases),
                                   "mean_chars": round(sum(len(c.prompt) for c in cases) / len(cases))}
    train = build_train(filler_paragraphs(train_docs), TRAIN_SHARE * train_chars, eval_values)
    _write_jsonl(out_dir / "needles_train.jsonl", train)
    summary["train"] = {"samples": len(train), "chars": sum(len(s["text"]) for s in train)}
    return summary


def _read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    repo = pathlib.Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=pathlib.Path, default=repo / "build-mini" / "corpus",
                        help="the directory corpus.py wrote (default: %(default)s)")
    args = parser.parse_args()
    train = _read_jsonl(args.corpus / "train.jsonl")
    heldout = _read_jsonl(args.corpus / "heldout.jsonl")
    summary = build(train, heldout, args.corpus, sum(len(d["text"]) for d in train))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
