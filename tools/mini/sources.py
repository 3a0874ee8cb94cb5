"""One reader per package: unpacked Debian package -> Documents (text blocks plus the facts the chat
data is made from). Readers only extract and drop page furniture; cleaning, deduplication and the
train/held-out split are corpus.py's.
"""
import concurrent.futures
import dataclasses
import gzip
import os
import re
import subprocess

from htmltext import Block, HtmlRules, Selector, html_to_blocks


@dataclasses.dataclass(frozen=True)
class Fact:
    """Something a chat turn can ask about. kind: "man", "pydef", "verse", "fortune", "section"."""
    kind: str
    key: str     # what is asked about: "open(2)", "os.path.join", "Genesis 1:3", a section title
    text: str    # the answer's material
    extra: tuple = ()   # (name, value) pairs, e.g. (("role", "py function"),)


@dataclasses.dataclass
class Document:
    source: str          # the package name
    id: str              # stable within the source: "library/os.path", "man2/open.2", "Genesis 1"
    title: str
    blocks: list         # htmltext.Block
    sep: str = "\n\n"    # what joins the blocks into the document's text
    heading_sep: str = ""  # what follows a heading block instead of sep, where set (man pages: "\n")
    facts: list = dataclasses.field(default_factory=list)


def _sorted_files(root, pattern):
    return sorted((p for p in root.rglob(pattern) if p.is_file() and not p.is_symlink()),
                  key=lambda p: p.relative_to(root).as_posix())


def _first_heading(blocks, default):
    return next((b.text for b in blocks if b.kind == "heading"), default)


def _section_facts(blocks, book):
    """(heading, first real paragraph under it) for every heading that has one."""
    facts = []
    for i, block in enumerate(blocks):
        if block.kind != "heading":
            continue
        for nxt in blocks[i + 1:i + 4]:
            if nxt.kind == "heading":
                break
            if nxt.kind == "prose" and len(nxt.text) >= 80:
                title = re.sub(r"^(Chapter |Appendix )?[0-9A-Z]+(\.[0-9]+)*\.?\s+", "", block.text)
                facts.append(Fact("section", title, nxt.text, (("book", book),)))
                break
    return facts


# ------------------------------------------------------------------------------------------------
# python3.11-doc: the Python 3.11 documentation (Sphinx HTML)

PYTHON_RULES = HtmlRules(
    root=Selector("div", ("body",), (("role", "main"),)),
    skip=(Selector("a", ("headerlink",)), Selector("div", ("toctree-wrapper",))),
    labels=(Selector("p", ("admonition-title",)),),
)
# Index pages (tables of contents), search and licence pages, fragments included into other pages, and the 3 MB changelog (one
# line per issue number).
PYTHON_SKIPPED = re.compile(r"^(genindex.*|py-modindex|search|(.*/)?index|contents|about|bugs|copyright|"
                            r"license|download|whatsnew/changelog|includes/.*|.*/_.*)$")


def read_python_doc(root):
    html_dir = root / "usr/share/doc/python3.11/html"
    docs = []
    for path in _sorted_files(html_dir, "*.html"):
        rel = path.relative_to(html_dir).with_suffix("").as_posix()
        if rel.startswith("_") or PYTHON_SKIPPED.match(rel):
            continue
        blocks = html_to_blocks(path.read_text(encoding="utf-8"), PYTHON_RULES)
        doc = Document("python3.11-doc", rel, _first_heading(blocks, rel), blocks)
        doc.facts = _python_definitions(blocks)
        docs.append(doc)
    return docs


def _python_definitions(blocks):
    facts = []
    for block, nxt in zip(blocks, blocks[1:]):
        if (block.kind == "term" and block.role.startswith("py ") and
                re.fullmatch(r"[A-Za-z_][\w.]*", block.anchor) and nxt.kind == "prose" and
                len(nxt.text) >= 40):
            facts.append(Fact("pydef", block.anchor, nxt.text,
                              (("role", block.role.split()[1]), ("signature", block.text))))
    return facts


# ------------------------------------------------------------------------------------------------
# manpages, manpages-dev: the Linux man-pages project (troff, rendered by groff)

# Left-adjust instead of justify, so that sentences have no runs of spaces: appended to TH, the first
# macro of every man(7) page, so it runs after the macro package's own setup. (-rHY=0, on groff's
# command line, turns hyphenation off; -t runs tbl for the tables, -k preconv for UTF-8 input.)
MAN_PRELUDE = b".am TH\n.ad l\n.nh\n..\n"
MAN_SECTION_WORDS = {"1": "command", "8": "command", "2": "system call", "3": "library function"}


def _render_man(path):
    source = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if source.lstrip().startswith(b".so "):
        return None   # a one-line redirect to another page
    env = dict(os.environ, LC_ALL="C.UTF-8")
    result = subprocess.run(["groff", "-t", "-k", "-Tutf8", "-mandoc", "-P-cbou", "-rcR=1", "-rHY=0", "-W", "all"],
                            input=MAN_PRELUDE + source, capture_output=True, env=env)
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", errors="replace")


def _man_blocks(rendered):
    text = re.sub(r".\x08", "", rendered)   # overstrikes (bold, underline), should any be left
    lines = [line.rstrip() for line in text.split("\n")]
    content = [i for i, line in enumerate(lines) if line]
    if len(content) < 3:
        return []
    # The running header ("open(2)  System Calls Manual  open(2)") and footer lines.
    lines = lines[content[0] + 1:content[-1]]
    # Sentence ends get two spaces from troff; one is what the rest of the corpus has.
    lines = [re.sub(r"(?<=\S[.?!:;)])  (?=\S)", " ", line) for line in lines]
    blocks = []
    for para in re.split(r"\n\s*\n", "\n".join(lines)):
        para = para.strip("\n")
        if not para.strip():
            continue
        # A section heading ("DESCRIPTION", unindented) is a block of its own, so that removing a
        # duplicate paragraph never takes a heading with it.
        head, _, rest = para.partition("\n")
        if re.fullmatch(r"[A-Z][A-Z0-9 ,/_()-]*", head):
            blocks.append(Block("heading", head, 1))
            para = rest
        if para.strip():
            blocks.append(Block("verbatim", para))
    return blocks


def _unwrap(text):
    return " ".join(text.split())


def _man_fact(name, section, blocks):
    summary, description = "", ""
    for block, nxt in zip(blocks, blocks[1:]):
        if block.kind != "heading" or nxt.kind != "verbatim":
            continue
        if block.text == "NAME" and not summary:
            summary = _unwrap(nxt.text)
        elif block.text == "DESCRIPTION" and not description:
            description = _unwrap(nxt.text)
    if not summary:
        return None
    return Fact("man", f"{name}({section})", description,
                (("name", name), ("section", section), ("summary", summary)))


def read_man_pages(root, source):
    man_dir = root / "usr/share/man"
    paths = [p for p in _sorted_files(man_dir, "*") if re.search(r"\.\d\w*(\.gz)?$", p.name)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        rendered = list(pool.map(_render_man, paths))
    docs = []
    for path, text in zip(paths, rendered):
        if not text:
            continue
        stem = path.name[:-3] if path.name.endswith(".gz") else path.name
        name, _, section = stem.rpartition(".")
        rel = f"{path.parent.name}/{stem}"
        blocks = _man_blocks(text)
        doc = Document(source, rel, f"{name}({section})", blocks, heading_sep="\n")
        fact = _man_fact(name, section, blocks)
        doc.facts = [fact] if fact else []
        docs.append(doc)
    return docs


# ------------------------------------------------------------------------------------------------
# bible-kjv-text: the King James Bible, read with the bible-kjv package's own reader

BOOKS = {
    "Ge": "Genesis", "Exo": "Exodus", "Lev": "Leviticus", "Num": "Numbers", "Deu": "Deuteronomy",
    "Josh": "Joshua", "Jdgs": "Judges", "Ruth": "Ruth", "1Sm": "1 Samuel", "2Sm": "2 Samuel",
    "1Ki": "1 Kings", "2Ki": "2 Kings", "1Chr": "1 Chronicles", "2Chr": "2 Chronicles",
    "Ezra": "Ezra", "Neh": "Nehemiah", "Est": "Esther", "Job": "Job", "Psa": "Psalms",
    "Prv": "Proverbs", "Eccl": "Ecclesiastes", "SSol": "Song of Solomon", "Isa": "Isaiah",
    "Jer": "Jeremiah", "Lam": "Lamentations", "Eze": "Ezekiel", "Dan": "Daniel", "Hos": "Hosea",
    "Joel": "Joel", "Amos": "Amos", "Obad": "Obadiah", "Jonah": "Jonah", "Mic": "Micah",
    "Nahum": "Nahum", "Hab": "Habakkuk", "Zep": "Zephaniah", "Hag": "Haggai", "Zec": "Zechariah",
    "Mal": "Malachi", "Mat": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John",
    "Acts": "Acts", "Rom": "Romans", "1Cor": "1 Corinthians", "2Cor": "2 Corinthians",
    "Gal": "Galatians", "Eph": "Ephesians", "Phi": "Philippians", "Col": "Colossians",
    "1Th": "1 Thessalonians", "2Th": "2 Thessalonians", "1Tim": "1 Timothy", "2Tim": "2 Timothy",
    "Titus": "Titus", "Phmn": "Philemon", "Heb": "Hebrews", "Jas": "James", "1Pet": "1 Peter",
    "2Pet": "2 Peter", "1Jn": "1 John", "2Jn": "2 John", "3Jn": "3 John", "Jude": "Jude",
    "Rev": "Revelation",
}
VERSE_COUNT = 31102   # verses in the KJV; a different count means the reader misbehaved


def read_bible(text_root, reader_root):
    reader = reader_root / "usr/bin/bible"
    data_dir = text_root / "usr/lib"
    # -f turns pretty-printing off: one verse per line, "Ge1:1 In the beginning ...".
    result = subprocess.run([str(reader), "-f", "-p", str(data_dir), "Gen1:1-Rev22:21"],
                            capture_output=True, check=True, stdin=subprocess.DEVNULL)
    chapters = {}
    for line in result.stdout.decode("utf-8").splitlines():
        m = re.fullmatch(r"(\d?[A-Za-z]+)(\d+):(\d+) (.*)", line.strip())
        if not m or m.group(1) not in BOOKS:
            raise RuntimeError(f"bible: unexpected line {line[:80]!r}")
        book, chapter, verse, text = BOOKS[m.group(1)], int(m.group(2)), int(m.group(3)), m.group(4)
        chapters.setdefault((book, chapter), []).append((verse, text))
    verses = sum(len(v) for v in chapters.values())
    if verses != VERSE_COUNT:
        raise RuntimeError(f"bible: read {verses} verses, expected {VERSE_COUNT}")
    docs = []
    for (book, chapter), lines in chapters.items():   # insertion order: canonical book order
        refs = [f"{book} {chapter}:{verse}" for verse, _ in lines]
        blocks = [Block("verse", f"{ref} {text}") for ref, (_, text) in zip(refs, lines)]
        doc = Document("bible-kjv-text", f"{book} {chapter}", f"{book} {chapter}", blocks, sep="\n")
        doc.facts = [Fact("verse", ref, text) for ref, (_, text) in zip(refs, lines)]
        docs.append(doc)
    return docs


# ------------------------------------------------------------------------------------------------
# fortunes, fortunes-min: fortune cookie files (strfile text, '%' lines between fortunes)

FORTUNES_PER_DOCUMENT = 25
FORTUNE_FILES_SKIPPED = {"ascii-art"}   # pictures, not text
# Debian ships the offensive fortunes in another package (fortunes-off), not read here; these words
# still mark a few sexual jokes among the rest, which are left out too.
FORTUNE_DROPPED_WORDS = re.compile(r"\b(erotic|porn|p0rn|sexy?|sexual|nude|naked|orgasm\w*)\b", re.I)


def read_fortunes(root, source):
    fortune_dir = root / "usr/share/games/fortunes"
    docs = []
    for path in _sorted_files(fortune_dir, "*"):
        if "." in path.name or path.name in FORTUNE_FILES_SKIPPED:
            continue   # .dat indexes, .u8 links
        text = re.sub(r".\x08", "", path.read_text(encoding="utf-8", errors="replace"))
        fortunes = []
        for chunk in re.split(r"^%$", text, flags=re.M):
            lines = [line.rstrip() for line in chunk.split("\n")]
            body = "\n".join(lines).strip("\n")
            if body.strip() and not FORTUNE_DROPPED_WORDS.search(body):
                fortunes.append(body)
        for start in range(0, len(fortunes), FORTUNES_PER_DOCUMENT):
            group = fortunes[start:start + FORTUNES_PER_DOCUMENT]
            doc = Document(source, f"{path.name}/{start // FORTUNES_PER_DOCUMENT:03d}", path.name,
                           [Block("fortune", f) for f in group], sep="\n%\n")
            doc.facts = [Fact("fortune", path.name, f) for f in group]
            docs.append(doc)
    return docs


# ------------------------------------------------------------------------------------------------
# debian-reference-en: the Debian Reference (DocBook HTML, one page per chapter)

DEBIAN_REFERENCE_RULES = HtmlRules(
    skip=(Selector("div", ("navheader",)), Selector("div", ("navfooter",)), Selector("div", ("toc",)),
          Selector("div", ("list-of-tables",)), Selector("div", ("list-of-figures",))),
    labels=(Selector("th", attrs=(("align", "left"),)),),   # "Note", "Tip", "Warning" boxes
    layout_tables=tuple(Selector("table", attrs=(("summary", s),))
                        for s in ("Note", "Tip", "Warning", "Caution", "Important")),
)


def read_debian_reference(root):
    ref_dir = root / "usr/share/debian-reference"
    docs = []
    for path in _sorted_files(ref_dir, "*.en.html"):
        stem = path.name[:-len(".en.html")]
        if stem == "index":
            continue   # title page and table of contents
        blocks = html_to_blocks(path.read_text(encoding="utf-8"), DEBIAN_REFERENCE_RULES)
        # A chapter is 50-400 KB: one document per top-level section makes the split finer.
        for title, part in _split_at_headings(blocks, max_level=2):
            doc = Document("debian-reference-en", f"{stem}/{title}", title, part)
            doc.facts = _section_facts(part, "the Debian Reference")
            docs.append(doc)
    return docs


def _split_at_headings(blocks, max_level):
    parts, current = [], []
    for block in blocks:
        if block.kind == "heading" and block.level <= max_level and current:
            parts.append(current)
            current = []
        current.append(block)
    if current:
        parts.append(current)
    return [(_first_heading(part, f"part {i}"), part) for i, part in enumerate(parts)]


# ------------------------------------------------------------------------------------------------
# debian-handbook: The Debian Administrator's Handbook (Publican HTML; English only)

HANDBOOK_RULES = HtmlRules(
    skip=(Selector("ul", ("docnav",)), Selector("div", ("toc",)), Selector("div", attrs=(("id", "banner"),)),
          Selector("p", attrs=(("id", "title"),)), Selector("div", ("index",))),
)


def read_debian_handbook(root):
    book_dir = root / "usr/share/doc/debian-handbook/html/en-US"
    docs = []
    for path in _sorted_files(book_dir, "*.html"):
        rel = path.relative_to(book_dir).with_suffix("").as_posix()
        if rel == "index" or rel.startswith("Common_Content"):
            continue
        blocks = html_to_blocks(path.read_text(encoding="utf-8"), HANDBOOK_RULES)
        doc = Document("debian-handbook", rel, _first_heading(blocks, rel), blocks)
        doc.facts = _section_facts(blocks, "the Debian Administrator's Handbook")
        docs.append(doc)
    return docs


# ------------------------------------------------------------------------------------------------
# sqlite3-doc: the SQLite documentation (hand-made HTML)

SQLITE_RULES = HtmlRules(
    skip=(Selector("div", ("tagline",)), Selector("div", ("menu",)), Selector("div", ("searchmenu",)),
          Selector("div", ("fancy_toc",)), Selector("div", ("imgcontainer",))),
)
# Cross-reference indexes, site maps, syntax-diagram pages (pictures only), the front pages, and pages
# that repeat others whole: capi3ref (every c3ref/ page on one page), requirements (sentences
# gathered from the other pages), changes (every releaselog/ page), fileformat (= fileformat2).
SQLITE_SKIPPED = re.compile(r"^(syntax/.*|.*_crossref|keyword_index|sitemap|doclist|docs|index|toc|"
                            r"syntaxdiagrams|c3ref/(funclist|constlist|objlist|intro)|"
                            r"session/(funclist|constlist|objlist|intro)|capi3ref|requirements|"
                            r"changes|fileformat)$")
# Syntax-diagram captions ("select-stmt:"), page dates, the running page headings of the C API
# pages and release hashes (with their heading).
SQLITE_DROPPED_LINES = re.compile(r"^([a-z0-9-]+:|This page last modified on .*|hide|show|"
                                  r"SQLite C Interface|Session Module C Interface|Hashes:|"
                                  r".*\b[0-9a-f]{40,}\b.*)$")


def read_sqlite_doc(root):
    doc_dir = root / "usr/share/doc/sqlite3"
    docs = []
    for path in _sorted_files(doc_dir, "*.html"):
        rel = path.relative_to(doc_dir).with_suffix("").as_posix()
        if SQLITE_SKIPPED.match(rel):
            continue
        blocks = html_to_blocks(path.read_text(encoding="utf-8", errors="replace"), SQLITE_RULES)
        blocks = [b for b in blocks if not SQLITE_DROPPED_LINES.match(b.text)]
        doc = Document("sqlite3-doc", rel, _first_heading(blocks, rel), blocks)
        doc.facts = _section_facts(blocks, "the SQLite documentation")
        docs.append(doc)
    return docs


# ------------------------------------------------------------------------------------------------

def read_all(fetched):
    """All documents, source by source in a fixed order; fetched is packages.fetch()'s result."""
    root = {name: f.root for name, f in fetched.items()}
    readers = (
        ("python3.11-doc", lambda: read_python_doc(root["python3.11-doc"])),
        ("manpages", lambda: read_man_pages(root["manpages"], "manpages")),
        ("manpages-dev", lambda: read_man_pages(root["manpages-dev"], "manpages-dev")),
        ("bible-kjv-text", lambda: read_bible(root["bible-kjv-text"], root["bible-kjv"])),
        ("fortunes", lambda: read_fortunes(root["fortunes"], "fortunes")),
        ("fortunes-min", lambda: read_fortunes(root["fortunes-min"], "fortunes-min")),
        ("debian-reference-en", lambda: read_debian_reference(root["debian-reference-en"])),
        ("debian-handbook", lambda: read_debian_handbook(root["debian-handbook"])),
        ("sqlite3-doc", lambda: read_sqlite_doc(root["sqlite3-doc"])),
    )
    for name, read in readers:
        yield name, read()
