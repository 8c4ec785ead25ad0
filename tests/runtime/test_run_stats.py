"""Run statistics count what requests kept: overlap and sync agree, the trace holds the kept
tokens, tau counts the rule's acceptances before any cut, verify widths per request."""

import io
import json
from dataclasses import replace
from typing import Any

import pytest

import specstrat
from specstrat import EAGLE, NGRAM
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, RunStats, workload
from specstrat.testing import ForcedAcceptance

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
#: Six requests, one stopping at its first newline, with budgets that end mid-step.
REQUESTS = workload(6, seed=5)

STAT_FIELDS = (
    "generated_tokens",
    "verified_requests",
    "verified_tokens",
    "verify_forward_tokens",
    "accepted_by_position",
    "proposed_by_position",
    "accepted_histogram",
)


def _run(algo: specstrat.SpecAlgorithm[Any], models: EmbeddedModels, overlap: bool) -> Engine:
    engine = Engine(algo, models, replace(CONFIG, overlap=overlap))
    engine.run(REQUESTS)
    return engine


@pytest.mark.parametrize("algo", [EAGLE, NGRAM], ids=lambda a: a.name)
def test_overlap_and_sync_report_identical_statistics(
    models: EmbeddedModels, algo: specstrat.SpecAlgorithm[Any]
) -> None:
    """Overlap drops its extra steps' statistics with their tokens: every verify figure equals
    sync's for the same output."""
    sync, over = _run(algo, models, False), _run(algo, models, True)
    for name in STAT_FIELDS:
        assert getattr(over.stats, name) == getattr(sync.stats, name), name
    assert over.stats.acceptance_length == sync.stats.acceptance_length
    assert sync.stats.dropped_steps == 0


def test_the_trace_holds_exactly_the_kept_tokens(models: EmbeddedModels) -> None:
    """Each request's traced tokens, joined in step order, are its output: nothing past
    max_new_tokens or after a stop token, in overlap mode too."""
    engine = Engine(EAGLE, models, replace(CONFIG, overlap=True))
    buffer = io.StringIO()
    outputs = engine.run(REQUESTS, trace=buffer)
    joined: dict[str, list[int]] = {}
    for line in buffer.getvalue().splitlines():
        record = json.loads(line)
        joined.setdefault(record["rid"], []).extend(record["tokens"])
    assert joined == outputs
    assert any(len(v) < r.max_new_tokens for r in REQUESTS for v in [outputs[r.rid]])


def test_tau_counts_acceptances_before_the_budget_cut(models: EmbeddedModels) -> None:
    """A request of budget 2 keeps one token from its verify step, but all the drafts the rule
    accepted and the bonus count in tau (forced acceptance 1.0: D = 4 tokens)."""
    algo = replace(EAGLE, name="EAGLE_ALL", acceptance=ForcedAcceptance(rate=1.0))
    engine = Engine(algo, models, CONFIG)
    out = engine.run([Request("r", tuple(b"def f(x):\n"), 2)])
    stats = engine.stats
    assert len(out["r"]) == 2
    assert stats.generated_tokens == 2
    assert stats.verified_requests == 1  # the prefill made token 1, one verify step the rest
    assert stats.verified_tokens == stats.acceptance_length == 4
    assert stats.accepted_histogram == {3: [0, 0, 0, 1]}


def test_histogram_and_verify_width_per_request(models: EmbeddedModels) -> None:
    """The histogram's rows sum to the verify steps; uniform verify holds T tokens per request,
    ragged verify the drafts plus one."""
    ragged = replace(
        NGRAM, name="NGRAM_R", capabilities=replace(NGRAM.capabilities, supports_ragged_verify=True)
    )
    uniform, cut = _run(NGRAM, models, False).stats, _run(ragged, models, False).stats
    for stats in (uniform, cut):
        assert sum(map(sum, stats.accepted_histogram.values())) == stats.verified_requests
        assert stats.proposed_by_position[0] == sum(
            sum(row) for p, row in stats.accepted_histogram.items() if p >= 1
        )
    assert uniform.verified_per_step == 4.0  # T = D = 4
    assert 1.0 <= cut.verified_per_step < 4.0
    proposed = sum(p * sum(row) for p, row in cut.accepted_histogram.items())
    assert cut.verify_forward_tokens == proposed + cut.verified_requests


def test_target_only_has_no_verify_statistics() -> None:
    """Without speculation tau and the verify width are 1.0 and nothing is counted."""
    stats = RunStats()
    assert (stats.acceptance_length, stats.verified_per_step) == (1.0, 1.0)
    assert stats.accepted_histogram == {}


def test_first_and_last_token_times_per_request(models: EmbeddedModels) -> None:
    """Every request gets a first- and last-token time, first no later than last."""
    engine = Engine(EAGLE, models, CONFIG)
    engine.run(REQUESTS)
    stats = engine.stats
    assert set(stats.first_token_at) == set(stats.last_token_at) == {r.rid for r in REQUESTS}
    assert all(stats.first_token_at[r] <= stats.last_token_at[r] for r in stats.first_token_at)
