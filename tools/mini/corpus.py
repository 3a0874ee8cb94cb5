#!/usr/bin/env python3
"""Builds lode-mini's training corpus from Debian documentation packages, reproducibly.

Steps: download and unpack the packages (packages.py) into tools/mini/.cache; read each into
documents (sources.py); clean them (NFC, whitespace, control characters), drop repeated paragraphs
across the whole corpus (the first one stays) and very short documents; split documents into train
(~98%) and held-out (~2%) by a hash of their id, every source having held-out text; write

  OUT/train.jsonl, OUT/heldout.jsonl    {"source", "id", "text"} per document
  OUT/heldout.txt                       the held-out texts joined by blank lines (for perplexity)
  OUT/needles_train.jsonl, OUT/needles_eval_{1k,4k,16k}.jsonl   (needles.py)
  OUT/chat_train.jsonl, OUT/chat_heldout.jsonl                  (chat_data.py)
  OUT/manifest.json                     package versions, .deb hashes, counts and sizes
  tests/data/mini/heldout_sample.txt    the first ~60 KB of heldout.txt, whole documents

Everything is deterministic: fixed seeds, sorted file lists, no timestamps.
Usage: python3 tools/mini/corpus.py [--out DIR] [--cache DIR] [--sample FILE]
"""
import argparse
import collections
import hashlib
import json
import pathlib
import re
import sys
import time
import unicodedata

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import chat_data  # noqa: E402
import needles  # noqa: E402
import packages  # noqa: E402
import sources  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED = 20240611
HELDOUT_PER_MILLE = 20
DEDUP_MIN_CHARS = 40       # shorter paragraphs ("New in version 3.11.") may repeat
MIN_DOC_CHARS = 200        # documents with less text than this (headings aside) are dropped
SAMPLE_BYTES = 60_000
SHORT_DOC_BYTES = 8_000


# ------------------------------------------------------------------------------------------------
# Cleaning

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b\ufeff]")


def clean_block_text(text, kind):
    text = unicodedata.normalize("NFC", text).replace("\u00a0", " ")
    text = CONTROL.sub("", text)
    if kind in ("code", "verbatim", "fortune"):
        lines = [line.rstrip() for line in text.split("\n")]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    else:
        text = " ".join(text.split())
    return text


def dedup_key(text):
    return hashlib.sha1(" ".join(text.split()).encode("utf-8")).digest()


def document_text(doc):
    parts = []
    for i, block in enumerate(doc.blocks):
        if i:
            prev = doc.blocks[i - 1].kind
            if prev == "heading" and doc.heading_sep:
                parts.append(doc.heading_sep)
            elif prev == block.kind and prev in ("row", "item"):
                parts.append("\n")   # a table's rows and a list's items stay together
            else:
                parts.append(doc.sep)
        parts.append(block.text)
    return "".join(parts)


def drop_empty_headings(blocks):
    """Headings whose sections were left empty (all duplicates): followed by a heading of the same
    or a higher level, or by nothing."""
    kept = []
    for i, block in enumerate(blocks):
        if block.kind == "heading":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            if nxt is None or (nxt.kind == "heading" and nxt.level <= block.level):
                continue
        kept.append(block)
    return kept


def clean(docs_by_source, stats):
    """Cleans every block, removes repeated paragraphs (the first one in corpus order stays) and
    documents left too short; returns the kept documents, in order."""
    seen = set()
    kept = []
    for source, docs in docs_by_source:
        for doc in docs:
            blocks = []
            for block in doc.blocks:
                block.text = clean_block_text(block.text, block.kind)
                if not block.text:
                    continue
                if block.kind != "heading" and len(block.text) >= DEDUP_MIN_CHARS:
                    key = dedup_key(block.text)
                    if key in seen:
                        stats[source]["duplicate_paragraphs"] += 1
                        continue
                    seen.add(key)
                blocks.append(block)
            doc.blocks = drop_empty_headings(blocks)
            if sum(len(b.text) for b in blocks if b.kind != "heading") < MIN_DOC_CHARS:
                stats[source]["short_documents"] += 1
                continue
            kept.append(doc)
    return kept


# ------------------------------------------------------------------------------------------------
# Split

def split_hash(doc):
    return int.from_bytes(hashlib.sha256(f"{doc.source}\n{doc.id}".encode()).digest()[:8], "big")


def split(docs):
    """(train, heldout): a document is held out when its id's hash says so (~2%); a source that
    gets none that way gives up the document with the smallest hash."""
    heldout_ids = {(d.source, d.id) for d in docs if split_hash(d) % 1000 < HELDOUT_PER_MILLE}
    for source in dict.fromkeys(d.source for d in docs):
        own = [d for d in docs if d.source == source]
        if not any((d.source, d.id) in heldout_ids for d in own) and len(own) > 1:
            heldout_ids.add((source, min(own, key=split_hash).id))
    train = [d for d in docs if (d.source, d.id) not in heldout_ids]
    heldout = [d for d in docs if (d.source, d.id) in heldout_ids]
    return train, heldout


def interleave_by_source(docs):
    """Held-out order: one document of each source in turn, shortest first within a source, the
    short documents (up to SHORT_DOC_BYTES) before all others, so that the first ~60 KB of
    heldout.txt (the committed sample) have text of every source."""
    def rounds(part):
        queues = collections.defaultdict(list)
        for doc in part:
            queues[doc.source].append(doc)
        for queue in queues.values():
            queue.sort(key=lambda d: (len(d.text), d.id))
        ordered = []
        for i in range(max((len(q) for q in queues.values()), default=0)):
            ordered.extend(q[i] for q in queues.values() if i < len(q))
        return ordered

    short = [d for d in docs if len(d.text.encode("utf-8")) <= SHORT_DOC_BYTES]
    long = [d for d in docs if len(d.text.encode("utf-8")) > SHORT_DOC_BYTES]
    return rounds(short) + rounds(long)


# ------------------------------------------------------------------------------------------------
# Output

def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def doc_rows(docs):
    return [{"source": d.source, "id": d.id, "text": d.text} for d in docs]


def write_sample(heldout_text_parts, path):
    """Writes the longest run of whole held-out documents from the start that fits in SAMPLE_BYTES;
    returns (how many documents, bytes)."""
    parts, size = [], 0
    for text in heldout_text_parts:
        add = len(text.encode("utf-8")) + (2 if parts else 0)
        if size + add > SAMPLE_BYTES:
            break
        parts.append(text)
        size += add
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return len(parts), size


def megabytes(n):
    return round(n / 1e6, 2)


def print_table(stats, train, heldout):
    print(f"{'source':22} {'train docs':>10} {'train MB':>9} {'held docs':>9} {'held MB':>8} "
          f"{'dup paras':>9} {'short docs':>10}")
    for source, s in stats.items():
        print(f"{source:22} {s['train_documents']:>10} {megabytes(s['train_bytes']):>9} "
              f"{s['heldout_documents']:>9} {megabytes(s['heldout_bytes']):>8} "
              f"{s['duplicate_paragraphs']:>9} {s['short_documents']:>10}")
    train_bytes = sum(s["train_bytes"] for s in stats.values())
    heldout_bytes = sum(s["heldout_bytes"] for s in stats.values())
    print(f"{'total':22} {len(train):>10} {megabytes(train_bytes):>9} {len(heldout):>9} "
          f"{megabytes(heldout_bytes):>8}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "build-mini" / "corpus",
                        help="output directory (default: %(default)s)")
    parser.add_argument("--cache", type=pathlib.Path, default=REPO / "tools" / "mini" / ".cache",
                        help="where packages are downloaded and unpacked (default: %(default)s)")
    parser.add_argument("--sample", type=pathlib.Path,
                        default=REPO / "tests" / "data" / "mini" / "heldout_sample.txt",
                        help="the committed held-out sample to (re)write (default: %(default)s)")
    args = parser.parse_args()
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)

    fetched = packages.fetch(args.cache.resolve())
    stats = collections.OrderedDict()
    docs_by_source = []
    for source, docs in sources.read_all(fetched):
        stats[source] = collections.Counter(read_documents=len(docs))
        docs_by_source.append((source, docs))
        print(f"read {source}: {len(docs)} documents ({time.time() - started:.0f} s)", file=sys.stderr)

    docs = clean(docs_by_source, stats)
    for doc in docs:
        doc.text = document_text(doc)
    train, heldout = split(docs)
    heldout = interleave_by_source(heldout)
    for name, part in (("train", train), ("heldout", heldout)):
        for doc in part:
            stats[doc.source][f"{name}_documents"] += 1
            stats[doc.source][f"{name}_bytes"] += len(doc.text.encode("utf-8"))

    write_jsonl(args.out / "train.jsonl", doc_rows(train))
    write_jsonl(args.out / "heldout.jsonl", doc_rows(heldout))
    (args.out / "heldout.txt").write_text("\n\n".join(d.text for d in heldout) + "\n", encoding="utf-8")
    sample_docs, sample_bytes = write_sample([d.text for d in heldout], args.sample)

    train_chars = sum(len(d.text) for d in train)
    needle_summary = needles.build(doc_rows(train), doc_rows(heldout), args.out, train_chars)
    chat_train, chat_heldout = chat_data.build(train, heldout, SEED)
    write_jsonl(args.out / "chat_train.jsonl", chat_train)
    write_jsonl(args.out / "chat_heldout.jsonl", chat_heldout)

    manifest = {
        "packages": [{"name": f.package.name, "version": f.version, "pinned": f.package.version,
                      "deb_sha256": f.deb_sha256, "licence": f.package.licence, "role": f.package.role}
                     for f in fetched.values()],
        "sources": {source: dict(s) for source, s in stats.items()},
        "train": {"documents": len(train), "bytes": sum(s["train_bytes"] for s in stats.values())},
        "heldout": {"documents": len(heldout), "bytes": sum(s["heldout_bytes"] for s in stats.values())},
        "sample": {"path": str(args.sample.relative_to(REPO)) if args.sample.is_relative_to(REPO)
                   else str(args.sample), "bytes": sample_bytes,
                   "documents": [f"{d.source}: {d.id}" for d in heldout[:sample_docs]]},
        "needles": needle_summary,
        "chat": {"train": len(chat_train), "heldout": len(chat_heldout)},
        "settings": {"seed": SEED, "heldout_per_mille": HELDOUT_PER_MILLE,
                     "dedup_min_chars": DEDUP_MIN_CHARS, "min_doc_chars": MIN_DOC_CHARS},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")

    print_table(stats, train, heldout)
    print(f"needles: {needle_summary['train']['samples']} training samples "
          f"({megabytes(needle_summary['train']['chars'])} MB), eval "
          + ", ".join(f"{k[5:]}: {v['cases']}" for k, v in needle_summary.items() if k.startswith("eval_")))
    print(f"chat: {len(chat_train)} train turns, {len(chat_heldout)} held-out turns")
    print(f"sample: {sample_docs} documents, {sample_bytes} bytes -> {args.sample}")
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
