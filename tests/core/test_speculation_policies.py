"""The built-in speculation policies answer as the engines they mirror, refuse bad settings by
name, and pass (or, when broken, fail) the conformance runner."""

from dataclasses import replace
from typing import Any

import pytest

from specstrat import ConformanceError, InvalidConfig, SpeculationObservation
from specstrat.speculation import FixedSpeculationPolicy, expected_tokens
from specstrat.strategies import (
    BatchScheduleSpeculationPolicy,
    EmaLadderSpeculationPolicy,
    GoodputSpeculationPolicy,
)
from specstrat.testing import (
    FaultySpeculationPolicy,
    ScriptedSpeculationPolicy,
    check_speculation_policy,
)


def seen(
    step: int, bs: int = 1, accepted: tuple[int, ...] = (), **kw: Any
) -> SpeculationObservation:
    """An observation at ``step`` whose previous step accepted ``accepted`` drafts per request."""
    fields: dict[str, Any] = {
        "batch_size": bs,
        "candidates": (1, 2, 4, 6, 8),
        "current": 4,
        "step": step,
        "acceptance": (),
        "request_acceptance": ((),) * bs,
        "recent_accepted": (accepted,) if accepted else (),
        "recent_widths": (4,) if accepted else (),
        "confidence": None,
        "step_seconds": (None,) * 5,
    }
    return SpeculationObservation(**{**fields, **kw})


def test_the_ema_ladder_follows_sglangs_rule() -> None:
    """bs 1 starts at the configured D = 4 (k 3); the first decision comes at batch 15 (10
    warm-up, then every 5): all drafts accepted climbs, none accepted falls to the floor."""
    chooser = EmaLadderSpeculationPolicy().create_chooser((1, 2, 4, 6, 8), 4)
    answers = [chooser.choose_width(seen(0))]
    for step in range(1, 31):
        answers.append(chooser.choose_width(seen(step, accepted=(7,))))
    assert answers[:15] == [4] * 15  # 10 warm-up batches, then a decision every 5
    assert answers[15] == 8  # EMA 6.8 > k - 0.5 for every rung: up to the top at once
    falling = [chooser.choose_width(seen(s, accepted=(0,))) for s in range(31, 80)]
    assert falling[-1] == 2  # the bs-1 ladder's floor (D 2, k 1)
    routed = chooser.choose_width(seen(80, bs=9, accepted=(0,)))
    assert routed == 4  # bs 9 routes to the bs-8 ladder, which starts at D 4 too


def test_the_ema_ladder_probes_up_from_k_zero() -> None:
    """At D = 1 (k 0) the EMA is not updated and each decision probes the next rung."""
    policy = EmaLadderSpeculationPolicy(ladders=((1, (1, 2, 4), 0.0),), warmup=0, interval=1)
    chooser = policy.create_chooser((1, 2, 4), 1)
    assert chooser.choose_width(seen(0)) == 1
    assert chooser.choose_width(seen(1, accepted=(0, 0))) == 2


def test_the_schedule_reads_batch_size_ranges() -> None:
    """TensorRT-LLM's example schedule: bs 1-4 -> D 5, 5-8 -> 3, 9-32 -> 2, above -> 1."""
    policy = BatchScheduleSpeculationPolicy()
    chooser = policy.create_chooser(tuple(policy.candidate_widths(4)), 4)
    widths = [chooser.choose_width(seen(0, bs=bs)) for bs in (1, 4, 5, 8, 9, 32, 33)]
    assert widths == [5, 5, 3, 3, 2, 2, 1]
    assert policy.candidate_widths(4) == (1, 2, 3, 5)


def test_goodput_profiles_then_maximises_expected_tokens_per_second() -> None:
    """Unmeasured candidates run first, smallest first; then argmax E(k) / cost."""
    chooser = GoodputSpeculationPolicy().create_chooser((1, 2, 4), 4)
    base: dict[str, Any] = {"candidates": (1, 2, 4), "acceptance": (0.9, 0.9, 0.9)}
    assert chooser.choose_width(seen(0, step_seconds=(None, None, None), **base)) == 1
    assert chooser.choose_width(seen(1, step_seconds=(1.0, None, None), **base)) == 2
    assert chooser.choose_width(seen(2, step_seconds=(1.0, 1.1, 1.2), **base)) == 4
    low: dict[str, Any] = {**base, "acceptance": (0.05, 0.05, 0.05)}
    assert chooser.choose_width(seen(3, step_seconds=(1.0, 1.1, 1.2), **low)) == 1
    assert expected_tokens((0.5, None), 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


@pytest.mark.parametrize(
    "policy",
    [
        FixedSpeculationPolicy(),
        FixedSpeculationPolicy(width=2),
        EmaLadderSpeculationPolicy(),
        BatchScheduleSpeculationPolicy(),
        GoodputSpeculationPolicy(widths=(1, 3)),
        ScriptedSpeculationPolicy((1, 4, 2)),
    ],
    ids=lambda p: type(p).__name__,
)
def test_every_builtin_passes_the_conformance_runner(policy: Any) -> None:
    """Each built-in declares stable candidates and answers only them, deterministically."""
    assert check_speculation_policy(policy, engine_run=False)


class Flaky:
    """Answers differently each time it is created: not deterministic for the same state."""

    made = 0
    per_request_acceptance = False

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        return (1, 2)

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> "Flaky":
        Flaky.made += 1
        return self

    def choose_width(self, observation: SpeculationObservation) -> int:
        return 1 + Flaky.made % 2


class Vague(Flaky):
    """Declares per_request_acceptance as a string."""

    per_request_acceptance = "sometimes"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            Vague(),
            r"'per_request_acceptance is a bool': it is 'sometimes' \(str\); declare True "
            r"only if the chooser reads SpeculationObservation\.request_acceptance",
        ),
        (
            FaultySpeculationPolicy(FixedSpeculationPolicy(), "choose_width", lambda w: w + 0.5),
            r"SpeculationPolicy FaultySpeculationPolicy broke the obligation 'choose_width answers "
            r"an int among the declared candidates': answered 1\.5 \(float\)",
        ),
        (
            FaultySpeculationPolicy(FixedSpeculationPolicy(), "choose_width", lambda w: True),
            r"answered True \(bool\)",
        ),
        (
            FaultySpeculationPolicy(FixedSpeculationPolicy(), "candidate_widths", lambda w: [0]),
            r"'candidate_widths\(1\) is the same non-empty sequence of distinct ints >= 1': "
            r"declared \[0\]",
        ),
        (
            FaultySpeculationPolicy(FixedSpeculationPolicy(), "choose_width", KeyError("k")),
            r"choose_width answers an int.*raised KeyError",
        ),
        (Flaky(), r"two fresh choosers fed the same observations answer the same"),
        (object(), r"implements SpeculationPolicy"),
    ],
    ids=[
        "per-request-not-bool",
        "float",
        "bool",
        "declared-zero",
        "raises",
        "not-deterministic",
        "not-a-policy",
    ],
)
def test_the_conformance_runner_refuses_nonsense_by_name(policy: object, message: str) -> None:
    """A broken policy fails the runner with a ConformanceError naming it and the value."""
    with pytest.raises(ConformanceError, match=message):
        check_speculation_policy(policy, engine_run=False)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: FixedSpeculationPolicy(width=0),
            r"FixedSpeculationPolicy\(width=0\): width must be an int >= 1",
        ),
        (lambda: FixedSpeculationPolicy(width=True), r"width=True\): width must be an int"),
        (lambda: EmaLadderSpeculationPolicy(ladders=()), r"ladders is empty"),
        (
            lambda: EmaLadderSpeculationPolicy(ladders=((8, (1,), 0.0), (1, (2,), 0.0))),
            r"ladder batch sizes \[8, 1\] must be ascending",
        ),
        (
            lambda: EmaLadderSpeculationPolicy(ladders=((1, (0, 2), 0.0),)),
            r"widths \(0, 2\) must be ints >= 1",
        ),
        (lambda: EmaLadderSpeculationPolicy(alpha=0), r"alpha=0 must be in \(0, 1\]"),
        (lambda: EmaLadderSpeculationPolicy(interval=0), r"interval=0 is out of range"),
        (lambda: EmaLadderSpeculationPolicy(warmup=-1), r"warmup=-1 is out of range"),
        (lambda: BatchScheduleSpeculationPolicy(schedule=()), r"schedule batch sizes \[\] must be"),
        (lambda: BatchScheduleSpeculationPolicy(beyond=0), r"widths .* must be ints >= 1"),
        (lambda: GoodputSpeculationPolicy(widths=(2.0,)), r"widths \(2\.0,\) must be ints >= 1"),  # type: ignore[arg-type]
        (lambda: GoodputSpeculationPolicy(prior=2), r"prior=2 must be in \[0, 1\]"),
        (lambda: ScriptedSpeculationPolicy(()), r"script=\(\) must be ints >= 1"),
    ],
)
def test_bad_settings_are_refused_by_name(make: Any, message: str) -> None:
    """Each policy validates its settings at construction, naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        make()


def test_faulty_declarations_count_once() -> None:
    """A faulty declaration's cue is fresh per call, so engines built in turn see the same."""
    policy = FaultySpeculationPolicy(GoodputSpeculationPolicy(), "candidate_widths", lambda w: (9,))
    assert policy.candidate_widths(4) == (9,)
    assert policy.candidate_widths(4) == (9,)
    assert replace(policy, method="none").candidate_widths(2) == (1, 2)
