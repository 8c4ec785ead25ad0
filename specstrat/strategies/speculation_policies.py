"""Built-in speculation policies (``SpecAlgorithm.speculation``): how many tokens each decode
step drafts, decided per step. Each works with any algorithm, trees included; D counts the
root (``D = 1`` is a plain decode step, k = D - 1 tokens drafted).

* :class:`~specstrat.speculation.FixedSpeculationPolicy` (the default): the configured D.
* :class:`EmaLadderSpeculationPolicy`: SGLang 0.5.23's adaptive speculation
  (``speculative/adaptive_spec_params.py``, ``DEFAULT_ADAPTIVE_CONFIG``): an exponential moving
  average of accepted drafts per batch-size bucket, a ladder of candidates per bucket, moves
  decided every few batches after a warm-up, with hysteresis.
* :class:`BatchScheduleSpeculationPolicy`: batch-size ranges to D, as vLLM's dynamic
  speculative decoding (``num_speculative_tokens_per_batch_size``) and TensorRT-LLM's
  ``draft_len_schedule`` (``D = 1`` above the last range: speculation off).
* :class:`GoodputSpeculationPolicy`: the D maximising expected tokens per second,
  ``E(k) / cost(D)`` with ``E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j`` (the throughput-aware
  rule SGLang's adaptive-speculation proposal describes), costs measured on the real path.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.speculation import FixedSpeculationPolicy as FixedSpeculationPolicy
from specstrat.speculation import SpeculationObservation, expected_tokens

__all__ = [
    "SGLANG_ADAPTIVE_LADDERS",
    "TRTLLM_DRAFT_LEN_SCHEDULE",
    "BatchScheduleSpeculationPolicy",
    "EmaLadderChooser",
    "EmaLadderSpeculationPolicy",
    "FixedSpeculationPolicy",
    "GoodputChooser",
    "GoodputSpeculationPolicy",
    "ScheduleChooser",
]

#: SGLang 0.5.23's ``DEFAULT_ADAPTIVE_CONFIG``: batch size (the bucket's smallest) ->
#: (candidate D values, down hysteresis). SGLang lists ``speculative_num_steps`` (k):
#: bs 1: [1, 3, 5, 7], down -0.25; bs 8: [0, 1, 3]; bs 32: [0, 1]; bs 64: [0] (down 0.0);
#: up hysteresis 0.0 everywhere. Here D = k + 1.
SGLANG_ADAPTIVE_LADDERS: tuple[tuple[int, tuple[int, ...], float], ...] = (
    (1, (2, 4, 6, 8), -0.25),
    (8, (1, 2, 4), 0.0),
    (32, (1, 2), 0.0),
    (64, (1,), 0.0),
)

#: TensorRT-LLM's documented ``draft_len_schedule`` example ``{4: 4, 8: 2, 32: 1}`` (batch
#: sizes up to the key draft the value; above 32 speculation is off), as (largest batch size,
#: D = draft length + 1).
TRTLLM_DRAFT_LEN_SCHEDULE: tuple[tuple[int, int], ...] = ((4, 5), (8, 3), (32, 2))


def _check_widths(owner: str, widths: tuple[int, ...]) -> None:
    if not widths or any(not is_int(w) or w < 1 for w in widths):
        raise InvalidConfig(f"{owner}: widths {widths!r} must be ints >= 1 (D, root included)")


# -- the EMA ladder ----------------------------------------------------------------------------


@dataclass(frozen=False, slots=True)
class _Rung:
    """One batch-size bucket's state: its ladder (in k), current k, EMA and batch count."""

    ladder: list[int]
    down: float
    current: int
    ema: float
    batches: int = 0


class EmaLadderChooser:
    """Per batch-size bucket: ``ema <- (1 - alpha) ema + alpha * mean accepted drafts`` after
    each step (not updated at k = 0), a decision every ``interval`` batches after ``warmup``:
    step down while ``ema <= k_prev - 0.5 + down`` (``0.5 + down`` when ``k_prev = 0``), else up
    while ``ema > k - 0.5 + up``; from k = 0 it probes the next rung up (SGLang's rule)."""

    def __init__(self, policy: EmaLadderSpeculationPolicy, initial: int) -> None:
        self.policy = policy
        self.keys = [bs for bs, _, _ in policy.ladders]
        self.rungs = []
        for _, widths, down in policy.ladders:
            ladder = sorted(w - 1 for w in widths)
            k = initial - 1 if initial - 1 in ladder else ladder[len(ladder) // 2]
            self.rungs.append(_Rung(ladder, down, k, float(k - 1)))
        self.seen, self.last_rung = 0, -1

    def _rung(self, batch_size: int) -> int:
        return max(0, bisect.bisect_right(self.keys, batch_size) - 1)

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The rung of this batch size's bucket, after learning from the previous step."""
        if observation.step > self.seen and observation.recent_accepted and self.last_rung >= 0:
            self._update(self.rungs[self.last_rung], observation.recent_accepted[-1])
        self.seen = observation.step
        self.last_rung = self._rung(observation.batch_size)
        return self.rungs[self.last_rung].current + 1

    def _update(self, rung: _Rung, accepted: tuple[int, ...]) -> None:
        p = self.policy
        if not accepted:
            return
        if rung.current > 0:
            rung.ema = (1 - p.alpha) * rung.ema + p.alpha * sum(accepted) / len(accepted)
        rung.batches += 1
        if rung.batches <= p.warmup or (rung.batches - p.warmup) % p.interval:
            return
        ladder, at = rung.ladder, rung.ladder.index(rung.current)
        if rung.current == 0:
            at = min(at + 1, len(ladder) - 1)
            if ladder[at] > 0 and rung.ema < 0:
                rung.ema = float(ladder[at] - 1)
            rung.current = ladder[at]
            return
        start = at
        while at > 0 and rung.ema <= (0.5 if ladder[at - 1] == 0 else ladder[at - 1] - 0.5) + (
            rung.down
        ):
            at -= 1
        if at == start:
            while at < len(ladder) - 1 and rung.ema > ladder[at] - 0.5 + p.up:
                at += 1
        rung.current = ladder[at]


@dataclass(frozen=True, slots=True, kw_only=True)
class EmaLadderSpeculationPolicy:
    """SGLang's adaptive speculation: an EMA ladder with hysteresis per batch-size bucket.

    ``ladders``: (smallest batch size of the bucket, candidate D values, down hysteresis), a
    batch routed to the bucket with the largest key <= its size (default
    :data:`SGLANG_ADAPTIVE_LADDERS`). ``alpha`` 0.2, ``warmup`` 10 batches, ``interval`` 5
    batches and ``up`` 0.0 are SGLang 0.5.23's defaults (``ema_alpha``, ``warmup_batches``,
    ``update_interval``, ``up_hysteresis``). Each bucket starts at the configured D when its
    ladder has it, else at the ladder's middle rung, with the EMA at that rung's k - 1.
    SGLang pads the batch size to a CUDA-graph bucket before routing; this policy routes the
    real batch size.
    """

    ladders: tuple[tuple[int, tuple[int, ...], float], ...] = SGLANG_ADAPTIVE_LADDERS
    alpha: float = 0.2
    warmup: int = 10
    interval: int = 5
    up: float = 0.0
    per_request_acceptance = False  # reads the global statistics only

    def __post_init__(self) -> None:
        if not self.ladders:
            raise InvalidConfig("EmaLadderSpeculationPolicy: ladders is empty; give at least one")
        keys = [entry[0] for entry in self.ladders]
        if any(not is_int(k) or k < 1 for k in keys) or keys != sorted(set(keys)):
            raise InvalidConfig(
                f"EmaLadderSpeculationPolicy: ladder batch sizes {keys!r} must be ascending, "
                "distinct ints >= 1"
            )
        for _, widths, _ in self.ladders:
            _check_widths("EmaLadderSpeculationPolicy", tuple(widths))
        if not 0 < self.alpha <= 1:
            raise InvalidConfig(
                f"EmaLadderSpeculationPolicy: alpha={self.alpha!r} must be in (0, 1]"
            )
        for name in ("warmup", "interval"):
            value = getattr(self, name)
            if not is_int(value) or value < (name == "interval"):
                raise InvalidConfig(f"EmaLadderSpeculationPolicy: {name}={value!r} is out of range")

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """Every ladder's D values (SGLang sizes its buffers for their union)."""
        return tuple(sorted({w for _, widths, _ in self.ladders for w in widths}))

    def create_chooser(
        self, candidates: tuple[int, ...], num_draft_tokens: int
    ) -> EmaLadderChooser:
        """Fresh EMAs, each bucket at the configured D if its ladder has it."""
        return EmaLadderChooser(self, initial=num_draft_tokens)


# -- the batch-size schedule -------------------------------------------------------------------


class ScheduleChooser:
    """Looks the batch size up in the schedule."""

    def __init__(self, limits: list[int], widths: list[int], beyond: int) -> None:
        self.limits, self.widths, self.beyond = limits, widths, beyond

    def choose_width(self, observation: SpeculationObservation) -> int:
        """D of the first range holding the batch size, ``beyond`` past the last."""
        at = bisect.bisect_left(self.limits, observation.batch_size)
        return self.widths[at] if at < len(self.widths) else self.beyond


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchScheduleSpeculationPolicy:
    """Batch-size ranges to D: ``schedule`` pairs (largest batch size, D), ascending; batches
    larger than every range run at ``beyond`` (default 1: plain decoding, TensorRT-LLM's
    implicit draft length 0). Default :data:`TRTLLM_DRAFT_LEN_SCHEDULE`."""

    schedule: tuple[tuple[int, int], ...] = TRTLLM_DRAFT_LEN_SCHEDULE
    beyond: int = 1
    per_request_acceptance = False  # reads the global statistics only

    def __post_init__(self) -> None:
        limits = [entry[0] for entry in self.schedule]
        if (
            not limits
            or any(not is_int(b) or b < 1 for b in limits)
            or limits != sorted(set(limits))
        ):
            raise InvalidConfig(
                f"BatchScheduleSpeculationPolicy: schedule batch sizes {limits!r} must be "
                "ascending, distinct ints >= 1"
            )
        _check_widths(
            "BatchScheduleSpeculationPolicy", (*(w for _, w in self.schedule), self.beyond)
        )

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """Every D the schedule names, ``beyond`` included."""
        return tuple(sorted({*(w for _, w in self.schedule), self.beyond}))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> ScheduleChooser:
        """A lookup over the schedule."""
        limits = [b for b, _ in self.schedule]
        return ScheduleChooser(limits, [w for _, w in self.schedule], self.beyond)


# -- goodput ------------------------------------------------------------------------------------


class GoodputChooser:
    """Profiles each candidate once per batch-size bucket on the real path (the first steps
    of a bucket run each unmeasured D in turn, smallest first), then answers
    ``argmax_D E(D - 1) / cost(D)`` (ties: the smaller D)."""

    def __init__(self, prior: float) -> None:
        self.prior = prior

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The measured-goodput maximiser, or the next candidate to profile."""
        for width, cost in zip(observation.candidates, observation.step_seconds, strict=True):
            if cost is None:
                return width
        best, best_rate = observation.candidates[0], -1.0
        for width, cost in zip(observation.candidates, observation.step_seconds, strict=True):
            assert cost is not None  # every candidate was measured above
            rate = expected_tokens(observation.acceptance, width - 1, self.prior) / max(cost, 1e-9)
            if rate > best_rate:
                best, best_rate = width, rate
        return best


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputSpeculationPolicy:
    """Expected tokens per second: ``E(k) / cost(D)``, ``k = D - 1``.

    ``widths``: the candidates (default ``1..num_draft_tokens``); ``prior``: the acceptance
    assumed at a position never observed (the last observed position's otherwise). Step costs
    are the engine's measured moving averages per batch-size bucket
    (:attr:`~specstrat.speculation.SpeculationObservation.step_seconds`), profiled by running
    each candidate once at the start of a bucket, then updated from every measured step.
    """

    widths: tuple[int, ...] | None = None
    prior: float = 0.5
    per_request_acceptance = False  # reads the global statistics only

    def __post_init__(self) -> None:
        if self.widths is not None:
            _check_widths("GoodputSpeculationPolicy", tuple(self.widths))
        if not 0 <= self.prior <= 1:
            raise InvalidConfig(f"GoodputSpeculationPolicy: prior={self.prior!r} must be in [0, 1]")

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """``widths``, or every D from 1 to the configured one."""
        return self.widths if self.widths is not None else tuple(range(1, num_draft_tokens + 1))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> GoodputChooser:
        """A chooser reading the engine's measurements."""
        return GoodputChooser(self.prior)
