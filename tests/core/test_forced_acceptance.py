"""Forced acceptance: tau = 1 at rate 0, k + 1 at rate 1, conditional acceptance near the rate
in between, lossy, and its configuration checked."""

from dataclasses import replace

import pytest

from specstrat import EAGLE, InvalidConfig
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request
from specstrat.testing import ForcedAcceptance, check_acceptance_rule

#: Four requests that never stop early: 24 new tokens each.
REQUESTS = [
    Request(f"r{i}", tuple(b"def f(x):\n    return " + bytes([65 + i])), 24) for i in range(4)
]
CONFIG = EngineConfig(context_len=128, max_running_requests=4)


@pytest.fixture(scope="module")
def models() -> EmbeddedModels:
    """The embedded models."""
    return EmbeddedModels.load()


def _run(models: EmbeddedModels, rate: float, d: int = 4) -> Engine:
    algo = replace(EAGLE, name="EAGLE_FORCED", acceptance=ForcedAcceptance(rate=rate))
    engine = Engine(algo, models, replace(CONFIG, num_draft_tokens=d))
    out = engine.run(REQUESTS)
    assert all(len(v) == 24 for v in out.values())
    return engine


@pytest.mark.parametrize("d", [2, 4])
def test_rate_zero_gives_tau_one_and_rate_one_gives_k_plus_one(
    models: EmbeddedModels, d: int
) -> None:
    """Rate 0 accepts no draft (tau exactly 1); rate 1 accepts all k = D - 1 (tau exactly D)."""
    assert _run(models, 0.0, d).stats.acceptance_length == 1.0
    every = _run(models, 1.0, d).stats
    assert every.acceptance_length == d
    assert set(every.accepted_histogram) == {d - 1}


def test_a_middle_rate_accepts_each_position_at_that_rate(models: EmbeddedModels) -> None:
    """At rate 0.5 each position's acceptance given the earlier ones is near 0.5 (binomial: the
    bound is over four standard deviations at these counts)."""
    hist = _run(models, 0.5).stats.accepted_histogram[3]
    reached = [sum(hist[i - 1 :]) for i in range(1, 4)]
    accepted = [sum(hist[i:]) for i in range(1, 4)]
    for a, n in zip(accepted, reached, strict=True):
        assert n >= 8
        assert abs(a / n - 0.5) <= 4 * (0.25 / n) ** 0.5 + 1e-9


def test_it_is_lossy_and_passes_the_acceptance_conformance_runner() -> None:
    """The rule says it is lossy and answers every tree with a valid path and bonus."""
    rule = ForcedAcceptance(rate=0.7, seed=3)
    assert rule.lossless is False
    check_acceptance_rule(rule)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate": 1.5}, r"rate=1.5 must be a number in \[0, 1\]"),
        ({"rate": True}, r"rate=True must be a number"),
        ({"rate": 0.5, "seed": -1}, r"seed=-1 must be an int in 0..2\*\*32-1"),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, object], match: str) -> None:
    """A rate outside [0, 1] or a bad seed is an InvalidConfig naming the value."""
    with pytest.raises(InvalidConfig, match=match):
        ForcedAcceptance(**kwargs)  # type: ignore[arg-type]
