"""Prompts a head trains on: a license-clean default pool built offline, or a user's JSONL file.

The default pool has five parts, all made on this machine with nothing downloaded:

- instructions written around the Python standard library's own functions and classes and
  their docstrings (``inspect`` over :data:`STDLIB_MODULES`, names in sorted order, two of six
  phrasings per name in turn), e.g. "Explain what `textwrap.dedent` does and give an example.";
- tasks around passages of the standard library's docstrings (summarise, list, rewrite,
  translate, answer from the passage, extract terms;
  :func:`~specstrat.train.prompt_kinds.passage_prompts`);
- long inputs: whole docstrings to summarise or mine, several numbered documents with a
  question about one, and standard-library functions' source to explain, comment, rewrite,
  annotate or test (:mod:`specstrat.train.prompt_documents`);
- arithmetic word problems from a fixed seed (:func:`~specstrat.train.prompt_kinds.math_prompts`);
- everyday requests written for this module: :data:`CHAT_TOPICS`, writing tasks, role plays and
  explanations (:func:`~specstrat.train.prompt_kinds.chat_prompts`).

The pool depends only on the Python version's standard library, so one interpreter always builds
the same pool in the same order. Benchmark prompts (Spec-Bench) are never part of it: a test
checks that no pool prompt shares an 8-word run with a Spec-Bench turn.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Sequence
from pathlib import Path

from specstrat.errors import InvalidConfig
from specstrat.train.prompt_documents import code_prompts, document_prompts, rag_prompts
from specstrat.train.prompt_kinds import chat_prompts, math_prompts, passage_prompts

__all__ = [
    "STDLIB_MODULES",
    "default_prompts",
    "interleave",
    "read_prompts",
    "stdlib_prompts",
]

#: The standard-library modules whose public functions and classes the instructions are written
#: around.
STDLIB_MODULES = (
    *("argparse", "base64", "bisect", "calendar", "cmath", "collections", "colorsys"),
    *("contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum"),
    *("fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html"),
    *("inspect", "io", "ipaddress", "itertools", "json", "logging", "math", "operator"),
    *("os.path", "pathlib", "pickle", "pprint", "queue", "random", "re", "secrets", "shlex"),
    *("shutil", "sqlite3", "statistics", "string", "struct", "tempfile", "textwrap"),
    *("threading", "time", "unicodedata", "urllib.parse", "uuid", "zipfile", "zlib"),
)

_PHRASINGS = (
    "Explain what `{name}` does and give an example.",
    "Write a small Python program that uses `{name}` and explain what it prints.",
    'The documentation of `{name}` begins: "{doc}" Explain this in plain words for a beginner.',
    "What mistakes do people make with `{name}`? Show a correct use.",
    "Write a function with type hints and a docstring that uses `{name}`, and a test for it.",
    "Compare `{name}` with another way to do the same job in Python. When is each better?",
)


def _first_line(obj: object) -> str:
    """The docstring's first line, or "" when it has none (or it is only a signature)."""
    doc = inspect.getdoc(obj) or ""
    line = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    return "" if "(" in line.split(" ", 1)[0] else line


def stdlib_prompts() -> tuple[str, ...]:
    """Instructions around the documented public functions and classes (the module's own) of
    :data:`STDLIB_MODULES`: each module's names in sorted order (``__all__`` where it has one),
    two phrasings per name, the phrasings taken in turn."""
    out: list[str] = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        for name in sorted(names):
            obj = getattr(module, name, None)
            home = str(getattr(obj, "__module__", "")).lstrip("_").split(".")[0]
            own_class = inspect.isclass(obj) and home == module.__name__.split(".")[0]
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or own_class):
                continue
            doc = _first_line(obj)
            if not doc:
                continue
            for _ in range(2):
                phrasing = _PHRASINGS[len(out) % len(_PHRASINGS)]
                out.append(phrasing.format(name=f"{module_name}.{name}", doc=doc))
    return tuple(out)


def default_prompts() -> tuple[str, ...]:
    """The default pool: :func:`stdlib_prompts`, passages, long inputs, word problems and
    everyday requests (see the module docstring) interleaved evenly (each part keeps its order),
    so any prefix of the pool mixes every kind. Duplicates are dropped (the first kept)."""
    parts = (
        *(stdlib_prompts(), passage_prompts(), document_prompts(), rag_prompts()),
        *(code_prompts(), math_prompts(), chat_prompts()),
    )
    return interleave(*parts)


def interleave(*parts: Sequence[str]) -> tuple[str, ...]:
    """The prompts of ``parts`` spread evenly through one sequence, each part keeping its order
    (the ``i``-th of ``n`` prompts sits at ``(i + 0.5) / n``; ties go to the earlier part), so
    any prefix mixes every part; duplicates dropped, the first kept."""
    keyed = [
        ((i + 0.5) / len(part), k, p) for k, part in enumerate(parts) for i, p in enumerate(part)
    ]
    return tuple(dict.fromkeys(p for _, _, p in sorted(keyed)))


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
