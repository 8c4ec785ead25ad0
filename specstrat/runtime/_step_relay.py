"""The step's relay collaborator: what each step writes into the algorithm's FutureMap, with
who wrote it, and what the next step resolves, checked against the slot table (the relay's
``seq_lens`` mirror its lengths).

The engine publishes the slot table's sequence lengths and stashes each step's bonus tokens itself;
the drafter's ``admit``/``commit`` payloads and the disagg builder's writes ride along. Every
value that comes back wrong, or that the relay refuses, is blamed on the hook that wrote it
(:class:`~specstrat.runtime._relay_writers.RelayWriters`); only a field the engine wrote is
blamed on the relay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ParamSpec, TypeVar

import torch

from specstrat.contracts import hook_error
from specstrat.errors import RelayError
from specstrat.protocols import FutureMap
from specstrat.relay import RELAY_FIELDS, RelayField, RelayPayload
from specstrat.runtime._answers import frozen_payload
from specstrat.runtime._guard import call_hook
from specstrat.runtime._relay_writers import RelayWriters

__all__ = ["BUILDER", "StepRelay"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The disagg builder's hook, which publishes and stashes a PREBUILT batch's entries itself.
BUILDER = "disagg.build_disagg_draft_input"
_RESOLVE = "future_map.resolve"

# What each writer should have relayed, for the fix in a message that blames it.
_FIX = {
    BUILDER: "the builder must publish batch.seq_lens and stash last_tokens as bonus_tokens "
    "(plus its draft state) at batch.slots in the future_map it is given",
    "drafter.commit": "relay only the draft state the next propose reads; the engine relays "
    "bonus tokens and sequence lengths itself",
    "drafter.admit": "relay only the draft state the first propose reads; the engine relays "
    "bonus tokens and sequence lengths itself",
}


class StepRelay:
    """Writes and resolves one engine's relay entries, remembering each field's writer."""

    def __init__(self, algorithm: str, relay: FutureMap, device: torch.device) -> None:
        self.algorithm, self.relay, self.device = algorithm, relay, device
        self.writers = RelayWriters()
        self._slots: tuple[int, ...] = ()  # the last slots indexed, and their index tensor
        self._index_tensor = torch.zeros(0, dtype=torch.int64, device=device)

    def _hook(self, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return call_hook(self.algorithm, hook, fn, *args, **kwargs)

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        """The slots as an index tensor; a step resolves and writes the same slots, so the last
        one is kept (a copy each time: a relay may not write into what the engine reuses)."""
        key = tuple(slots)
        if key != self._slots:
            self._slots = key
            self._index_tensor = torch.tensor(key, dtype=torch.int64, device=self.device)
        return self._index_tensor.clone()

    # -- writes -------------------------------------------------------------------------------

    def write(
        self,
        slots: Sequence[int],
        lengths: Sequence[int],
        bonus: torch.Tensor,
        payload: RelayPayload,
        writer: str,
    ) -> None:
        """Publish the slot table's ``lengths``, then stash ``writer``'s ``payload`` with the
        engine's ``bonus`` tokens (which replace any the payload carries)."""
        index = self._index(slots)
        published = torch.tensor(lengths, dtype=torch.int64, device=self.device)
        self._hook("future_map.publish", self.relay.publish, index, published)
        self.writers.wrote(None, slots, ["seq_lens"])
        sources: dict[RelayField, str] = {
            name: writer for name in payload.present() if name != "bonus_tokens"
        }
        self._stash(index, slots, payload.merged(RelayPayload(bonus_tokens=bonus)), sources)

    def stash(self, slots: Sequence[int], payload: RelayPayload, writer: str) -> None:
        """Stash ``writer``'s ``payload`` alone (a PREBUILT admission's extra fields)."""
        self._stash(self._index(slots), slots, payload, dict.fromkeys(payload.present(), writer))

    def _stash(
        self,
        index: torch.Tensor,
        slots: Sequence[int],
        payload: RelayPayload,
        sources: Mapping[RelayField, str],
    ) -> None:
        try:
            self._hook("future_map.stash", self.relay.stash, index, payload)
        except RelayError as exc:
            writer = sources.get(exc.field) if exc.field in RELAY_FIELDS else None
            if writer is None:  # the engine's own field, or the slots: the relay's fault
                raise
            cause = exc.__cause__ or exc
            fix = _FIX.get(writer, "keep one width per field")
            problem = f"relayed {exc.field} that future_map.stash refused ({cause}); {fix}"
            raise self._writer_error(exc, writer, problem) from cause
        for name in payload.present():
            self.writers.wrote(sources.get(name), slots, (name,))

    def _writer_error(self, exc: RelayError, writer: str, problem: str) -> RelayError:
        """The relay's refusal ``exc`` blamed on ``writer``, the hook that wrote the value."""
        return RelayError(
            f"{self.algorithm}.{writer}: {problem}",
            field=exc.field,
            writer=writer,
            algorithm=self.algorithm,
        )

    def built(self, slots: Sequence[int]) -> None:
        """The disagg builder wrote the entries of ``slots`` (it publishes and stashes)."""
        self.writers.wrote(BUILDER, slots, RELAY_FIELDS)

    # -- reads --------------------------------------------------------------------------------

    def resolve(self, slots: list[int], lengths: list[int], bonus: list[int]) -> RelayPayload:
        """What the running ``slots`` read, checked: the pool's ``lengths`` and the ``bonus``
        tokens the engine keeps for them; a wrong value names the hook that wrote it."""
        try:
            answer = self._hook(_RESOLVE, self.relay.resolve, self._index(slots))
        except RelayError as exc:  # a ring refusing slots the builder never stashed
            if self.writers.writer(slots, "bonus_tokens") != BUILDER:
                raise
            problem = (
                f"the relay holds nothing usable for slots {slots} ({exc.__cause__ or exc}); "
                f"{_FIX[BUILDER]}"
            )
            raise self._writer_error(exc, BUILDER, problem) from exc
        payload = frozen_payload(self.algorithm, _RESOLVE, answer, len(slots))
        if payload.bonus_tokens is None:
            relay_broke = (
                f"returned no bonus_tokens for the running requests (slots {slots}); "
                "the relay must keep the last stash of each slot"
            )
            writer_broke = f"relayed no bonus_tokens for slots {slots}"
            self._blame(slots, "bonus_tokens", relay_broke, writer_broke)
        if payload.seq_lens is not None and (got := payload.seq_lens.tolist()) != lengths:
            bad = [s for s, g, want in zip(slots, got, lengths, strict=True) if g != want]
            relay_broke = (
                f"returned seq_lens={got} but the slot table holds {lengths} for slots "
                f"{slots}: a stale or aliased relay entry"
            )
            writer_broke = (
                f"relayed seq_lens={got} for slots {slots}, but the slot table holds {lengths}"
            )
            self._blame(bad, "seq_lens", relay_broke, writer_broke)
        assert payload.bonus_tokens is not None  # _blame raised otherwise
        resolved = payload.bonus_tokens.tolist()
        if resolved == bonus:
            return payload
        for slot, got, token in zip(slots, resolved, bonus, strict=True):
            if got != token:
                self._blame_bonus(slot, got, token)
        return payload

    def _blame_bonus(self, slot: int, got: int, token: int) -> None:
        """Raise for ``slot`` resolving bonus token ``got`` where ``token`` was stashed."""
        relay_broke = (
            f"returned bonus token {got} for slot {slot}, but {token} was stashed there: "
            "a stale or aliased relay entry"
        )
        writer_broke = (
            f"slot {slot} resolved bonus token {got} but the batch's bonus token is {token}"
        )
        self._blame([slot], "bonus_tokens", relay_broke, writer_broke)

    def _blame(
        self, slots: list[int], field: RelayField, relay_broke: str, writer_broke: str
    ) -> None:
        """Raise for a wrong ``field`` at ``slots``: ``writer_broke`` naming the hook that last
        wrote it there, or ``relay_broke`` naming the relay where the engine wrote it."""
        writer = self.writers.writer(slots, field)
        if writer is None:
            raise hook_error(self.algorithm, _RESOLVE, relay_broke)
        raise hook_error(self.algorithm, writer, f"{writer_broke}; {_FIX.get(writer, '')}")

    def release(self, slots: Sequence[int]) -> None:
        """Finished requests: resolved one last time (a relay may free entries once read)."""
        self._hook(_RESOLVE, self.relay.resolve, self._index(slots))
        self.writers.forget(slots)
