"""``specstrat bench --profile``: a decode step split by part on the embedded and a tiny Hugging
Face model, the forward's parts adding up to it, the table and JSON, and what it refuses."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from specstrat import NGRAM, NONE
from specstrat.bench.step_profile import (
    FORWARD_PARTS,
    STEP_PARTS,
    profile_steps,
    profile_table,
)
from specstrat.cli import main
from specstrat.drafting import DrafterContext, DraftStep, DraftTree
from specstrat.errors import InvalidConfig
from specstrat.hf import HFCausalLM
from specstrat.models import ModelSet
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request
from specstrat.strategies import NgramDrafterFactory
from specstrat.strategies.drafters import NgramDrafter
from tests.hf import tiny

CODE = tuple(b"def add(a, b):\n    return a + b\n\ndef add(a, b):\n")


@pytest.mark.parametrize("fast", [False, True], ids=["transformers-forward", "fast-forward"])
def test_the_parts_add_up_to_the_step_and_the_forward(fast: bool, ids: tuple[int, ...]) -> None:
    """On a tiny HF model every part is measured, the step's parts sum to its total and the
    forward's parts to the forward; the adapter's own per-layer time is seen under
    transformers' forward and is nil under the fast forward, which has no adapter function."""
    target = HFCausalLM(tiny.model("llama"), vocab_size=tiny.VOCAB, fast=fast)
    assert (target.fast_forward is not None) == fast
    models = ModelSet(target=target)
    requests = [Request("r0", ids[:10], 8)]
    profile = profile_steps(NONE, models, requests, context_len=64)
    parts = profile.parts
    assert set(parts) == {*STEP_PARTS, *FORWARD_PARTS}
    step = sum(parts[k] for k in STEP_PARTS if k != "total_us")
    assert step == pytest.approx(parts["total_us"])
    # The fitted parts add up to the forward exactly, but for float rounding.
    assert sum(parts[k] for k in FORWARD_PARTS) == pytest.approx(parts["model_us"], rel=1e-6)
    assert parts["matmul_us"] > 0
    assert (parts["adapter_us"] > 0) != fast
    assert profile.steps == 7  # 8 tokens: the first from prefill
    assert profile.tokens_per_step == 1.0


def test_a_speculating_algorithm_reports_its_drafter_and_tokens_per_step() -> None:
    """NGRAM on the embedded models: its drafter's time is counted and a request gains at
    least one token a step."""
    models = EmbeddedModels.load()
    requests = [Request("r0", CODE, 16)]
    profile = profile_steps(NGRAM, models, requests, draft_tokens=4, context_len=256)
    assert profile.parts["drafter_us"] > 0
    assert profile.tokens_per_step >= 1.0
    table = profile_table([profile])
    assert "NGRAM D=4" in table
    assert "kv_gather" in table


def test_no_requests_is_refused_by_name() -> None:
    """An empty request list is refused saying what is needed."""
    with pytest.raises(InvalidConfig, match=r"requests is empty"):
        profile_steps(NONE, EmbeddedModels.load(), [], context_len=64)


def test_the_profile_flag_prints_the_table_and_writes_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --profile --json` prints one column per contender and writes the parts."""
    out = tmp_path / "profile.json"
    args = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "8"]
    assert main([*args, "--profile", "--json", str(out)]) == 0
    assert "NONE" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [p["algorithm"] for p in doc["profile"]] == ["NONE", "NGRAM"]
    assert set(doc["profile"][1]["parts_us"]) == {*STEP_PARTS, *FORWARD_PARTS}


def test_the_profile_flag_refuses_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--profile --plot` is a usage error naming both flags."""
    args = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "4", "--profile"]
    assert main([*args, "--plot", str(tmp_path / "plots")]) == 2
    assert "--profile draws no plots" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--overlap"], "--overlap"),
        (["--request-rate", "5"], "--request-rate"),
        (["--force-accept", "0.5"], "--force-accept"),
        (["--baseline", "hf"], "--baseline hf"),
    ],
)
def test_flags_only_the_side_by_side_runs_honour_are_refused(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--profile with a flag it would silently ignore is a usage error naming the flag."""
    args = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "4", "--profile"]
    assert main([*args, *flags]) == 2
    assert f"drop {named} (or --profile)" in capsys.readouterr().err


def test_the_profile_json_says_what_ran(tmp_path: Path) -> None:
    """The JSON's setup names the model, workload, batch size and draft widths."""
    out = tmp_path / "p.json"
    args = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "6"]
    assert main([*args, "--draft-tokens", "2,3", "--profile", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["setup"]["model"] == "embedded"
    assert doc["setup"]["draft_tokens"] == [2, 3]
    assert [p["draft_tokens"] for p in doc["profile"]] == [0, 2, 3]


def test_json_to_stdout_is_the_whole_of_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """`--profile --json -` prints only the JSON document on stdout, the table on stderr."""
    args = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "4"]
    assert main([*args, "--profile", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert [p["algorithm"] for p in json.loads(captured.out)["profile"]] == ["NONE", "NGRAM"]
    assert "µs per decode step" in captured.err


class _FailingDrafter(NgramDrafter):
    """Prompt lookup whose propose raises: a strategy fault in the middle of a profiled run."""

    def propose(self, step: DraftStep) -> DraftTree:
        """Raises."""
        raise RuntimeError("boom in propose")


@dataclass(frozen=True, slots=True, kw_only=True)
class _FailsThirdRun(NgramDrafterFactory):
    """Prompt lookup whose third drafter (profile_steps' profiled run) fails."""

    made: list[int] = field(default_factory=list, compare=False)

    def create_drafter(self, context: DrafterContext) -> NgramDrafter:
        """The third drafter made raises in propose."""
        self.made.append(1)
        if len(self.made) == 3:
            return _FailingDrafter(self.min_ngram, self.max_ngram, context.target_tokens)
        return NgramDrafterFactory.create_drafter(self, context)  # slots: no bare super()


def test_a_fault_in_the_profiled_run_leaks_no_patch_and_the_engine_stays_correct(
    wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """A drafter raising inside the profiler leaves the runtime and the adapter's attention
    function unpatched, and target-only afterwards is transformers' greedy output."""
    from transformers import AttentionInterface

    from specstrat.hf import generate_reference
    from specstrat.hf.adapter import ATTENTION_NAME, paged_attention
    from specstrat.runtime._attention import PagedAttention
    from specstrat.runtime._step import StepRunner
    from specstrat.runtime._worker import ModelWorker

    before = (StepRunner.decode, ModelWorker.execute, PagedAttention.__call__)
    target = wrapped("llama")
    failing = replace(NGRAM, name="FAILING", drafter=_FailsThirdRun())
    requests = [Request("r0", ids[:10] * 2, 8)]
    with pytest.raises(Exception, match="boom in propose"):
        profile_steps(failing, ModelSet(target=target), requests, context_len=64)
    assert (StepRunner.decode, ModelWorker.execute, PagedAttention.__call__) == before
    assert AttentionInterface._global_mapping[ATTENTION_NAME] is paged_attention
    outputs = profile_steps(NONE, ModelSet(target=target), requests, context_len=64)
    assert outputs.steps == 7
    engine = Engine(NONE, ModelSet(target=target), EngineConfig(context_len=64))
    assert engine.run(requests) == generate_reference(target, requests)
