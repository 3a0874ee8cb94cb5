#!/usr/bin/env python3
"""Renders tests/data/chat/conversations.json with Qwen3.5's Jinja chat template, the way Hugging
Face transformers' apply_chat_template does, into tests/data/chat/rendered.json.

lode renders the template natively in C++ (src/chat/template.cpp); tests/test_chat_template.cpp
compares its output with these renderings byte for byte. Needs python3 and jinja2 (3.1.x).

Usage: tools/chat/render_reference.py [--data DIR]   (DIR defaults to tests/data/chat)
"""
import argparse
import json
import pathlib

import jinja2
import jinja2.ext
import jinja2.sandbox


class TemplateError(Exception):
    """What the template's raise_exception() raises; its message is what the test expects."""


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja's tojson (which HTML-escapes) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def make_template(source):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def render_case(template, case):
    variables = {
        "messages": case["messages"],
        "add_generation_prompt": case.get("add_generation_prompt", True),
    }
    if "tools" in case:
        variables["tools"] = case["tools"]
    if "enable_thinking" in case:
        variables["enable_thinking"] = case["enable_thinking"]
    try:
        return {"name": case["name"], "rendered": template.render(**variables)}
    except TemplateError as error:
        return {"name": case["name"], "error": str(error)}


def main():
    repo = pathlib.Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=pathlib.Path, default=repo / "tests" / "data" / "chat")
    args = parser.parse_args()

    template = make_template((args.data / "qwen35_chat_template.jinja").read_text(encoding="utf-8"))
    cases = json.loads((args.data / "conversations.json").read_text(encoding="utf-8"))
    names = [case["name"] for case in cases]
    if len(set(names)) != len(names):
        raise SystemExit("conversations.json: case names must be unique")
    results = [render_case(template, case) for case in cases]
    out = args.data / "rendered.json"
    out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in result for result in results)
    print(f"wrote {out}: {len(results)} cases ({errors} raise an error)")


if __name__ == "__main__":
    main()
