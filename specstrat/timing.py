"""Time runs side by side on a shared, noisy machine.

Every contender runs once per round, in the same order each round (A B C A B C ...), after
``warmup`` uncounted rounds; a ratio between two contenders is taken within each round (both
saw the same machine load), then summarised by its median and range. A contender returns its
outputs by request id, so the caller can check every counted round's against a baseline's.
``specstrat bench``, ``bench/e2e.py``, ``bench/hf_speed.py`` and the demo's speed line all time
through this module.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = [
    "Contender",
    "Outputs",
    "Ratio",
    "Timings",
    "interleaved",
    "ratio",
]

Outputs = Mapping[str, Sequence[int]]


@dataclass(frozen=True, slots=True)
class Contender:
    """One thing to time: ``run()`` does the whole workload once and returns the outputs;
    ``prepare()``, if given, runs before each ``run()``, untimed (e.g. building a fresh engine,
    so every run starts from the same state)."""

    name: str
    run: Callable[[], Outputs]
    prepare: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Timings:
    """A contender's counted rounds: wall seconds per round, tokens per round (from its first
    counted round's outputs), those outputs, and every counted round's outputs in order
    (``round_outputs[0] == outputs``), to check each run, not only the first."""

    name: str
    seconds: tuple[float, ...]
    tokens: int
    outputs: dict[str, list[int]]
    round_outputs: tuple[dict[str, list[int]], ...] = ()

    @property
    def median_seconds(self) -> float:
        """Median wall seconds per round."""
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        """Tokens over the median round's seconds."""
        return self.tokens / self.median_seconds if self.median_seconds else 0.0


@dataclass(frozen=True, slots=True)
class Ratio:
    """Speed of ``name`` over ``baseline`` (its tokens per second over the baseline's), per
    round and summarised: median, min, max."""

    name: str
    baseline: str
    per_round: tuple[float, ...]

    @property
    def median(self) -> float:
        """Median of the per-round ratios."""
        return statistics.median(self.per_round)

    def line(self) -> str:
        """``1.83x (1.71-1.90) NGRAM / NONE``."""
        lo, hi = min(self.per_round), max(self.per_round)
        return f"{self.median:.2f}x ({lo:.2f}-{hi:.2f}) {self.name} / {self.baseline}"


def interleaved(
    contenders: Sequence[Contender],
    *,
    rounds: int = 3,
    warmup: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Timings]:
    """Time every contender ``rounds`` times, interleaved, after ``warmup`` uncounted rounds."""
    names = [c.name for c in contenders]
    if len(set(names)) != len(names) or not names:
        raise InvalidConfig(f"contenders={names}: pass at least one, with distinct names")
    for name, value, low in (("rounds", rounds, 1), ("warmup", warmup, 0)):
        if not is_int(value) or value < low:
            raise InvalidConfig(f"{name}={value!r} must be an int >= {low}")
    seconds: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[dict[str, list[int]]]] = {n: [] for n in names}
    for index in range(warmup + rounds):
        for c in contenders:
            if progress is not None:
                kind = "warm-up" if index < warmup else f"round {index - warmup + 1}/{rounds}"
                progress(f"{kind}: {c.name}")
            if c.prepare is not None:
                c.prepare()
            start = time.perf_counter()
            out = c.run()
            elapsed = time.perf_counter() - start
            if index >= warmup:
                seconds[c.name].append(elapsed)
                outputs[c.name].append({rid: list(ids) for rid, ids in out.items()})
    return {
        n: Timings(
            n,
            tuple(seconds[n]),
            sum(len(v) for v in outputs[n][0].values()),
            outputs[n][0],
            tuple(outputs[n]),
        )
        for n in names
    }


def ratio(timings: Mapping[str, Timings], name: str, baseline: str) -> Ratio:
    """``name``'s speed over ``baseline``'s, round by round (tokens per second, so contenders
    that produce different token counts compare fairly)."""
    a, b = timings[name], timings[baseline]
    per = tuple(
        (a.tokens / sa) / (b.tokens / sb) if sa and sb and b.tokens else 0.0
        for sa, sb in zip(a.seconds, b.seconds, strict=True)
    )
    return Ratio(name, baseline, per)
