"""Short chat turns built from the corpus, for the chat-format phase of lode-mini's training: it
teaches the turn structure (system, user, assistant with reasoning_content) on answers that are the
corpus's own text. Train turns come from train documents only, held-out turns from held-out ones.

Each record: {"messages": [{"role": "system", ...}?, {"role": "user", "content"},
{"role": "assistant", "content", "reasoning_content"}]}; reasoning_content is a short templated
sentence in about half of them and empty in the rest.
"""
import random
import re
import unicodedata

# How many turns of each kind the train set gets (fewer where the corpus has fewer facts);
# the held-out set gets a twentieth, as far as the held-out documents have them.
TRAIN_QUOTAS = {"man": 900, "pydef": 1500, "verse": 800, "fortune": 500, "section": 700}
HELDOUT_SHARE = 0.05
SYSTEM_SHARE = 0.3
REASONING_SHARE = 0.5
MAX_ANSWER_CHARS = 700

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Keep your answers short.",
    "You are lode-mini, a small language model trained on documentation from Debian packages.",
    "Answer the user's question briefly and accurately.",
    "You answer questions about Linux, Python, SQLite and Debian.",
)
MAN_KINDS = {"1": "command", "8": "command", "2": "system call", "3": "library function"}
FORTUNE_TOPICS = {"computers", "science", "linux", "food", "love", "work", "education", "law",
                  "medicine", "pets", "sports", "politics", "humorists", "wisdom", "literature"}


def shorten(text, limit=MAX_ANSWER_CHARS):
    """text cut to at most limit characters at a sentence end (at a word, with "...", if the first
    sentence is longer)."""
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    if cut >= limit // 4:
        return text[:cut + 1]
    return text[:text.rfind(" ", 0, limit - 3)].rstrip(",;:") + "..."


def _extra(fact):
    return dict(fact.extra)


def _man_turn(rng, fact):
    extra = _extra(fact)
    name, section = extra["name"], extra["section"]
    names, _, what = extra["summary"].partition(" - ")
    if not what:
        return None
    kind = MAN_KINDS.get(section[:1])
    if kind == "command":
        question = rng.choice((f"What does the `{name}` command do?", f"What is `{name}` used for?",
                               f"Explain the {name} command."))
    elif kind:
        question = rng.choice((f"What does the {kind} `{name}` do?", f"What does {name}() do?",
                               f"Explain {name}({section})."))
    else:
        kind = "manual page"
        question = rng.choice((f"What is described in the {name}({section}) manual page?",
                               f"Tell me about {name}({section})."))
    answer = what[:1].upper() + what[1:].rstrip(".") + "."
    if fact.text:
        answer += "\n\n" + shorten(fact.text)
    reasoning = f"The user asks about {name}; its manual page, {name}({section}), says what it does."
    return question, answer, reasoning


def _pydef_turn(rng, fact):
    text = fact.text
    if text.endswith(":") or len(text) < 40:
        return None   # the paragraph introduces a list or example that is not part of the answer
    role, key = _extra(fact)["role"], fact.key
    if role in ("function", "method"):
        question = rng.choice((f"What does {key} do in Python?", f"In Python, what is {key}() for?",
                               f"Explain {key} from the Python standard library."))
    elif role == "exception":
        question = rng.choice((f"When is {key} raised in Python?", f"What is the {key} exception?"))
    elif role == "class":
        question = rng.choice((f"What is the {key} class in Python?", f"Explain Python's {key}."))
    else:
        question = rng.choice((f"What is {key} in Python?", f"Explain {key} in Python."))
    reasoning = f"The user asks about {key}, a {role} in Python; its documentation describes it."
    return question, shorten(text), reasoning


def _verse_turn(rng, fact):
    ref = fact.key
    question = rng.choice((f"Quote {ref}.", f"What does {ref} say?",
                           f"Recite {ref} from the King James Bible.", f"What is the text of {ref} (KJV)?"))
    reasoning = f"The user asks for {ref}; in the King James Version it reads as follows."
    return question, fact.text, reasoning


def _fortune_turn(rng, fact):
    if len(fact.text) > 500:
        return None
    topic = fact.key
    if topic in FORTUNE_TOPICS and rng.random() < 0.5:
        question = rng.choice((f"Tell me a fortune about {topic}.", f"Give me a fortune cookie about {topic}."))
    else:
        question = rng.choice(("Tell me a fortune.", "Give me a fortune cookie.", "Say something witty.",
                               "Tell me something from the fortune files."))
    reasoning = f"The user wants a fortune; here is one from the {topic} collection."
    return question, fact.text, reasoning


def _section_turn(rng, fact):
    title, book = fact.key, _extra(fact)["book"]
    if len(title.split()) < 2 or len(title) > 80 or fact.text.endswith(":"):
        return None   # "Overview", "Syntax": means nothing without its page; ":" opens an example
    question = rng.choice((f"What does {book} say about {title}?", f"Explain \"{title}\" ({book}).",
                           f"Summarise the section \"{title}\" of {book}."))
    reasoning = f"The user asks about {title}; {book} has a section with that title."
    return question, shorten(fact.text), reasoning


TURN_MAKERS = {"man": _man_turn, "pydef": _pydef_turn, "verse": _verse_turn,
               "fortune": _fortune_turn, "section": _section_turn}


def _record(rng, question, answer, reasoning):
    question, answer, reasoning = (unicodedata.normalize("NFC", t) for t in (question, answer, reasoning))
    messages = []
    if rng.random() < SYSTEM_SHARE:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": question})
    messages.append({"role": "assistant", "content": answer,
                     "reasoning_content": reasoning if rng.random() < REASONING_SHARE else ""})
    return {"messages": messages}


def build_turns(docs, quotas, rng):
    """Chat records from the facts of docs (sources.Document), up to quotas[kind] of each kind."""
    by_kind = {kind: [] for kind in TURN_MAKERS}
    for doc in docs:
        for fact in doc.facts:
            by_kind[fact.kind].append(fact)
    records = []
    for kind, make in TURN_MAKERS.items():
        facts = by_kind[kind]
        rng.shuffle(facts)
        made = 0
        for fact in facts:
            if made == quotas[kind]:
                break
            turn = make(rng, fact)
            if turn and all(re.search(r"\S", part) for part in turn[:2]):
                records.append(_record(rng, *turn))
                made += 1
    rng.shuffle(records)
    return records


def build(train_docs, heldout_docs, seed):
    """(train records, held-out records)."""
    train = build_turns(train_docs, TRAIN_QUOTAS, random.Random(seed))
    heldout_quotas = {k: max(1, round(v * HELDOUT_SHARE)) for k, v in TRAIN_QUOTAS.items()}
    heldout = build_turns(heldout_docs, heldout_quotas, random.Random(seed + 1))
    return train, heldout
