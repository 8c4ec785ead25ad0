"""Long-input kinds of prompt for the default pool: whole documents to summarise or mine,
several documents with a question about one of them, and standard-library functions' source
to explain, annotate or rewrite.

These are the tasks whose responses lean on a long input (a summary reuses the document's
words, an edit copies most of the code), which the short passages of
:mod:`specstrat.train.prompt_kinds` leave out. Each kind is a function of the Python version's
standard library and of constants here only, so one interpreter always builds the same prompts
in the same order. None of the wording comes from a benchmark (a test checks the pool against
Spec-Bench).
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from collections.abc import Iterator

from specstrat.train.prompt_kinds import PASSAGE_MODULES

__all__ = ["SOURCE_MODULES", "code_prompts", "document_prompts", "documents", "rag_prompts"]

#: Modules whose pure-Python functions and methods give the code to work on.
SOURCE_MODULES = (
    *("argparse", "base64", "bisect", "calendar", "colorsys", "configparser", "copy", "csv"),
    *("dataclasses", "difflib", "enum", "fnmatch", "fractions", "functools", "glob", "heapq"),
    *("html", "inspect", "ipaddress", "json.decoder", "json.encoder", "mimetypes", "ntpath"),
    *("pathlib", "posixpath", "pprint", "queue", "random", "sched", "shlex", "shutil"),
    *("statistics", "string", "tempfile", "textwrap", "tokenize", "uuid", "zipfile"),
)

_DOCUMENT_TASKS = (
    "Write a summary of the following document in one paragraph.\n\n{text}",
    "{text}\n\nSum up the text above in three short bullet points.",
    "Give the document below a title, then summarise it in about fifty words.\n\n{text}",
    "Here is a piece of technical documentation:\n\n{text}\n\nWhat are the key facts a "
    "programmer should remember from it?",
    "Read this and explain it to a colleague in your own words, keeping every detail that "
    "matters.\n\n{text}",
    "From the text below, list each function, class, method or option it mentions, with what "
    "the text says about it.\n\n{text}",
)

_CODE_TASKS = (
    "Explain what this Python function does, step by step.\n\n```python\n{code}\n```",
    "Add a comment above every few lines of this code saying what they do, and return the "
    "whole function.\n\n```python\n{code}\n```",
    "```python\n{code}\n```\n\nRewrite this function so it is easier to read, keeping its "
    "behaviour the same.",
    "Add type hints to this function and return the complete code.\n\n```python\n{code}\n```",
    "Write pytest tests for the following function.\n\n```python\n{code}\n```",
    "Is there an input for which this code fails or behaves surprisingly? Explain.\n\n"
    "```python\n{code}\n```",
)


def _prose(doc: str) -> Iterator[str]:
    """The docstring's prose paragraphs of 15 words or more (no examples, lists or tables)."""
    for part in doc.split("\n\n"):
        text = " ".join(part.split())
        if len(text.split()) >= 15 and not text.startswith((">>>", "-", "*", "+", "|", "%")):
            yield text


def documents(min_words: int = 100, max_words: int = 300) -> tuple[tuple[str, str], ...]:
    """``(name, text)`` documents of ``min_words`` to ``max_words`` words: consecutive prose
    paragraphs of one docstring (the module's, then its public names' in sorted order, over
    :data:`~specstrat.train.prompt_kinds.PASSAGE_MODULES`), a new document started where the
    next paragraph would pass ``max_words``."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for module_name in PASSAGE_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if n[:1] != "_"]
        owners: list[tuple[str, object]] = [(module_name, module)]
        owners += [(f"{module_name}.{n}", getattr(module, n, None)) for n in sorted(names)]
        for name, obj in owners:
            doc = inspect.getdoc(obj) or ""
            if doc in seen:
                continue
            seen.add(doc)
            chunk: list[str] = []
            for paragraph in (*_prose(doc), None):
                words = sum(len(p.split()) for p in chunk)
                if paragraph is None or words + len(paragraph.split()) > max_words:
                    if words >= min_words:
                        out.append((name, "\n\n".join(chunk)))
                    chunk = []
                if paragraph is not None:
                    chunk.append(paragraph)
    return tuple(out)


def document_prompts() -> tuple[str, ...]:
    """A task around each of :func:`documents` (summarise, list the key points, title and
    summary, key facts, explain, list what it names), the tasks taken in turn."""
    return tuple(
        _DOCUMENT_TASKS[i % len(_DOCUMENT_TASKS)].format(text=text)
        for i, (_, text) in enumerate(documents())
    )


def rag_prompts(per_question: int = 3) -> tuple[str, ...]:
    """For each of :func:`documents`, a question answered by it, asked over ``per_question``
    numbered documents: it and the documents that follow it (wrapping round), placed in turn
    first, second, third, ..."""
    docs = documents(min_words=40, max_words=120)
    out: list[str] = []
    for i, (name, _) in enumerate(docs):
        chosen = [docs[(i + k) % len(docs)] for k in range(per_question)]
        where = i % per_question
        chosen[0], chosen[where] = chosen[where], chosen[0]
        body = "\n\n".join(f"Document [{n}]:\n{text}" for n, (_, text) in enumerate(chosen, 1))
        out.append(
            f"{body}\n\nUsing only the documents above, answer: what does the documentation of "
            f"`{name}` say it does? Cite the document number you used."
        )
    return tuple(out)


def _functions(module: object) -> Iterator[object]:
    """The module's own public functions and every method of its own public classes, sorted
    by name."""
    home = getattr(module, "__name__", "")
    for name in sorted(n for n in vars(module) if n[:1] != "_"):
        obj = vars(module)[name]
        if getattr(obj, "__module__", None) != home:
            continue
        if inspect.isfunction(obj):
            yield obj
        elif inspect.isclass(obj):
            yield from (vars(obj)[m] for m in sorted(vars(obj)) if inspect.isfunction(vars(obj)[m]))


def code_prompts(min_lines: int = 6, max_lines: int = 30) -> tuple[str, ...]:
    """A task around the source of each function and method of :data:`SOURCE_MODULES` that
    has ``min_lines`` to ``max_lines`` lines (explain, comment, rewrite, add type hints, write
    tests, find a failing input), the tasks taken in turn. Functions whose source cannot be
    read are skipped."""
    out: list[str] = []
    seen: set[str] = set()
    for module_name in SOURCE_MODULES:
        for func in _functions(importlib.import_module(module_name)):
            try:
                code = textwrap.dedent(inspect.getsource(func)).rstrip()  # type: ignore[arg-type]
            except (OSError, TypeError):
                continue
            if not min_lines <= code.count("\n") + 1 <= max_lines or code in seen:
                continue
            seen.add(code)
            out.append(_CODE_TASKS[len(out) % len(_CODE_TASKS)].format(code=code))
    return tuple(out)
