"""HTML documentation pages to text blocks, with Python's html.parser (stdlib only).

A page becomes a list of Blocks: headings, prose paragraphs (whitespace collapsed to one line),
list items ("- " prefix), table rows (cells joined with " | "), definition terms, and code (the
text of <pre>, newlines and indentation kept). Navigation, tables of contents and other page
furniture are left out through per-source rules (`HtmlRules`): the content root to keep and the
elements to skip.
"""
import dataclasses
import html.parser
import re

HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
# Elements whose start or end ends the paragraph being collected.
BLOCK_TAGS = {
    "address", "article", "aside", "blockquote", "body", "br", "caption", "dd", "div", "dl", "dt",
    "figcaption", "figure", "footer", "form", "header", "hr", "li", "main", "nav", "ol", "p", "pre",
    "section", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul", *HEADINGS,
}
ROW_PARTS = {"table", "thead", "tbody", "tfoot", "tr"}   # the tags that still end a table row
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
             "source", "track", "wbr"}
ALWAYS_SKIPPED = {"script", "style", "svg", "head", "title", "noscript", "map", "object", "button",
                  "select", "textarea", "math"}
# HTML lets these close implicitly (sqlite's pages rely on it): a new <li> ends the open <li>, etc.
IMPLICIT_CLOSE = {
    "p": {"p"}, "li": {"li", "p"}, "dt": {"dt", "dd", "p"}, "dd": {"dt", "dd", "p"},
    "tr": {"tr", "td", "th", "p"}, "td": {"td", "th", "p"}, "th": {"td", "th", "p"},
}


@dataclasses.dataclass
class Block:
    kind: str          # "heading", "prose", "item", "term", "row", "code"
    text: str
    level: int = 0     # heading level (1 = h1)
    anchor: str = ""   # the id of a <dt> or heading, where it has one (Sphinx: "os.path.join")
    role: str = ""     # for terms: the class of their <dl> (Sphinx: "py function", "py class")


@dataclasses.dataclass(frozen=True)
class Selector:
    """Matches an element by tag (None: any) and by class names and attributes it must have."""
    tag: str | None = None
    classes: tuple = ()
    attrs: tuple = ()   # (name, value) pairs

    def matches(self, tag, attrs):
        if self.tag is not None and tag != self.tag:
            return False
        have = dict(attrs)
        names = (have.get("class") or "").split()
        return all(c in names for c in self.classes) and all(have.get(k) == v for k, v in self.attrs)


@dataclasses.dataclass(frozen=True)
class HtmlRules:
    root: Selector | None = None   # keep only text inside this element (None: the whole <body>)
    skip: tuple = ()               # Selectors of elements left out with everything inside them
    labels: tuple = ()             # Selectors of short titles ("Note") put before the next paragraph
    layout_tables: tuple = ()      # Selectors of tables that lay out boxes rather than hold data


@dataclasses.dataclass
class _Open:
    tag: str
    skipped: bool
    is_root: bool
    emitted: bool = False   # for <li>: its first paragraph (the one marked "- ") is out
    label: bool = False
    classes: str = ""
    layout: bool = False    # for <table>: a layout table, whose cells are ordinary blocks


class _Converter(html.parser.HTMLParser):
    def __init__(self, rules):
        super().__init__(convert_charrefs=True)
        self.rules = rules
        self.blocks = []
        self.stack = []
        self.inline = []        # text pieces of the paragraph being collected
        self.pre = None         # pieces of the <pre> being collected, or None
        self.root_depth = 0 if rules.root is None else -1   # >0 (or 0 without root): capturing
        self.skip_depth = 0
        self.pending_anchor = ""
        self.pending_label = ""

    # -- structure --------------------------------------------------------------------------
    def capturing(self):
        return self.skip_depth == 0 and (self.rules.root is None or self.root_depth > 0)

    def handle_starttag(self, tag, attrs):
        closes = IMPLICIT_CLOSE.get(tag)
        if closes is None and tag in BLOCK_TAGS:
            closes = {"p"}
        while closes and self.stack and self.stack[-1].tag in closes:
            self._pop()
        in_row = self._in_data_row()
        if tag in BLOCK_TAGS:
            if in_row and tag not in ROW_PARTS:
                self.inline.append(" ")   # a paragraph or line break inside a table cell
            else:
                self._flush()
        if tag in VOID_TAGS:
            if tag == "br" and self.pre is not None:
                self.pre.append("\n")
            return
        skipped = tag in ALWAYS_SKIPPED or any(s.matches(tag, attrs) for s in self.rules.skip)
        is_root = self.rules.root is not None and self.root_depth < 0 and self.rules.root.matches(tag, attrs)
        label = any(s.matches(tag, attrs) for s in self.rules.labels)
        layout = tag == "table" and any(s.matches(tag, attrs) for s in self.rules.layout_tables)
        self.stack.append(_Open(tag, skipped, is_root, label=label, classes=dict(attrs).get("class") or "",
                                layout=layout))
        if skipped:
            self.skip_depth += 1
        if is_root:
            self.root_depth = 1
        elif self.root_depth > 0:
            self.root_depth += 1
        if not self.capturing():
            return
        anchor = dict(attrs).get("id") or ""
        if tag in HEADINGS or tag == "dt":
            self.pending_anchor = anchor
        if tag == "pre" and not in_row:
            self.pre = []
        elif tag in ("td", "th") and "".join(self.inline).strip():
            self.inline.append(" | ")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in VOID_TAGS or not any(o.tag == tag for o in self.stack):
            return   # a stray end tag: ignore it rather than unwind the page
        while self.stack:
            if self._pop().tag == tag:
                break

    def _pop(self):
        top = self.stack[-1]
        if top.label and self.capturing():
            label = re.sub(r"\s+", " ", "".join(self.inline)).strip().rstrip(":")
            self.inline = []
            self.pending_label = f"{label}: " if label else ""
        elif (top.tag in BLOCK_TAGS and self.capturing() and
              not (top.tag not in ROW_PARTS and self._in_data_row())):
            self._flush(ending=top.tag)
        self.stack.pop()
        if top.skipped:
            self.skip_depth -= 1
        if self.root_depth > 0:
            self.root_depth -= 1
            if top.is_root:
                self.root_depth = -1   # the root is closed: wait for another one
        return top

    def handle_data(self, data):
        if not self.capturing():
            return
        if self.pre is not None:
            self.pre.append(data)
        else:
            self.inline.append(data)

    # -- output -----------------------------------------------------------------------------
    def _in_data_row(self):
        """Inside a row of a data table, whose cells are gathered into one line."""
        in_row = False
        for o in reversed(self.stack):
            if o.tag == "tr":
                in_row = True
            elif o.tag == "table":
                return in_row and not o.layout
        return False

    def _context(self):
        layout_row = False
        for o in reversed(self.stack):
            if o.tag in HEADINGS:
                return "heading", HEADINGS[o.tag]
            if o.tag == "tr":
                layout_row = True   # unless its table says otherwise, just below
            elif o.tag == "table":
                if layout_row and not o.layout:
                    return "row", 0
                layout_row = False
            elif o.tag in ("li", "dt"):
                return {"li": "item", "dt": "term"}[o.tag], 0
        return "prose", 0

    def _flush(self, ending=None):
        if ending == "pre" and self.pre is not None:
            code = "".join(self.pre)
            self.pre = None
            lines = [line.rstrip() for line in code.expandtabs(8).split("\n")]
            while lines and not lines[0]:
                lines.pop(0)
            while lines and not lines[-1]:
                lines.pop()
            if lines:
                self.blocks.append(Block("code", "\n".join(lines)))
            return
        if self.pre is not None:
            return   # block tags inside <pre> (rare) do not split it
        text = re.sub(r"\s+", " ", "".join(self.inline)).strip()
        self.inline = []
        if not text or text == "|":
            return
        kind, level = self._context()
        if self.pending_label and kind not in ("heading", "code"):
            text, self.pending_label = self.pending_label + text, ""
        anchor = ""
        if kind in ("heading", "term"):
            anchor, self.pending_anchor = self.pending_anchor, ""
        if kind == "item":
            item = next(o for o in reversed(self.stack) if o.tag == "li")
            if not item.emitted:   # only the first paragraph of a list item is marked
                text = "- " + text
                item.emitted = True
        role = ""
        if kind == "term":
            role = next((o.classes for o in reversed(self.stack) if o.tag == "dl"), "")
        self.blocks.append(Block(kind, text, level, anchor, role))


def html_to_blocks(source, rules):
    """Returns the Blocks of one HTML page (str) under the given rules."""
    converter = _Converter(rules)
    converter.feed(source)
    converter.close()
    while converter.stack:
        converter._pop()
    converter._flush()
    return converter.blocks
