"""Adaptive speculation: the policy's D per step, checked; switching widths stays lossless;
statistics count only positions proposed; the drafter catches up after D = 1 stretches."""

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specstrat
from specstrat import EAGLE, NGRAM, InvalidConfig, SpecAlgorithm, StrategyError
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._stats import _Counts
from specstrat.speculation import FixedSpeculationPolicy, SpeculationObservation
from specstrat.strategies import (
    BatchScheduleSpeculationPolicy,
    EmaLadderSpeculationPolicy,
    GoodputSpeculationPolicy,
    TopkTree,
)
from specstrat.testing import FaultySpeculationPolicy, ScriptedSpeculationPolicy

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(6, seed=3)
POLICIES = [
    FixedSpeculationPolicy(),
    EmaLadderSpeculationPolicy(),
    BatchScheduleSpeculationPolicy(),
    GoodputSpeculationPolicy(),
    ScriptedSpeculationPolicy((1, 1, 1, 4, 2, 1, 3, 4)),  # through D = 1 and back, on cue
]


def run(algo: SpecAlgorithm[Any], models: EmbeddedModels, **kw: Any) -> Engine:
    """An engine that ran the shared workload."""
    engine = Engine(algo, models, replace(CONFIG, **kw))
    engine.run(REQUESTS)
    return engine


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Plain greedy decoding of the shared workload."""
    return Engine(specstrat.NONE, models, CONFIG).run(REQUESTS)


def test_the_default_is_todays_fixed_width(models: EmbeddedModels) -> None:
    """Without a policy every step runs at the configured D, with today's verify width."""
    engine = run(EAGLE, models, num_draft_tokens=3)
    assert set(engine.stats.widths) == {3}
    assert engine.stats.width_histogram == {3: engine.stats.decode_steps}
    assert engine.tokens_per_req == 3


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize(
    ("algo", "policy"),
    [
        (EAGLE, POLICIES[4]),
        (specstrat.DSPARK, POLICIES[3]),
        (replace(EAGLE, tree=TopkTree(topk=2, num_steps=3)), POLICIES[4]),
    ],
    ids=["eagle-scripted", "dspark-goodput", "eagle-tree-scripted"],
)
def test_switching_widths_is_lossless(
    algo: SpecAlgorithm[Any],
    policy: Any,
    overlap: bool,
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
) -> None:
    """A policy that changes D between steps (through D = 1) keeps greedy output identical."""
    engine = Engine(replace(algo, speculation=policy), models, replace(CONFIG, overlap=overlap))
    assert engine.run(REQUESTS) == target_only


def test_a_scripted_run_records_each_steps_width(models: EmbeddedModels) -> None:
    """``RunStats.widths`` is the script, one entry per decode step, and D = 1 steps verify
    one token per request."""
    script = (1, 1, 4, 2, 4)
    engine = run(replace(NGRAM, speculation=ScriptedSpeculationPolicy(script)), models)
    widths = engine.stats.widths
    assert tuple(widths[:5]) == script
    assert set(widths[5:]) == {4}
    assert len(widths) == engine.stats.decode_steps


def test_positions_not_proposed_are_not_rejections(models: EmbeddedModels) -> None:
    """Steps at D = 2 propose one position: deeper positions count only D = 4 steps."""
    policy = ScriptedSpeculationPolicy((2, 4) * 40)
    engine = run(replace(EAGLE, speculation=policy), models)
    stats = engine.stats
    assert stats.proposed_by_position[0] == stats.verified_requests  # every step proposes 1
    assert stats.proposed_by_position[1] < stats.verified_requests / 2 + len(REQUESTS)
    assert set(stats.accepted_histogram) == {1, 3}  # one depth per width, none mixed in


def test_catch_up_after_a_long_plain_stretch(models: EmbeddedModels) -> None:
    """TensorRT-LLM #16888: after 20 steps at D = 1 the drafter drafts from every committed
    token, so acceptance afterwards equals that of a run that never paused (a fresh request
    whose prompt holds the tokens of the stretch)."""
    prompt = list(REQUESTS[0].prompt)
    for base in (EAGLE, specstrat.STANDALONE, specstrat.DFLASH):
        paused = replace(base, speculation=ScriptedSpeculationPolicy((1,) * 20 + (4,)))
        engine = Engine(paused, models, CONFIG)
        out = engine.run([Request("a", prompt, 60)])["a"]
        after_pause = engine.stats.accepted_histogram[3]
        fresh = Engine(base, models, CONFIG)
        again = fresh.run([Request("b", prompt + out[:20], 40)])["b"]
        assert again == out[20:]
        assert fresh.stats.accepted_histogram[3] == after_pause, base.name


@pytest.mark.parametrize(
    ("answer", "shown"),
    [(2.0, r"D=2\.0 \(float\)"), (True, r"D=True \(bool\)"), (7, r"D=7 \(int\)"), (None, "D=None")],
)
def test_a_bad_answer_is_a_named_strategy_error(
    answer: object, shown: str, models: EmbeddedModels
) -> None:
    """An answer that is not a declared int ends the run naming the algorithm, the hook and
    the policy; nothing leaks."""
    policy = FaultySpeculationPolicy(GoodputSpeculationPolicy(), "choose_width", lambda _: answer)
    engine = Engine(replace(NGRAM, speculation=policy), models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    message = (
        rf"NGRAM\.speculation\.choose_width: speculation=FaultySpeculationPolicy answered {shown}"
        r".*declared candidates \[1, 2, 3, 4\]"
    )
    with pytest.raises(StrategyError, match=message):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before


@pytest.mark.parametrize("declared", [[], [0, 2], [2, 2], "24", [True], [2.0], None], ids=repr)
def test_a_bad_declaration_is_refused_at_start(declared: object, models: EmbeddedModels) -> None:
    """A declaration that is not distinct ints >= 1 is refused when the engine is built."""
    policy = FaultySpeculationPolicy(
        FixedSpeculationPolicy(), "candidate_widths", lambda _: declared
    )
    with pytest.raises(
        StrategyError,
        match=r"EAGLE\.speculation\.candidate_widths: speculation=FaultySpeculationPolicy "
        r"declared .*; declare a non-empty sequence of distinct ints >= 1",
    ):
        Engine(replace(EAGLE, speculation=policy), models, CONFIG)


def test_a_declaration_too_wide_for_the_context_is_refused(models: EmbeddedModels) -> None:
    """A largest candidate the context cannot hold is refused at start, naming the policy."""
    policy = BatchScheduleSpeculationPolicy(schedule=((4, 300),))
    with pytest.raises(
        InvalidConfig,
        match=r"NGRAM: speculation=BatchScheduleSpeculationPolicy declares D up to 300, more "
        r"than this engine allows: .*context_len=512",
    ):
        Engine(replace(NGRAM, speculation=policy), models, CONFIG)


def test_a_policy_that_raises_is_named(models: EmbeddedModels) -> None:
    """A chooser raising mid-run is a StrategyError naming the hook, the cause chained."""
    policy = FaultySpeculationPolicy(
        FixedSpeculationPolicy(), "choose_width", RuntimeError("no"), after=3
    )
    engine = Engine(replace(EAGLE, speculation=policy), models, CONFIG)
    with pytest.raises(StrategyError, match=r"EAGLE\.speculation\.choose_width: raised "):
        engine.run(REQUESTS)
    assert engine.free_slots == Engine(EAGLE, models, CONFIG).free_slots


def test_the_observation_carries_what_was_measured(models: EmbeddedModels) -> None:
    """The chooser sees batch size, candidates, conditional acceptance, recent accepted
    counts, the drafter's confidences and measured step costs."""
    seen: list[SpeculationObservation] = []

    def spy(answer: int) -> int:
        return answer

    class Spy:
        per_request_acceptance = True

        def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
            return (1, 3, 4)

        def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> "Spy":
            return self

        def choose_width(self, observation: SpeculationObservation) -> int:
            seen.append(observation)
            return spy(observation.candidates[observation.step % 3])

    run(replace(specstrat.DSPARK, speculation=Spy()), models)
    first, last = seen[0], seen[-1]
    assert first.candidates == (1, 3, 4)
    assert first.batch_size == len(REQUESTS)
    assert first.acceptance == (None, None, None)
    assert first.confidence is None
    assert last.recent_widths[-1] == seen[-2].candidates[(last.step - 1) % 3]
    assert all(a is None or 0 <= a <= 1 for a in last.acceptance)
    assert last.confidence is not None
    assert last.request_acceptance is not None
    assert len(last.request_acceptance) == last.batch_size
    assert all(a is None or 0 <= a <= 1 for rates in last.request_acceptance for a in rates)
    assert any(a is not None for rates in last.request_acceptance for a in rates)
    assert any(c is not None for c in last.step_seconds)


class Watch:
    """Answers D = 4 every step and keeps what it observed; ``per_request_acceptance`` as
    built."""

    def __init__(self, per_request: bool) -> None:
        self.per_request_acceptance = per_request
        self.seen: list[SpeculationObservation] = []

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        return (4,)

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> "Watch":
        return self

    def choose_width(self, observation: SpeculationObservation) -> int:
        self.seen.append(observation)
        return 4


def test_acceptance_per_request_is_counted_only_for_a_policy_that_reads_it(
    models: EmbeddedModels,
) -> None:
    """A policy declaring per_request_acceptance False sees None there; one declaring True
    sees each request's rates, which pool to the global ones."""
    quiet, asks = Watch(False), Watch(True)
    run(replace(NGRAM, speculation=quiet), models)
    run(replace(NGRAM, speculation=asks), models)
    assert all(o.request_acceptance is None for o in quiet.seen)
    assert [o.acceptance for o in quiet.seen] == [o.acceptance for o in asks.seen]
    first = asks.seen[0].request_acceptance
    assert first == ((None, None, None),) * len(REQUESTS)  # nothing verified yet
    rates = [r for o in asks.seen[1:] for r in o.request_acceptance or ()]
    assert any(a is not None for r in rates for a in r)


@pytest.mark.parametrize("declared", ["yes", 1, 0.0], ids=repr)
def test_a_per_request_declaration_that_is_not_a_bool_is_refused(
    declared: object, models: EmbeddedModels
) -> None:
    """per_request_acceptance must be a bool; anything else is refused at start by name."""
    with pytest.raises(
        StrategyError,
        match=r"NGRAM\.speculation\.per_request_acceptance: speculation=Watch declared "
        rf"{declared!r} \({type(declared).__name__}\); declare True if its chooser reads",
    ):
        Engine(replace(NGRAM, speculation=Watch(declared)), models, CONFIG)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda depth: st.tuples(
            st.just(depth),
            st.lists(
                st.integers(0, 9).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))),
                max_size=40,
            ),
        )
    )
)
def test_batched_counts_equal_counting_each_request(
    case: tuple[int, list[tuple[int, int]]],
) -> None:
    """A step's conditional-acceptance counts added as a batch equal adding each request."""
    depth, steps = case
    one, batch = _Counts(depth), _Counts(depth)
    for p, a in steps:
        one.add(p, a)
    batch.add_batch([p for p, _ in steps], [a for _, a in steps])
    assert (batch.reached, batch.hit) == (one.reached, one.hit)


def test_ragged_rows_stay_within_the_chosen_width(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """Under ragged verify the policy's D bounds every request: at D = 2 no row proposes more
    than one draft, rows that found less verify less, output unchanged."""
    from tests.runtime.custom_algos import NGRAM_RAGGED

    policy = ScriptedSpeculationPolicy((4, 2))  # D = 4 once, then D = 2 to the end
    engine = Engine(replace(NGRAM_RAGGED, speculation=policy), models, CONFIG)
    assert engine.run(REQUESTS) == target_only
    stats = engine.stats
    assert set(stats.widths[1:]) == {2}
    assert max(stats.accepted_histogram) <= 3
    assert stats.verify_forward_tokens < 2 * stats.verified_requests + 4 * len(REQUESTS)
