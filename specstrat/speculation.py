"""What a speculation policy sees before each decode step, and the default policy.

A :class:`~specstrat.protocols.SpeculationPolicy` (the ``speculation`` field of an algorithm)
declares at engine start the values of D (``num_draft_tokens``, root included) it may answer, and
creates, once per engine, a :class:`~specstrat.protocols.WidthChooser` that answers each decode
step's D from a :class:`SpeculationObservation`. ``D = 1`` is a plain decode step (no drafting,
``T = 1`` token verified). :class:`FixedSpeculationPolicy`, the default, answers the configured D
every step, which is how every algorithm ran before the hook existed. The other built-ins are in
:mod:`specstrat.strategies.speculation_policies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = [
    "COST_WEIGHT",
    "RECENT_STEPS",
    "FixedSpeculationPolicy",
    "FixedWidthChooser",
    "SpeculationObservation",
    "expected_tokens",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationObservation:
    """What the engine measured, handed to :meth:`WidthChooser.choose_width` before a step.

    ``batch_size``: requests in the step about to run. ``candidates``: the declared D values,
    ascending. ``current``: the D of the previous decode step (the largest candidate before the
    first). ``step``: decode steps run so far by this engine.

    ``acceptance``: conditional acceptance by draft position, ``acceptance[j - 1]`` = how often
    position ``j`` was accepted among the request-steps that proposed it *and* accepted
    position ``j - 1`` (``None``: never observed). Positions a step did not propose are
    unobserved, never rejections. ``request_acceptance``: the same per request of the step
    (in the step's order), counted since each request started; ``None`` unless the policy
    declares :attr:`~specstrat.protocols.SpeculationPolicy.per_request_acceptance`.

    ``recent_accepted``: the last steps' accepted drafts per request (oldest first; at most
    :data:`RECENT_STEPS`), with ``recent_widths`` the D each of those steps ran at.
    ``confidence``: the drafter's mean confidence by position in the last step that reported
    any (:attr:`~specstrat.drafting.DraftTree.confidence`), ``None`` if none did.
    ``step_seconds``: per candidate (same order), the measured seconds of a whole decode step
    at that D for batches of this size's bucket (the next power of two), an exponential moving
    average (weight :data:`COST_WEIGHT` for the newest step); ``None`` until measured.
    """

    batch_size: int
    candidates: tuple[int, ...]
    current: int
    step: int
    acceptance: tuple[float | None, ...]
    request_acceptance: tuple[tuple[float | None, ...], ...] | None
    recent_accepted: tuple[tuple[int, ...], ...]
    recent_widths: tuple[int, ...]
    confidence: tuple[float, ...] | None
    step_seconds: tuple[float | None, ...]

    def cost(self, width: int) -> float | None:
        """The measured seconds of a step at D = ``width`` (``None``: not measured yet)."""
        return self.step_seconds[self.candidates.index(width)]


#: Steps of accepted counts an observation carries.
RECENT_STEPS = 8
#: Weight of the newest step in the measured step cost's moving average.
COST_WEIGHT = 0.2


def expected_tokens(acceptance: Sequence[float | None], drafts: int, prior: float = 0.5) -> float:
    """``E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j``: tokens a step drafting ``drafts`` (k)
    tokens is expected to produce, from conditional acceptance ``alpha`` by position. A
    position never observed takes the last observed position's value (``prior`` if none)."""
    total, running, last = 1.0, 1.0, prior
    for i in range(drafts):
        seen = acceptance[i] if i < len(acceptance) else None
        last = last if seen is None else seen
        running *= last
        total += running
    return total


class FixedWidthChooser:
    """Answers one D every step."""

    def __init__(self, width: int) -> None:
        self.width = width

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The fixed D."""
        return self.width


@dataclass(frozen=True, slots=True)
class FixedSpeculationPolicy:
    """Today's behaviour, the default: every step drafts at the configured D
    (``EngineConfig.num_draft_tokens``), or at ``width`` when given."""

    width: int | None = None
    per_request_acceptance = False  # answers one D whatever it observes

    def __post_init__(self) -> None:
        if self.width is not None and (not is_int(self.width) or self.width < 1):
            raise InvalidConfig(
                f"FixedSpeculationPolicy(width={self.width!r}): width must be an int >= 1 "
                "(1 decodes plainly), or None for EngineConfig.num_draft_tokens"
            )

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """One candidate: ``width``, or the configured D."""
        return (num_draft_tokens if self.width is None else self.width,)

    def create_chooser(
        self, candidates: tuple[int, ...], num_draft_tokens: int
    ) -> FixedWidthChooser:
        """A chooser answering the one candidate."""
        return FixedWidthChooser(candidates[-1])
