"""Prompts a head trains on: a license-clean default pool built offline, or a user's JSONL file.

The default pool has two parts, both made on this machine with nothing downloaded:

- instructions written around the Python standard library's own functions and their docstrings
  (``inspect`` over :data:`STDLIB_MODULES`, names in sorted order, one of four phrasings per
  function in turn), e.g. "Explain what `textwrap.dedent` does and give an example.";
- :data:`CHAT_TOPICS`, short everyday requests written for this module.

The pool depends only on the Python version's standard library, so one interpreter always builds
the same pool in the same order. Benchmark prompts (Spec-Bench) are never part of it: a test
checks that no pool prompt shares an 8-word run with a Spec-Bench turn.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path

from specstrat.errors import InvalidConfig

__all__ = ["CHAT_TOPICS", "STDLIB_MODULES", "default_prompts", "read_prompts", "stdlib_prompts"]

#: The standard-library modules whose public functions the instructions are written around.
STDLIB_MODULES = (
    *("base64", "bisect", "calendar", "collections", "copy", "csv", "difflib", "fnmatch"),
    *("functools", "glob", "hashlib", "heapq", "html", "itertools", "json", "math"),
    *("operator", "os.path", "pprint", "random", "re", "secrets", "shlex", "shutil"),
    *("statistics", "string", "textwrap", "unicodedata", "urllib.parse", "zlib"),
)

#: Everyday requests, written for this module (no benchmark's wording).
CHAT_TOPICS = (
    "Suggest three names for a small bakery that sells sourdough and rye bread.",
    "How do I keep basil alive on a windowsill through the winter?",
    "Describe the water cycle to a ten-year-old in a few sentences.",
    "Give me a packing list for a two-night camping trip in late autumn.",
    "What is the difference between weather and climate?",
    "Write a four-line poem about a lighthouse keeper's cat.",
    "How can I politely decline a meeting invitation from a colleague?",
    "Explain how a bicycle's gears make climbing hills easier.",
    "Plan a vegetarian dinner for four with a soup, a main dish and a dessert.",
    "What should I check before buying a used car?",
    "Summarise the rules of chess for someone who has never played.",
    "Why does bread go stale, and how can I slow it down?",
    "Give tips for practising a musical instrument with only twenty minutes a day.",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "How do noise-cancelling headphones work?",
    "Explain compound interest with a small worked example.",
    "Suggest a weekly routine for learning to draw faces.",
    "What are some good ways to remember people's names?",
    "Describe how a rainbow forms after a storm.",
    "Write a riddle whose answer is a shadow.",
    "How can a small team run better stand-up meetings?",
    "List five board games that work well with two players and say why.",
    "What makes a good first sentence in a short story?",
    "Explain why the sky looks orange at sunset.",
    "How do I clean a cast-iron pan without ruining its coating?",
    "Give a beginner's plan for running five kilometres in eight weeks.",
    "Write a limerick about a forgetful robot.",
    "What is the difference between a virus and a bacterium?",
    "How should I organise a bookshelf that holds two hundred books?",
    "Explain what a budget spreadsheet is and how to start one.",
    "Suggest activities for a rainy afternoon with two young children.",
    "Why do onions make people cry when they are chopped?",
    "Describe a calm morning at a harbour in three sentences.",
    "How do bees decide where to build a new hive?",
    "Give advice for writing a clear bug report.",
    "What are the pros and cons of working from home?",
    "Explain how a refrigerator keeps food cold.",
    "Write a dialogue between a teapot and a coffee mug.",
    "How can I make a small balcony feel like a garden?",
    "What is a good way to learn the basics of a new language in a month?",
)

_PHRASINGS = (
    "Explain what `{name}` does and give an example.",
    "Write a small Python program that uses `{name}` and explain what it prints.",
    'The documentation of `{name}` begins: "{doc}" Explain this in plain words for a beginner.',
    "What mistakes do people make with `{name}`? Show a correct use.",
)


def _first_line(obj: object) -> str:
    """The docstring's first line, or "" when it has none (or it is only a signature)."""
    doc = inspect.getdoc(obj) or ""
    line = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    return "" if "(" in line.split(" ", 1)[0] else line


def stdlib_prompts() -> tuple[str, ...]:
    """Instructions around the documented public functions of :data:`STDLIB_MODULES`: each
    module's names in sorted order (``__all__`` where it has one), phrasings taken in turn."""
    out: list[str] = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        for name in sorted(names):
            obj = getattr(module, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = _first_line(obj)
            if not doc:
                continue
            phrasing = _PHRASINGS[len(out) % len(_PHRASINGS)]
            out.append(phrasing.format(name=f"{module_name}.{name}", doc=doc))
    return tuple(out)


def default_prompts() -> tuple[str, ...]:
    """The default pool: :func:`stdlib_prompts` and :data:`CHAT_TOPICS` interleaved evenly (each
    list keeps its order), so any prefix of the pool mixes both kinds."""
    parts = (stdlib_prompts(), CHAT_TOPICS)
    keyed = [
        ((i + 0.5) / len(part), k, p) for k, part in enumerate(parts) for i, p in enumerate(part)
    ]
    return tuple(p for _, _, p in sorted(keyed))


def read_prompts(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """A user's prompts from a JSONL file: one ``{"prompt": "..."}`` object per line (blank lines
    skipped). A line that is not JSON, has no ``"prompt"`` string, or an empty one raises
    :class:`~specstrat.errors.InvalidConfig` naming the file and the line number."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfig(
            f"prompts={str(file)!r} cannot be read ({exc}); pass a UTF-8 JSONL file with one "
            '{"prompt": "..."} object per line'
        ) from exc
    prompts: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidConfig(
                f"{where} is not JSON ({exc.msg}); write one object per line, e.g. "
                '{"prompt": "Explain recursion."}'
            ) from exc
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str):
            raise InvalidConfig(
                f'{where} has no "prompt" string (got {line.strip()[:60]!r}); write '
                '{"prompt": "..."} on each line'
            )
        if not prompt.strip():
            raise InvalidConfig(f'{where}: "prompt" is empty; remove the line or write a prompt')
        prompts.append(prompt)
    if not prompts:
        raise InvalidConfig(f'prompts={str(file)!r} holds no prompt; add {{"prompt": ...}} lines')
    return tuple(prompts)
