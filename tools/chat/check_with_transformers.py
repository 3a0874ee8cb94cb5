#!/usr/bin/env python3
"""Checks tests/data/chat/rendered.json against Hugging Face transformers' own chat-template
renderer (run on the GPU machine, which has transformers): every conversation of conversations.json
rendered with the same template through transformers.utils.chat_template_utils.render_jinja_template,
which is what tokenizer.apply_chat_template calls. Prints the agreement; exit code 1 on any difference.

Usage: tools/chat/check_with_transformers.py [--data DIR]   (DIR defaults to tests/data/chat)
"""
import argparse
import json
import pathlib
import sys

import transformers
from transformers.utils.chat_template_utils import render_jinja_template


def render(template, case):
    kwargs = {}
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    try:
        rendered, _ = render_jinja_template(
            conversations=[case["messages"]], tools=case.get("tools"), chat_template=template,
            add_generation_prompt=case.get("add_generation_prompt", True), **kwargs)
        return {"name": case["name"], "rendered": rendered[0]}
    except Exception as error:  # the template's raise_exception() surfaces as a TemplateError
        return {"name": case["name"], "error": str(error)}


def main():
    repo = pathlib.Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=repo / "tests" / "data" / "chat")
    args = parser.parse_args()
    template = (args.data / "qwen35_chat_template.jinja").read_text(encoding="utf-8")
    cases = json.loads((args.data / "conversations.json").read_text(encoding="utf-8"))
    expected = json.loads((args.data / "rendered.json").read_text(encoding="utf-8"))
    same = 0
    for case, want in zip(cases, expected):
        got = render(template, case)
        if "error" in want:
            ok = "error" in got and want["error"] in got["error"]
        else:
            ok = got.get("rendered") == want["rendered"]
        same += ok
        if not ok:
            print(f"DIFFERS: {case['name']}\n  transformers: {got!r:.400}\n  reference:    {want!r:.400}")
    print(f"transformers {transformers.__version__}: {same}/{len(cases)} conversations identical")
    return 0 if same == len(cases) == len(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
