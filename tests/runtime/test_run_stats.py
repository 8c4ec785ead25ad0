"""Run statistics count what requests kept: overlap and sync agree, the trace holds the kept
tokens, tau counts the rule's acceptances before any cut over drafted steps only, verify widths
per request; the policy, the trace, demo --json and the bench see the same run."""

import io
import json
from dataclasses import replace
from typing import Any

import pytest

import specstrat
from specstrat import EAGLE, NGRAM
from specstrat.bench import figures
from specstrat.demo import run_comparison
from specstrat.runtime import (
    EmbeddedModels,
    Engine,
    EngineConfig,
    Request,
    RunStats,
    acceptance_rates,
    workload,
)
from specstrat.speculation import SpeculationObservation
from specstrat.testing import ForcedAcceptance, ScriptedSpeculationPolicy

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
    assert stats.acceptance_by_position == stats.acceptance_conditional == []


def test_acceptance_by_position_is_acceptance_rates_over_the_histogram(
    models: EmbeddedModels,
) -> None:
    """RunStats' acceptance (unconditional and conditional) is acceptance_rates over its
    histogram, equal to its per-position counters' ratio; a position no step proposed is None."""
    stats = _run(EAGLE, models, False).stats
    unconditional, conditional = acceptance_rates(stats.accepted_histogram)
    assert (stats.acceptance_by_position, stats.acceptance_conditional) == (
        unconditional,
        conditional,
    )
    counters = zip(stats.accepted_by_position, stats.proposed_by_position, strict=True)
    assert unconditional == [a / p for a, p in counters]
    unobserved = RunStats(accepted_histogram={1: [2, 1], 3: [0, 0, 0, 0]})
    assert unobserved.acceptance_by_position == [1 / 3, None, None]


def test_first_and_last_token_times_per_request(models: EmbeddedModels) -> None:
    """Every request gets a first- and last-token time, first no later than last."""
    engine = Engine(EAGLE, models, CONFIG)
    engine.run(REQUESTS)
    stats = engine.stats
    assert set(stats.first_token_at) == set(stats.last_token_at) == {r.rid for r in REQUESTS}
    assert all(stats.first_token_at[r] <= stats.last_token_at[r] for r in stats.first_token_at)


class _Observing:
    """A speculation policy that records what its chooser observes and answers."""

    per_request_acceptance = False

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, list[tuple[SpeculationObservation, int]]()

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        return tuple(self.inner.candidate_widths(num_draft_tokens))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> Any:
        chooser, seen = self.inner.create_chooser(candidates, num_draft_tokens), self.seen

        class Chooser:
            def choose_width(self, observation: SpeculationObservation) -> int:
                answer = int(chooser.choose_width(observation))
                seen.append((observation, answer))
                return answer

        return Chooser()


def _decode_widths(trace: str) -> list[int]:
    """The D of each traced decode step, in step order (a prefill's lines say 0)."""
    by_step: dict[int, set[int]] = {}
    for line in trace.splitlines():
        record = json.loads(line)
        if record["width"]:
            by_step.setdefault(record["step"], set()).add(record["width"])
    assert all(len(w) == 1 for w in by_step.values())  # one D per step
    return [min(by_step[s]) for s in sorted(by_step)]


#: Mixes plain D = 1 steps with drafted ones (D = 2 and 4), then drafts at D = 4.
SCRIPT = (1, 1, 4, 2, 1, 4, 4, 1, 2, 4, 1, 1, 4)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_policy_stats_trace_demo_and_bench_see_the_same_run(
    models: EmbeddedModels, overlap: bool
) -> None:
    """Under a policy mixing D = 1 and drafted steps, the policy's answers are RunStats.widths
    and the trace's widths, its last view of acceptance is RunStats', and demo --json and the
    bench's figures report RunStats' tau (drafted steps only), plain-step share and acceptance
    (unconditional and conditional)."""
    policy = _Observing(ScriptedSpeculationPolicy(SCRIPT))
    algo = replace(EAGLE, name="EAGLE_MIXED", speculation=policy)
    config = replace(CONFIG, overlap=overlap)
    engine, buffer = Engine(algo, models, config), io.StringIO()
    engine.run(REQUESTS, trace=buffer)
    stats = engine.stats
    assert [answer for _, answer in policy.seen] == stats.widths
    assert [obs.step for obs, _ in policy.seen] == list(range(len(stats.widths)))
    assert all(obs.current == w for (obs, _), w in zip(policy.seen[1:], stats.widths, strict=False))
    traced = _decode_widths(buffer.getvalue())
    if overlap:  # a step whose every request had finished writes no line
        it = iter(stats.widths)
        assert all(any(w == v for v in it) for w in traced)
    else:
        assert traced == stats.widths
    # tau counts drafted steps only; the plain ones are their share beside it.
    assert stats.plain_steps > 0
    assert stats.verified_requests > 0
    assert sum(map(sum, stats.accepted_histogram.values())) == stats.verified_requests
    assert 0 not in stats.accepted_histogram  # no D = 1 step in the drafted figures
    share = stats.plain_steps / (stats.plain_steps + stats.verified_requests)
    assert stats.plain_step_share == share
    assert stats.acceptance_length == stats.verified_tokens / stats.verified_requests > 1.0
    # What the policy would observe next is RunStats' conditional acceptance.
    observed = engine._scheduler.ledger.observation([1])
    assert observed is not None
    _, conditional = figures.acceptance_rates(stats.accepted_histogram)
    assert list(observed.acceptance) == conditional == stats.acceptance_conditional
    # demo --json (its own run of the same workload) and the bench's figures agree.
    summary = run_comparison(algo, models, REQUESTS, config, progress=False).summary
    data = json.loads(json.dumps(summary.as_dict()))
    assert data["acceptance_length"] == stats.acceptance_length == figures.tau([stats])
    assert data["plain_step_share"] == stats.plain_step_share == figures.plain_step_share([stats])
    assert data["acceptance_conditional"] == stats.acceptance_conditional
    assert data["acceptance_by_position"] == stats.acceptance_by_position
    assert data["width_histogram"] == {str(w): n for w, n in stats.width_histogram.items()}


def test_non_speculative_steps_are_plain_d1_everywhere(models: EmbeddedModels) -> None:
    """For NONE every decode step is D = 1: the trace's widths are RunStats.widths, tau is
    1.0 and every decode request-step is plain."""
    engine, buffer = Engine(specstrat.NONE, models, CONFIG), io.StringIO()
    engine.run(REQUESTS, trace=buffer)
    stats = engine.stats
    assert set(stats.widths) == {1}
    assert _decode_widths(buffer.getvalue()) == stats.widths
    assert (stats.acceptance_length, stats.plain_step_share, stats.verified_requests) == (
        1.0,
        1.0,
        0,
    )
