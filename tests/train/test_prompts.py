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
    default_prompts,
    math_prompts,
    passage_prompts,
    read_prompts,
    stdlib_prompts,
)
from tests.conftest import SPEC_BENCH, needs_spec_bench


def test_pool_is_deterministic_and_mixes_every_kind() -> None:
    """Two builds give the same pool of distinct prompts; its first 20 hold every kind."""
    pool = default_prompts()
    assert pool == default_prompts()
    kinds = (stdlib_prompts(), passage_prompts(), math_prompts(), chat_prompts())
    assert set(pool) == set().union(*kinds)
    assert len(set(pool)) == len(pool) > 2000
    assert all(set(pool[:20]) & set(kind) for kind in kinds)
    assert set(CHAT_TOPICS) <= set(pool)
    assert any("`textwrap.dedent`" in p for p in pool)


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
