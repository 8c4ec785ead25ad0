"""Bench workloads: the spec strings, Spec-Bench's file read from a path (first turns,
categories, round robin within MT-Bench), bad input named, byte encoding left-truncated."""

from pathlib import Path

import pytest

from specstrat import InvalidConfig
from specstrat.bench.workloads import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_ROWS,
    ByteEncoder,
    Prompt,
    WorkloadSpec,
    load_prompts,
    parse_workload,
)
from specstrat.drafting import GREEDY
from tests.conftest import SPEC_BENCH, needs_spec_bench

#: Spec-Bench's question file, read in place from the shared data (never copied here).


def test_workload_specs_parse() -> None:
    """``code``, a Spec-Bench path, and a path with categories."""
    assert parse_workload("code") == WorkloadSpec("code")
    assert parse_workload("spec-bench:/d/question.jsonl") == WorkloadSpec(
        "spec-bench", Path("/d/question.jsonl")
    )
    spec = parse_workload("spec-bench:/d/q.jsonl:qa,rag")
    assert spec == WorkloadSpec("spec-bench", Path("/d/q.jsonl"), ("qa", "rag"))
    assert spec.text() == "spec-bench:/d/q.jsonl:qa,rag"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("chat", r"workload='chat' is not a workload; pass 'code' or 'spec-bench:PATH"),
        ("spec-bench:", r"workload='spec-bench:' is not a workload"),
        ("spec-bench:/d/q.jsonl:qa,,rag", r"has an empty category; list them as CATEGORY"),
    ],
)
def test_bad_workload_specs_are_refused(spec: str, match: str) -> None:
    """An unknown form or an empty category is an InvalidConfig naming the value and the fix."""
    with pytest.raises(InvalidConfig, match=match):
        parse_workload(spec)


@needs_spec_bench
def test_spec_bench_rows_take_first_turns_per_category() -> None:
    """By default the six Spec-Bench tasks, ``requests`` each; MT-Bench round robin over its
    eight file categories; each prompt is the question's first turn."""
    prompts = load_prompts(WorkloadSpec("spec-bench", SPEC_BENCH), 9)
    assert [p.category for p in prompts[::9]] == list(SPEC_BENCH_ROWS)
    mt = prompts[:9]
    assert [p.rid for p in mt][:2] == ["mt_bench-81", "mt_bench-91"]  # writing, then roleplay
    assert len({p.rid for p in prompts}) == len(prompts) == 54
    assert mt[0].text.startswith("Compose an engaging travel blog post")
    assert len(MT_BENCH_CATEGORIES) == 8


@needs_spec_bench
def test_single_file_categories_can_be_chosen() -> None:
    """A file category such as ``writing`` is a row of its own."""
    prompts = load_prompts(WorkloadSpec("spec-bench", SPEC_BENCH, ("writing", "qa")), 2)
    assert [p.category for p in prompts] == ["writing", "writing", "qa", "qa"]


@needs_spec_bench
def test_unknown_category_and_missing_file_are_named(tmp_path: Path) -> None:
    """An unknown category lists the known ones; a missing or malformed file says what to pass."""
    with pytest.raises(
        InvalidConfig, match=r"category 'poetry' is not in .*; pick from .*mt_bench"
    ):
        load_prompts(WorkloadSpec("spec-bench", SPEC_BENCH, ("poetry",)), 1)
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(InvalidConfig, match=r"nope.jsonl: No such file.*Spec-Bench"):
        load_prompts(WorkloadSpec("spec-bench", missing), 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "qa"}\n')
    with pytest.raises(InvalidConfig, match=r"bad.jsonl:1 has no 'category' and 'turns'"):
        load_prompts(WorkloadSpec("spec-bench", bad), 1)
    bad.write_text("not json\n")
    with pytest.raises(InvalidConfig, match=r"bad.jsonl:1 is not JSON"):
        load_prompts(WorkloadSpec("spec-bench", bad), 1)
    bad.write_text("\n")
    with pytest.raises(InvalidConfig, match=r"holds no questions"):
        load_prompts(WorkloadSpec("spec-bench", bad), 1)


def test_code_workload_has_one_category() -> None:
    """``code`` cycles through the code-editing prompts under one category."""
    prompts = load_prompts(WorkloadSpec("code"), 3)
    assert [p.category for p in prompts] == ["code"] * 3


def test_byte_encoding_keeps_the_prompts_end() -> None:
    """The embedded models get the prompt's bytes, left-truncated so prompt, output and a
    step's reservation fit the context; no room at all is refused with the fix."""
    encoder = ByteEncoder(context_len=64, margin=10)
    request = encoder.encode(Prompt("p", "qa", "x" * 100 + "end"), 20, GREEDY, True)
    assert len(request.prompt) == 34
    assert bytes(request.prompt).endswith(b"end")
    assert "left-truncated" in encoder.note
    with pytest.raises(
        InvalidConfig,
        match=r"max_new_tokens=60 \(--max-new-tokens\) leaves no room .* reserves 10 tokens for "
        r"the widest --draft-tokens; .* pass --context-len 71 or more",
    ):
        encoder.encode(Prompt("p", "qa", "x"), 60, GREEDY, True)
    fitted = ByteEncoder(context_len=71, margin=10).encode(
        Prompt("p", "qa", "xy"), 60, GREEDY, True
    )
    assert fitted.prompt == (ord("y"),)
