"""Fault-injecting doubles: wrap a real strategy and make one of its methods fail on cue.

Each double delegates to the strategy it wraps and, from the ``after``-th call of ``method`` on
(0: the first), either raises ``fault`` (an exception instance or class) or, when ``fault`` is a
plain function, returns ``fault(result)`` instead of the real result — a way to return a wrong
shape, a token outside the vocabulary or a path that is not in the tree. Use them to check that
an engine reports the hook, releases what it held and refuses further use::

    algo = dataclasses.replace(EAGLE, drafter=FaultyDrafterFactory(EAGLE.drafter, "propose",
                                                                   RuntimeError("boom")))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from specstrat.drafting import (
    Acceptance,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
    VerifyInputs,
)
from specstrat.errors import InvalidConfig
from specstrat.models import LoadedModels
from specstrat.protocols import (
    AcceptanceRule,
    Drafter,
    DrafterFactory,
    FutureMap,
    FutureMapFactory,
)
from specstrat.relay import RelayPayload

__all__ = [
    "Fault",
    "FaultyAcceptance",
    "FaultyDrafter",
    "FaultyDrafterFactory",
    "FaultyFutureMap",
    "FaultyFutureMapFactory",
]

Fault = BaseException | type[BaseException] | Callable[[Any], Any]
_R = TypeVar("_R")


@dataclass(frozen=False, slots=True)
class _Cue:
    """When and how a wrapped method fails; counts its calls."""

    method: str
    fault: Fault
    after: int = 0
    calls: int = field(default=0)

    def __call__(self, name: str, real: Callable[[], _R]) -> _R:
        if name != self.method:
            return real()
        self.calls += 1
        if self.calls <= self.after:
            return real()
        fault = self.fault
        if isinstance(fault, BaseException):
            raise fault
        if isinstance(fault, type):
            raise fault()
        return fault(real())  # type: ignore[no-any-return]  # the fault stands in for _R


class FaultyDrafter:
    """A :class:`~specstrat.protocols.Drafter` that fails on cue (see the module docstring)."""

    def __init__(self, inner: Drafter[Any], cue: _Cue) -> None:
        self.inner, self.cue = inner, cue

    def admit(self, admission: DraftAdmission[Any]) -> RelayPayload:
        """The wrapped ``admit``, or the fault."""
        return self.cue("admit", lambda: self.inner.admit(admission))

    def release(self, slots: Sequence[int]) -> None:
        """The wrapped ``release``, or the fault."""
        self.cue("release", lambda: self.inner.release(slots))

    def propose(self, step: DraftStep) -> DraftTree:
        """The wrapped ``propose``, or the fault."""
        return self.cue("propose", lambda: self.inner.propose(step))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """The wrapped ``commit``, or the fault."""
        return self.cue("commit", lambda: self.inner.commit(outcome))


@dataclass(frozen=True, slots=True)
class FaultyDrafterFactory:
    """Wraps a drafter factory; ``method`` is ``create_drafter``, ``prefill_payload`` or one
    of the drafter's (``admit``, ``propose``, ``commit``, ``release``)."""

    inner: DrafterFactory[Any]
    method: str
    fault: Fault
    after: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if self.after and self.method in ("create_drafter", "prefill_payload"):
            raise InvalidConfig(
                f"after={self.after} with method={self.method!r}: each call of the factory's own "
                "methods starts a fresh count; use after=0"
            )

    @property
    def needs(self) -> DrafterNeeds:
        """The wrapped factory's needs."""
        return self.inner.needs

    def create_drafter(self, context: DrafterContext) -> FaultyDrafter:
        """The wrapped drafter, failing on cue."""
        cue = _Cue(self.method, self.fault, self.after)
        return FaultyDrafter(cue("create_drafter", lambda: self.inner.create_drafter(context)), cue)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """The wrapped payload, or the fault."""
        cue = _Cue(self.method, self.fault, self.after)
        return cue(
            "prefill_payload", lambda: self.inner.prefill_payload(models, bonus_tokens, hidden)
        )


@dataclass(frozen=True, slots=True)
class FaultyAcceptance:
    """Wraps an acceptance rule; ``accept`` fails on cue.

    Acceptance rules are not created per engine, so the call count lives on this object: it
    counts calls from every engine that uses it (make one per engine for a per-engine cue).
    """

    inner: AcceptanceRule
    fault: Fault
    after: int = field(default=0, kw_only=True)
    _cue: _Cue = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cue", _Cue("accept", self.fault, self.after))

    @property
    def lossless(self) -> bool:
        """The wrapped rule's claim."""
        return self.inner.lossless

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        """The wrapped answer, or the fault."""
        return self._cue("accept", lambda: self.inner.accept(inputs))


class FaultyFutureMap:
    """A :class:`~specstrat.protocols.FutureMap` whose ``method`` fails on cue."""

    def __init__(self, inner: FutureMap, cue: _Cue) -> None:
        self.inner, self.cue = inner, cue

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """The wrapped ``publish``, or the fault."""
        self.cue("publish", lambda: self.inner.publish(slots, new_seq_lens))

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        """The wrapped ``stash``, or the fault."""
        self.cue("stash", lambda: self.inner.stash(slots, payload))

    def resolve(self, slots: torch.Tensor) -> RelayPayload:
        """The wrapped ``resolve``, or the fault."""
        return self.cue("resolve", lambda: self.inner.resolve(slots))


@dataclass(frozen=True, slots=True)
class FaultyFutureMapFactory:
    """Wraps a future-map factory; its maps' ``method`` (publish, stash, resolve) fails on cue."""

    inner: FutureMapFactory
    method: str
    fault: Fault
    after: int = field(default=0, kw_only=True)

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> FaultyFutureMap:
        """The wrapped relay, failing on cue."""
        relay = self.inner.create_future_map(
            max_running_requests, chunked_prefill_size, context_len, device
        )
        return FaultyFutureMap(relay, _Cue(self.method, self.fault, self.after))
