#!/usr/bin/env python3
"""Tests of the corpus tools (stdlib unittest; no download needed).

Run: python3 -m unittest discover -s tools/mini -p 'test_*.py'   (or python3 tools/mini/test_mini.py)
The man page test needs groff; the sample test needs tests/data/mini/heldout_sample.txt.
"""
import pathlib
import random
import re
import shutil
import sys
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import chat_data  # noqa: E402
import corpus  # noqa: E402
import needles  # noqa: E402
import sources  # noqa: E402
from htmltext import Block, HtmlRules, Selector, html_to_blocks  # noqa: E402

SAMPLE = HERE.parents[1] / "tests" / "data" / "mini" / "heldout_sample.txt"


def texts(blocks):
    return [(b.kind, b.text) for b in blocks]


class HtmlTextTest(unittest.TestCase):
    def test_keeps_only_the_root_and_drops_skipped_elements(self):
        page = """<html><head><title>T</title></head><body>
          <div class="related">Previous topic <a href="x">Next topic</a></div>
          <div class="body" role="main"><h1>Title<a class="headerlink" href="#">¶</a></h1>
          <p>Kept   paragraph
             over lines.</p><div class="toc"><p>contents</p></div></div>
          <div class="footer">&copy; Copyright</div></body></html>"""
        rules = HtmlRules(root=Selector("div", ("body",), (("role", "main"),)),
                          skip=(Selector("a", ("headerlink",)), Selector("div", ("toc",))))
        self.assertEqual(texts(html_to_blocks(page, rules)),
                         [("heading", "Title"), ("prose", "Kept paragraph over lines.")])

    def test_pre_keeps_newlines_and_indentation(self):
        page = "<p>Example:</p><pre>\ndef f():\n    return 1\n\n\tx = 2   \n</pre><p>After</p>"
        self.assertEqual(texts(html_to_blocks(page, HtmlRules())),
                         [("prose", "Example:"), ("code", "def f():\n    return 1\n\n        x = 2"),
                          ("prose", "After")])

    def test_lists_tables_labels_and_unclosed_paragraphs(self):
        page = """<ul><li><p>one</p><p>more</p></li><li>two</li></ul>
          <table><tr><th> a </th><th>b</th></tr><tr><td><code>x</code>y</td><td><p>1</p><p>2</p></td></tr></table>
          <div class="note"><p class="title">Note</p><p>Be careful.</p></div>
          <p>first<p>second"""
        rules = HtmlRules(labels=(Selector("p", ("title",)),))
        self.assertEqual(texts(html_to_blocks(page, rules)),
                         [("item", "- one"), ("item", "more"), ("item", "- two"),
                          ("row", "a | b"), ("row", "xy | 1 2"), ("prose", "Note: Be careful."),
                          ("prose", "first"), ("prose", "second")])

    def test_layout_tables_are_not_rows(self):
        page = '<table summary="Tip"><tr><td>Tip</td></tr><tr><td><p>Use it.</p><p>Twice.</p></td></tr></table>'
        rules = HtmlRules(layout_tables=(Selector("table", attrs=(("summary", "Tip"),)),))
        self.assertEqual(texts(html_to_blocks(page, rules)),
                         [("prose", "Tip"), ("prose", "Use it."), ("prose", "Twice.")])

    def test_definition_terms_carry_their_anchor_and_role(self):
        page = ('<dl class="py function"><dt class="sig" id="os.path.join">os.path.join(path)</dt>'
                '<dd><p>Join paths.</p></dd></dl>')
        blocks = html_to_blocks(page, HtmlRules())
        self.assertEqual((blocks[0].kind, blocks[0].anchor, blocks[0].role),
                         ("term", "os.path.join", "py function"))
        facts = sources._python_definitions(blocks + [Block("prose", "x" * 50)])
        self.assertEqual(facts, [])   # "Join paths." is too short to be an answer
        blocks[1].text = "Join one or more path segments intelligently, as the documentation says."
        facts = sources._python_definitions(blocks)
        self.assertEqual([(f.key, dict(f.extra)["role"]) for f in facts], [("os.path.join", "function")])


@unittest.skipUnless(shutil.which("groff"), "groff is not installed")
class ManPageTest(unittest.TestCase):
    def test_renders_sections_without_header_footer_hyphenation_or_justification(self):
        page = pathlib.Path(self.tmp) / "frob.2"
        page.write_text(
            ".TH FROB 2 2023-01-01 \"Linux man-pages 6.03\"\n.SH NAME\nfrob \\- frobnicate a thing\n"
            ".SH DESCRIPTION\n" + "The frob() system call frobnicates extraordinarily "
            "incomprehensible internationalization characteristics. " * 6 + "\n.SH SEE ALSO\n"
            ".BR open (2)\n")
        text = sources._render_man(page)
        blocks = sources._man_blocks(text)
        self.assertEqual([b.text for b in blocks if b.kind == "heading"], ["NAME", "DESCRIPTION", "SEE ALSO"])
        body = "\n".join(b.text for b in blocks)
        self.assertNotIn("FROB(2)", body)
        self.assertNotIn("\u2010", body)   # no hyphenation
        self.assertNotRegex(body, r"\w  +\w")   # no justification gaps
        fact = sources._man_fact("frob", "2", blocks)
        self.assertEqual(dict(fact.extra)["summary"], "frob - frobnicate a thing")
        self.assertTrue(fact.text.startswith("The frob() system call frobnicates"))

    def setUp(self):
        import tempfile
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = self._dir.name

    def tearDown(self):
        self._dir.cleanup()


def doc(source, id, *paragraphs):
    return sources.Document(source, id, id, [Block("prose", p) for p in paragraphs])


class CorpusTest(unittest.TestCase):
    def test_clean_normalises_text(self):
        self.assertEqual(corpus.clean_block_text("Cafe\u0301\u00a0 au\tlait\x07 \n bien", "prose"),
                         "Caf\u00e9 au lait bien")
        self.assertEqual(corpus.clean_block_text("\n  x = 1   \n\n\n\n  y\x0c\n", "code"), "  x = 1\n\n  y")

    def test_repeated_paragraphs_are_removed_after_their_first_occurrence(self):
        long_a, long_b = "A paragraph that is long enough. " * 8, "Another, also long enough. " * 8
        stats = {"s": __import__("collections").Counter()}
        docs = corpus.clean([("s", [doc("s", "1", long_a, long_b), doc("s", "2", "  " + long_a, "Short.", long_b + "!"),
                                    doc("s", "3", long_b)])], stats)
        self.assertEqual([(d.id, [b.text[:7] for b in d.blocks]) for d in docs],
                         [("1", ["A parag", "Another"]), ("2", ["Short.", "Another"])])
        self.assertEqual(stats["s"]["duplicate_paragraphs"], 2)
        self.assertEqual(stats["s"]["short_documents"], 1)   # doc 3 had nothing new

    def test_empty_sections_lose_their_headings(self):
        blocks = [Block("heading", "A", 1), Block("heading", "B", 2), Block("prose", "x"),
                  Block("heading", "C", 1), Block("heading", "D", 1), Block("prose", "y"), Block("heading", "E", 1)]
        self.assertEqual([b.text for b in corpus.drop_empty_headings(blocks)], ["A", "B", "x", "D", "y"])

    def test_split_is_stable_and_every_source_has_held_out_text(self):
        docs = [doc(s, f"{s}-{i}", "text") for s in ("big", "small") for i in range(300 if s == "big" else 3)]
        train, heldout = corpus.split(docs)
        again = corpus.split(list(reversed(docs)))
        self.assertEqual({d.id for d in heldout}, {d.id for d in again[1]})
        self.assertEqual({d.source for d in heldout}, {"big", "small"})
        self.assertEqual(len(train) + len(heldout), len(docs))
        self.assertLess(len(heldout), 20)   # ~2% of 303, plus the one forced for "small"

    def test_heldout_order_puts_every_source_early(self):
        docs = []
        for s in ("a", "b", "c"):
            for n in (50, 9000, 10, 3000):
                d = doc(s, f"{s}{n}")
                d.text = "x" * n
                docs.append(d)
        order = [d.id for d in corpus.interleave_by_source(docs)]
        self.assertEqual(order[:6], ["a10", "b10", "c10", "a50", "b50", "c50"])
        self.assertEqual(order[-3:], ["a9000", "b9000", "c9000"])

    def test_sample_is_whole_documents_within_the_limit(self):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "s.txt"
            n, size = corpus.write_sample(["a" * 30_000, "b" * 29_000, "c" * 5_000], path)
            self.assertEqual(n, 2)
            self.assertEqual(path.read_text(), "a" * 30_000 + "\n\n" + "b" * 29_000 + "\n")


class NeedlesTest(unittest.TestCase):
    FILLER = [[f"Paragraph {d}.{p} says something ordinary about the weather, the sea and the hills."
               * 2 for p in range(30)] for d in range(5)]

    def test_case_holds_the_answer_under_its_key_and_distractors_under_others(self):
        rng = random.Random(1)
        for target in (600, 4096, 16384):
            case = needles.make_case(rng, needles.TRAIN_WORDS, self.FILLER, target, 5, list(range(1000, 10000)))
            question = re.search(r"Question: What is the (.+) for the (\w+) (\w+)\?\nAnswer:$", case.prompt)
            self.assertIsNotNone(question)
            attr, adj, noun = question.groups()
            found = re.findall(rf"the {attr} for the {adj} {noun} is (\d{{4}})\.", case.prompt, re.I)
            self.assertEqual(found, [case.answer.strip()])
            facts = re.findall(r"the ([A-Za-z ]+?) for the (\w+) (\w+) is (\d{4})\.", case.prompt, re.I)
            self.assertEqual(len(facts), 6)
            self.assertEqual(len({f[3] for f in facts}), 6)   # every value differs
            self.assertLess(abs(len(case.prompt) - target), max(250, target * 0.05))

    def test_eval_keys_and_values_never_appear_in_training(self):
        self.assertFalse(set(needles.TRAIN_WORDS.adjectives) & set(needles.EVAL_WORDS.adjectives))
        self.assertFalse(set(needles.TRAIN_WORDS.nouns) & set(needles.EVAL_WORDS.nouns))
        heldout = [{"source": "x", "text": "\n\n".join(p)} for p in self.FILLER[:2]]
        train = [{"source": "x", "text": "\n\n".join(p)} for p in self.FILLER[2:]]
        import tempfile
        import json
        with tempfile.TemporaryDirectory() as tmp:
            summary = needles.build(train, heldout, tmp, 200_000)
            evals = [json.loads(line) for name in needles.EVAL_LENGTHS
                     for line in pathlib.Path(f"{tmp}/needles_eval_{name}.jsonl").read_text().splitlines()]
            trains = [json.loads(line)["text"]
                      for line in pathlib.Path(f"{tmp}/needles_train.jsonl").read_text().splitlines()]
        self.assertEqual(len(evals), 3 * needles.EVAL_CASES)
        self.assertTrue(all(e["prompt"].endswith("Answer:") and re.fullmatch(r" \d{4}", e["answer"]) for e in evals))
        eval_answers = {e["answer"].strip() for e in evals}
        train_values = {v for t in trains for v in re.findall(r" is (\d{4})\.", t)}
        self.assertFalse(eval_answers & train_values)
        self.assertTrue(all(re.search(r"\nAnswer: \d{4}$", t) for t in trains))
        self.assertGreaterEqual(summary["train"]["chars"], 0.08 * 200_000)

    def test_same_seed_same_samples(self):
        a = needles.make_case(random.Random(5), needles.EVAL_WORDS, self.FILLER, 2000, 3, list(range(1000, 10000)))
        b = needles.make_case(random.Random(5), needles.EVAL_WORDS, self.FILLER, 2000, 3, list(range(1000, 10000)))
        self.assertEqual(a, b)


class ChatDataTest(unittest.TestCase):
    def test_turns_are_well_formed(self):
        d = doc("manpages-dev", "man2/frob.2")
        d.facts = [sources.Fact("man", "frob(2)", "The frob() call frobnicates.",
                                (("name", "frob"), ("section", "2"), ("summary", "frob - frobnicate a thing"))),
                   sources.Fact("verse", "John 11:35", "Jesus wept."),
                   sources.Fact("fortune", "computers", "Hardware: the parts of a computer you can kick.")]
        records = chat_data.build_turns([d] * 20, chat_data.TRAIN_QUOTAS, random.Random(0))
        self.assertEqual(len(records), 60)
        for record in records:
            roles = [m["role"] for m in record["messages"]]
            self.assertIn(roles, (["user", "assistant"], ["system", "user", "assistant"]))
            self.assertIn("reasoning_content", record["messages"][-1])
        answers = {r["messages"][-1]["content"] for r in records}
        self.assertIn("Jesus wept.", answers)
        self.assertIn("Frobnicate a thing.\n\nThe frob() call frobnicates.", answers)
        with_reasoning = sum(bool(r["messages"][-1]["reasoning_content"]) for r in records)
        self.assertTrue(15 <= with_reasoning <= 45, with_reasoning)

    def test_shorten_cuts_at_a_sentence(self):
        text = "First sentence here. Second sentence is longer than the limit allows."
        self.assertEqual(chat_data.shorten(text, 40), "First sentence here.")
        self.assertEqual(chat_data.shorten("word " * 30, 40), ("word " * 7).strip() + "...")


@unittest.skipUnless(SAMPLE.exists(), "tests/data/mini/heldout_sample.txt is not there")
class SampleTest(unittest.TestCase):
    def test_sample_is_real_text_of_every_kind(self):
        text = SAMPLE.read_text(encoding="utf-8")
        self.assertLessEqual(len(text.encode("utf-8")), corpus.SAMPLE_BYTES + 1)
        self.assertGreater(len(text), 30_000)
        kinds = {"a man page": r"(?m)^NAME\n {7}\S",
                 "a Bible verse": r"(?m)^([1-3] )?[A-Z][a-z]+( of Solomon)? \d+:\d+ \w",
                 "fortunes": r"\n%\n",
                 "a Python definition": r"(?m)^(class )?[a-z_]+\.[\w.]+\(",
                 "SQLite": r"sqlite3_\w+\(",
                 "Debian": r"\bDebian\b"}
        for kind, pattern in kinds.items():
            self.assertTrue(re.search(pattern, text), f"no {kind} in the sample")


if __name__ == "__main__":
    unittest.main()
