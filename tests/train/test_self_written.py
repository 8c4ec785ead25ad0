"""Prompts the target writes itself: the asks are seeded and alternate requests and documents,
the target's answers are cleaned into prompts, a run mixes them one for one into its prompts
and holds out their share, and bad counts are refused by name."""

import argparse
import json
import time
from typing import Any

import pytest
import torch

import specstrat.train.generation as generation
import specstrat.train.loop as loop
import specstrat.train.self_written as self_written
from specstrat.errors import InvalidConfig
from specstrat.train import (
    Generation,
    HeadConfig,
    WritingAsk,
    clean_document,
    clean_request,
    self_written_prompts,
    train_head,
    writing_asks,
)
from specstrat.train.self_written import given_source, written_source
from specstrat.train.train_flags import _count
from tests.conftest import SPEC_BENCH, needs_spec_bench
from tests.train.test_prompts import _runs


def test_asks_are_seeded_and_alternate_requests_and_documents() -> None:
    """One seed gives the same asks, another seed others; even asks are requests, odd ones
    documents whose task holds the document's slot."""
    asks = writing_asks(40, seed=3)
    assert asks == writing_asks(40, seed=3) != writing_asks(40, seed=4)
    assert [a.kind == "request" for a in asks] == [i % 2 == 0 for i in range(40)]
    assert all(a.task == "{doc}" for a in asks[::2])
    assert all("{doc}" in a.task and a.kind != "request" for a in asks[1::2])
    assert {a.kind for a in writing_asks(400)} == {"request", "article", "text", "story"} | {
        "german"
    }


@pytest.mark.parametrize("count", [-1, 2.5, True])
def test_asks_refuse_a_bad_count(count: Any) -> None:
    """A count that is not an int >= 0 is refused, naming it."""
    with pytest.raises(InvalidConfig, match=rf"count={count!r} must be an int >= 0"):
        writing_asks(count)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('A student might ask, "Why do rivers bend as they flow?" and wait.', "Why do rivers"),
        ('He said "Why not?" to me on the way home.', "He said"),
        ("Question: How do tides follow the moon?\n\nMore text.", "How do tides follow"),
        ('"How do I plan a week of cheap meals?"', "How do I plan"),
        ("Too short.", None),
        ("word " * 130, None),
    ],
)
def test_clean_request_finds_the_request_or_refuses_it(text: str, expected: str | None) -> None:
    """A quoted question is taken (one under 12 characters is not), else the first paragraph
    unlabelled and unquoted; fewer than 4 words or over 600 characters give None."""
    cleaned = clean_request(text)
    if expected is None:
        assert cleaned is None
    else:
        assert cleaned is not None
        assert cleaned.startswith(expected), cleaned
        assert "More text" not in cleaned
        assert not cleaned.endswith('"')


def test_clean_document_ends_at_a_whole_sentence() -> None:
    """A document cut mid-sentence ends at its last full stop; paragraphs are kept; fewer than
    15 words give None."""
    text = "First line of the report is here. " * 3 + "\n\nSecond paragraph ends. And then a cu"
    cleaned = clean_document(text)
    assert cleaned is not None
    assert cleaned.endswith("Second paragraph ends.")
    assert cleaned.count("\n\n") == 1
    assert clean_document("Only a few words here.") is None


def _fake_generate(answers: list[str], seen: list[dict[str, Any]]) -> Any:
    """A stand-in for generation.generate that answers the i-th ask with answers[i] (as tokens
    of a byte tokenizer) and records how it was called."""

    def fake(model: Any, tokenizer: Any, prompts: list[str], **kwargs: Any) -> tuple[Any, ...]:
        seen.append({"prompts": list(prompts), **kwargs})
        return tuple(
            Generation(tokens=torch.tensor(list(b"??" + answers[i].encode())), prompt_len=2)
            for i in range(len(prompts))
        )

    return fake


class _Bytes:
    """A tokenizer decoding byte ids."""

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return bytes(ids.tolist()).decode()


REPORT = "The town opened its new library on Monday. " * 4


def test_self_written_prompts_make_each_answer_a_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's answer becomes the prompt, a document's goes into its task; an answer that
    cleans to nothing and a repeated prompt are dropped; the asks are sampled with the seed."""
    answers = ["Question: Why is the sky blue at noon?", REPORT, "no", REPORT, "x", "A doc."]
    answers += ["Tell me.", "no"]
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(self_written, "generate", _fake_generate(answers, seen))
    prompts = self_written_prompts(None, _Bytes(), 8, seed=2, temperature=0.6)
    asks = writing_asks(8, seed=2)
    assert seen[0]["prompts"] == [a.ask for a in asks]
    assert (seen[0]["temperature"], seen[0]["seed"]) == (0.6, 2)
    report = REPORT.strip()
    want = (
        "Why is the sky blue at noon?",
        *(asks[i].task.replace("{doc}", report) for i in (1, 3)),
    )
    assert prompts == tuple(dict.fromkeys(want))
    assert len(prompts) < len(want)  # two asks drew the same task: one prompt kept


def test_a_run_mixes_self_written_prompts_one_for_one(
    monkeypatch: pytest.MonkeyPatch, engine_llama: Any, tokenizer: Any
) -> None:
    """With self_written=N, the target's N prompts are generated first, one for one with the
    given prompts, and hold out their share; the given prompts follow."""
    own = [f"Own question number {i} about rivers?" for i in range(10)]
    given = [f"Given prompt number {i}, please answer." for i in range(20)]
    calls: list[tuple[Any, ...]] = []

    def written(model: Any, tokenizer: Any, count: int, **kwargs: Any) -> tuple[str, ...]:
        calls.append((count, kwargs["seed"], kwargs["temperature"], kwargs["deadline"]))
        return (given[0], *own)  # one of the given prompts: dropped

    monkeypatch.setattr(loop, "self_written_prompts", written)
    captured: list[list[str]] = []
    real = generation.GenerationCapturer.capture

    def spy(self: Any, prompts: Any, **kwargs: Any) -> Any:
        captured.append(list(prompts))
        return real(self, prompts, **kwargs)

    monkeypatch.setattr(generation.GenerationCapturer, "capture", spy)
    config = HeadConfig(self_written=10, held_out=0.1, max_new_tokens=4, epochs=1, draft_vocab=64)
    train_head(config, engine_llama, tokenizer, given, progress=False)
    train, held = captured[0], captured[-1]
    assert train[:18] == [p for pair in zip(own[:9], given[:9], strict=True) for p in pair]
    assert train[18:] == given[9:18]
    assert sorted(held) == sorted([*given[18:], own[9]])
    assert calls == [(10, 0, 0.7, None)]  # max(temperature, repeat_temperature); no budget


def test_self_written_prompts_are_written_in_the_budgets_first_quarter(
    monkeypatch: pytest.MonkeyPatch, engine_llama: Any, tokenizer: Any
) -> None:
    """Under a budget the target writes until a quarter of it, sampling at 1.0 when both
    temperatures are 0; a prompt too long for the model's positions is dropped."""
    deadlines: list[tuple[float, float]] = []

    def written(model: Any, tokenizer: Any, count: int, **kwargs: Any) -> tuple[str, ...]:
        deadlines.append((kwargs["deadline"], kwargs["temperature"]))
        return ("Why do rivers bend?", "word " * 5000)

    monkeypatch.setattr(loop, "self_written_prompts", written)
    config = HeadConfig(
        self_written=2, repeat_temperature=0.0, budget_seconds=8.0, epochs=1, max_new_tokens=4
    )
    start = time.monotonic()
    data, _ = loop.collect(config, engine_llama, tokenizer, ["Say hi."] * 3, "p", start, None)
    assert deadlines == [(start + 2.0, 1.0)]
    assert data.source == written_source("p", 1)
    assert given_source(data.source) == "p"


@pytest.mark.parametrize("value", [-1, 1.5])
def test_head_config_refuses_a_bad_self_written_count(value: Any) -> None:
    """HeadConfig.self_written must be an int >= 0, named when it is not."""
    with pytest.raises(InvalidConfig, match=rf"self_written={value!r} must be an int >= 0"):
        HeadConfig(self_written=value)


def test_the_flag_refuses_a_negative_count() -> None:
    """--self-written takes an int >= 0 and names a bad one."""
    assert _count("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match=r"'-3' is not an int >= 0"):
        _count("-3")


@pytest.mark.parametrize(
    ("kind", "task", "match"),
    [
        ("poem", "{doc}", r"WritingAsk\.kind='poem' must be one of 'request', 'article'"),
        ("article", "Summarise it.", r"WritingAsk\.task='Summarise it\.' has no \{doc\} slot"),
    ],
)
def test_an_ask_of_an_unknown_kind_or_without_a_slot_is_refused(
    kind: str, task: str, match: str
) -> None:
    """A WritingAsk names a kind it does not know and a task with nowhere to put the text."""
    with pytest.raises(InvalidConfig, match=match):
        WritingAsk("Write something.", kind, task)


@needs_spec_bench
def test_asks_and_tasks_share_no_8_word_run_with_spec_bench() -> None:
    """No ask the target is given and no task a document goes into shares an 8-word run with a
    Spec-Bench turn, so what the target writes is prompted by nothing from the benchmark."""
    turns = [
        t
        for line in SPEC_BENCH.read_text().splitlines()
        if line.strip()
        for t in json.loads(line)["turns"]
    ]
    bench = set().union(*(_runs(t) for t in turns))
    asks = writing_asks(2000)
    texts = {a.ask for a in asks} | {a.task for a in asks}
    assert len(texts) > 1000
    assert sorted(" ".join(r) for t in texts for r in _runs(t) & bench) == []
