"""The drafting hooks in the engine: the builder's draft input reaches the drafter, stop tokens
inside accepted blocks, acceptance by position, the step trace, and a user's own model."""

import io
import json
from dataclasses import replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import specstrat
from specstrat import EAGLE, NGRAM, ModelSet, SpecAlgorithm
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._disagg import PrefillWorker
from specstrat.strategies import NoDraftStateDisaggDraftBuilder
from tests.runtime.user_model import BigramLM

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(6, seed=3)  # request 3 stops at its first newline
#: EAGLE whose disagg builder relays the first tokens but returns no draft state.
EAGLE_NO_STATE = replace(EAGLE, name="EAGLE_NO_STATE", disagg=NoDraftStateDisaggDraftBuilder())


def traced(engine: Engine, **kw: Any) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """Run ``engine`` with a trace; its outputs and the trace's records."""
    buffer = io.StringIO()
    outputs = engine.run(trace=buffer, **kw)
    return outputs, [json.loads(line) for line in buffer.getvalue().splitlines()]


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Target-only output of the workload."""
    return Engine(specstrat.NONE, models, CONFIG).run(REQUESTS)


def test_a_builder_returning_none_starts_plain_and_stays_lossless(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """PREBUILT requests whose builder returned None propose nothing on their first step (it
    decodes plainly from last_tokens); with EAGLE's builder they draft at once; both lossless."""
    first_drafts = {}
    for algo in (EAGLE, EAGLE_NO_STATE):
        engine = Engine(algo, models, CONFIG)
        prefill = PrefillWorker(algo, models, context_len=512, batch_size=4)
        engine.submit_prebuilt(prefill.prefill(REQUESTS[:3]))
        outputs, records = traced(engine)
        assert outputs == {r.rid: target_only[r.rid] for r in REQUESTS[:3]}
        decodes = [r for r in records if r["drafts"] or r["accepted"] or len(r["tokens"]) > 1]
        first: dict[str, list[int]] = {}
        for record in records[3:]:  # the first three records are the admitted first tokens
            first.setdefault(record["rid"], record["drafts"])
        first_drafts[algo.name] = first
        assert decodes
    assert all(d == [] for d in first_drafts["EAGLE_NO_STATE"].values())
    assert all(len(d) == 3 for d in first_drafts["EAGLE"].values())


@pytest.fixture(scope="module")
def long_output(models: EmbeddedModels) -> tuple[Request, list[int]]:
    """One request and its 60 target-only tokens, without stop tokens."""
    request = replace(workload(1, seed=7)[0], max_new_tokens=60, stop_token_ids=frozenset())
    return request, Engine(specstrat.NONE, models, CONFIG).run([request])[request.rid]


@settings(max_examples=25, deadline=None)
@given(
    position=st.integers(0, 59),
    algo=st.sampled_from([EAGLE, NGRAM, specstrat.STANDALONE]),
    overlap=st.booleans(),
    d=st.integers(1, 5),
)
def test_a_stop_token_inside_an_accepted_block_truncates_there(
    position: int,
    algo: SpecAlgorithm[Any],
    overlap: bool,
    d: int,
    long_output: tuple[Request, list[int]],
    models: EmbeddedModels,
) -> None:
    """Whichever draft position the stop token is accepted at, the output ends at its first
    occurrence, and the request's KV and slot are all returned."""
    request, full = long_output
    stop = full[position]
    want = full[: full.index(stop) + 1]
    engine = Engine(algo, models, replace(CONFIG, overlap=overlap, num_draft_tokens=d))
    before = (engine.free_slots, engine.free_kv_tokens)
    got = engine.run([replace(request, stop_token_ids=frozenset({stop}))])
    assert got[request.rid] == want
    assert (engine.free_slots, engine.free_kv_tokens) == before


def test_acceptance_by_position_and_trace(models: EmbeddedModels) -> None:
    """RunStats counts proposals and acceptances per draft position (a chain accepts position
    k only after k - 1); every decode record's kept tokens begin its accepted drafts."""
    engine = Engine(EAGLE, models, CONFIG)
    outputs, records = traced(engine, requests=REQUESTS)
    stats = engine.stats
    assert len(stats.proposed_by_position) == 3  # D = 4: three drafts per step
    accepted = stats.accepted_by_position
    assert accepted == sorted(accepted, reverse=True)
    assert all(rate is not None and 0 <= rate <= 1 for rate in stats.acceptance_by_position)
    for record in records:
        drafted = [record["drafts"][node] for node in record["accepted"]]
        kept = record["tokens"]  # cut at the budget or a stop: a prefix of drafts + bonus
        assert kept[: len(drafted)] == drafted[: len(kept)]
    stopped = [r for r in records if r["stop"]]
    assert [r["rid"] for r in stopped] == ["req-3"]
    assert outputs["req-3"][-1] == 10


def test_a_users_own_model_runs(models: EmbeddedModels) -> None:
    """A user-written torch module behind the CausalLM Protocol runs target-only and with
    prompt lookup, losslessly."""
    torch.manual_seed(0)
    mine = ModelSet(target=BigramLM(vocab_size=64).double().eval())
    requests = [Request(f"u{i}", tuple(range(i, i + 12)), 20) for i in range(3)]
    config = EngineConfig(context_len=128, max_running_requests=4)
    plain = Engine("NONE", mine, config).run(requests)
    assert Engine(NGRAM, mine, config).run(requests) == plain
    with pytest.raises(
        specstrat.InvalidConfig, match=r"needs a draft head but models.head is None"
    ):
        Engine(EAGLE, mine, config)
