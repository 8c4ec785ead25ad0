"""The timing core: interleaved rounds, warm-up not counted, ratios taken within a round."""

from __future__ import annotations

import itertools

import pytest

from specstrat import timing
from specstrat.errors import InvalidConfig
from specstrat.timing import Contender, interleaved, ratio


def test_rounds_interleave_and_warmup_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contenders run A B A B ... in order; warm-up rounds are run but not timed."""
    order: list[str] = []
    clock = itertools.count()  # each perf_counter call one second later
    monkeypatch.setattr("specstrat.timing.time.perf_counter", lambda: float(next(clock)))

    def run(name: str, tokens: int) -> Contender:
        def once() -> dict[str, list[int]]:
            order.append(name)
            return {"r": list(range(tokens))}

        return Contender(name, once)

    result = interleaved([run("A", 4), run("B", 2)], rounds=2, warmup=1)
    assert order == ["A", "B"] * 3
    assert result["A"].seconds == (1.0, 1.0)
    assert (result["A"].tokens, result["B"].tokens) == (4, 2)
    assert result["A"].tokens_per_s == 4.0


def test_ratio_is_per_round_tokens_per_second() -> None:
    """A ratio compares tokens per second round by round, then takes the median."""
    fast = timing.Timings("fast", (1.0, 2.0, 1.0), 10, {})
    base = timing.Timings("base", (2.0, 2.0, 4.0), 10, {})
    r = ratio({"fast": fast, "base": base}, "fast", "base")
    assert r.per_round == (2.0, 1.0, 4.0)
    assert r.median == 2.0
    assert r.line() == "2.00x (1.00-4.00) fast / base"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"contenders": []}, r"contenders=\[\]: pass at least one"),
        ({"contenders": [Contender("A", dict), Contender("A", dict)]}, r"with distinct names"),
        ({"rounds": 0}, r"rounds=0 must be an int >= 1"),
        ({"warmup": -1}, r"warmup=-1 must be an int >= 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    """Empty or duplicate contenders and bad round counts are refused by name."""
    args: dict[str, object] = {"contenders": [Contender("A", dict)], **kwargs}
    with pytest.raises(InvalidConfig, match=message):
        interleaved(**args)  # type: ignore[arg-type]


def test_prepare_runs_untimed_before_every_run_and_every_round_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A contender's prepare runs before each of its runs, outside the timed span; every
    counted round's outputs are kept in order."""
    order: list[str] = []
    clock = itertools.count()
    monkeypatch.setattr("specstrat.timing.time.perf_counter", lambda: float(next(clock)))
    runs = itertools.count()

    def run() -> dict[str, list[int]]:
        order.append("run")
        return {"r": [next(runs)]}

    result = interleaved([Contender("A", run, lambda: order.append("prepare"))], rounds=2)
    assert order == ["prepare", "run"] * 3
    assert result["A"].seconds == (1.0, 1.0)
    assert result["A"].round_outputs == ({"r": [1]}, {"r": [2]})
    assert result["A"].outputs == {"r": [1]}
