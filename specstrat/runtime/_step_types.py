"""What a step hands on: each decode stage's frozen record, and what a step produced.

A decode step (:meth:`~specstrat.runtime._step.StepRunner.decode`) passes its state from stage
to stage as immutable records, each holding the host copies taken when its stage's answer was
checked: :class:`Resolved` (the step's lane and the slots' rows, lengths and bonus tokens, read
before anything changes) -> :class:`Drafted` (the drafter's tree) -> :class:`Verified` (the
target's logits) -> :class:`Accepted` (the rule's answer) -> :class:`Kept` (the accepted path
in the KV, the tokens each request produced). The step emits a :class:`StepOutput` with one
:class:`~specstrat.runtime._stats.StepRecord` of what it measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from specstrat.contracts import HostAcceptance, HostTree
from specstrat.drafting import Acceptance, DraftStep, DraftTree
from specstrat.errors import InternalError, InvalidConfig
from specstrat.runtime._adapt import WidthLane
from specstrat.runtime._slots import SlotRow
from specstrat.runtime._stats import StepRecord

__all__ = [
    "Accepted",
    "Drafted",
    "Kept",
    "Produced",
    "Resolved",
    "StepOutput",
    "Verified",
    "engine_invariant",
]


@dataclass(frozen=True, slots=True)
class Produced:
    """A traced step's record for one request: its tokens, what was drafted (tokens,
    parents), which nodes were accepted and the step's D (0 for a prefill or admission)."""

    tokens: list[int]
    drafts: Sequence[int] = ()
    parents: Sequence[int] = ()
    accepted: Sequence[int] = ()
    width: int = 0


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one prefill, PREBUILT admission or decode step produced, per request in ``slots``'
    order (parallel lists, built with list operations: nothing is made per request that the
    scheduler does not need): the tokens, the decode step's measurements (``record``; ``None``
    for a prefill or an admission; the run's ledger counts them only for requests that keep
    the step) and, when the run is traced, what each request drafted (:class:`Produced`)."""

    slots: list[int]
    tokens: list[list[int]]
    record: StepRecord | None = None
    traced: list[Produced] | None = None


@dataclass(frozen=True, slots=True)
class Resolved:
    """The step's lane (its D) and, read before anything changes, the slots' rows, their
    committed lengths and bonus tokens; ``step``: what the drafter is handed (the relay's
    payload resolved and checked against those lengths)."""

    lane: WidthLane
    rows: list[SlotRow]
    lengths: list[int]
    bonus: list[int]
    step: DraftStep
    started: float  # the step's perf_counter start


@dataclass(frozen=True, slots=True)
class Drafted:
    """The drafter's checked tree (``drafts``, device) and its host copy (``tree``)."""

    drafts: DraftTree
    tree: HostTree
    chain: bool
    at: float  # perf_counter when drafting ended


@dataclass(frozen=True, slots=True)
class Verified:
    """The target's logits and hidden states over the verify rows, and the target tokens the
    verifier ran (``ran``: T per request, or fewer under ragged verify)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    ran: int
    at: float


@dataclass(frozen=True, slots=True)
class Accepted:
    """The rule's checked answer (``acceptance``, device) and its host copy (``answer``)."""

    acceptance: Acceptance
    answer: HostAcceptance
    at: float


@dataclass(frozen=True, slots=True)
class Kept:
    """The accepted path kept in the KV: each sequence's new length, its accepted drafts, the
    node each bonus token was chosen after (0: the root), and the tokens it produced."""

    lengths: list[int]
    accepted: list[list[int]]
    at_bonus: list[int]
    tokens: list[list[int]]


@contextmanager
def engine_invariant(what: str) -> Iterator[None]:
    """The engine's own calls with values it checked or reserved (admission reserved every
    position, the hooks' answers were checked): an InvalidConfig there is a broken invariant
    of specstrat, not a value the caller passed."""
    try:
        yield
    except InvalidConfig as exc:
        raise InternalError(
            f"{what} refused values the engine checked before ({exc}); this is a bug in "
            "specstrat, please report it"
        ) from exc
