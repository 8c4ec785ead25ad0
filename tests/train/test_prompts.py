"""The default prompt pool is deterministic, mixes both kinds and shares nothing with Spec-Bench;
read_prompts reads a JSONL file and refuses a bad line by file and line number."""

import json
import re
from pathlib import Path

import pytest

from specstrat.errors import InvalidConfig
from specstrat.train import (
    CHAT_TOPICS,
    chat_prompts,
    code_prompts,
    default_prompts,
    document_prompts,
    documents,
    math_prompts,
    passage_prompts,
    rag_prompts,
    read_prompts,
    stdlib_prompts,
)
from tests.conftest import SPEC_BENCH, needs_spec_bench


def test_pool_is_deterministic_and_mixes_every_kind() -> None:
    """Two builds give the same pool of distinct prompts; its first 40 hold every kind."""
    pool = default_prompts()
    assert pool == default_prompts()
    kinds: tuple[tuple[str, ...], ...] = (stdlib_prompts(), passage_prompts(), math_prompts())
    kinds += (chat_prompts(), document_prompts(), rag_prompts(), code_prompts())
    assert set(pool) == set().union(*kinds)
    assert len(set(pool)) == len(pool) > 2900
    assert all(set(pool[:40]) & set(kind) for kind in kinds)
    assert set(CHAT_TOPICS) <= set(pool)
    assert any("`textwrap.dedent`" in p for p in pool)


def test_documents_are_whole_paragraph_runs_within_the_word_bounds() -> None:
    """Each document has 100-300 words made of whole docstring paragraphs, and each document
    task holds its document."""
    docs = documents()
    assert len(docs) > 50
    assert all(100 <= len(text.split()) <= 300 for _, text in docs)
    assert all(text in task for (_, text), task in zip(docs, document_prompts(), strict=True))


def test_rag_prompts_number_three_documents_and_ask_about_one_of_them() -> None:
    """A retrieval prompt numbers three documents, one of them the named owner's, and the
    answer's place moves from first to third in turn."""
    docs = dict(documents(min_words=40, max_words=120))
    prompts = rag_prompts()
    assert len(prompts) == len(documents(min_words=40, max_words=120))
    for i, prompt in enumerate(prompts[:6]):
        assert [f"Document [{n}]:" in prompt for n in (1, 2, 3, 4)] == [True] * 3 + [False]
        name = prompt.rsplit("`", 2)[1]
        part = prompt.split(f"Document [{i % 3 + 1}]:\n", 1)[1]
        assert part.startswith(docs[name])


def test_code_prompts_hold_whole_functions_within_the_line_bounds() -> None:
    """Each code prompt holds one function's dedented source of 6-30 lines in a fence."""
    prompts = code_prompts()
    assert len(prompts) > 400
    for prompt in prompts:
        code = prompt.split("```python\n", 1)[1].split("\n```", 1)[0]
        assert code.startswith(("def ", "async def ", "@")), code[:40]
        assert 6 <= code.count("\n") + 1 <= 30


def _runs(text: str) -> set[tuple[str, ...]]:
    """Every run of 8 consecutive words of ``text`` (lower case, punctuation dropped)."""
    w = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(w[i : i + 8]) for i in range(len(w) - 7)}


@needs_spec_bench
def test_pool_shares_no_prompt_or_8_word_run_with_spec_bench() -> None:
    """No pool prompt equals or contains a Spec-Bench turn, and no 8-word run of a Spec-Bench
    turn appears in the pool."""
    turns = [
        t.strip()
        for line in SPEC_BENCH.read_text().splitlines()
        if line.strip()
        for t in json.loads(line)["turns"]
        if t.strip()
    ]
    pool = default_prompts()
    assert not [p for p in pool if any(t in p for t in turns)]
    pool_runs = set().union(*(_runs(p) for p in pool))
    assert sorted(" ".join(run) for t in turns for run in _runs(t) & pool_runs) == []


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_read_prompts_reads_each_line_and_skips_blank_ones(tmp_path: Path) -> None:
    """One prompt per JSONL line, in order; blank lines are skipped."""
    path = _write(tmp_path, '{"prompt": "a"}\n\n{"prompt": "b", "id": 3}\n')
    assert read_prompts(path) == ("a", "b")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"prompt": "a"}\nnot json\n', r"prompts\.jsonl:2 is not JSON"),
        ('{"prompt": "a"}\n{"text": "b"}\n', r'prompts\.jsonl:2 has no "prompt" string'),
        ('["a"]\n', r'prompts\.jsonl:1 has no "prompt" string'),
        ('{"prompt": 3}\n', r'prompts\.jsonl:1 has no "prompt" string'),
        ('{"prompt": "a"}\n{"prompt": "  "}\n', r'prompts\.jsonl:2: "prompt" is empty'),
        ("\n\n", r"holds no prompt"),
    ],
)
def test_read_prompts_refuses_a_bad_line_by_number(tmp_path: Path, text: str, match: str) -> None:
    """A line that is not JSON, has no prompt string or an empty one is refused by line."""
    with pytest.raises(InvalidConfig, match=match):
        read_prompts(_write(tmp_path, text))


def test_read_prompts_refuses_a_missing_file(tmp_path: Path) -> None:
    """A missing file is refused naming it."""
    with pytest.raises(InvalidConfig, match=r"missing\.jsonl.*cannot be read"):
        read_prompts(tmp_path / "missing.jsonl")
