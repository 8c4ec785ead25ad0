"""The slot table: the one owner of what the engine knows about each request slot.

Per slot (a row of the target's request pool): the request and its sampling parameters, where
it came from (a local prefill or a PREBUILT batch), the KV positions it reserved, its
**committed tokens** (those in the target's KV: the prompt, then every token a step kept), its
**bonus token** (the next input, not yet in the KV), and what the caller gets back (the output,
budget and stop tokens applied). The scheduler admits and releases through it, the step reads
and commits through it, drafters read committed tokens from it (``DrafterContext.target_tokens``).
Drafts never enter it: a step's drafts live in the step until commit appends the accepted ones.

Admission runs on the scheduler thread and the steps on the forward thread; a row is created
before its slot reaches any step and read by the scheduler only through fields the forward
thread does not write (``output``, ``finished``, ``released``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from specstrat.drafting import SamplingParams
from specstrat.errors import InternalError
from specstrat.runtime._memory import RequestPool
from specstrat.runtime._requests import Request

__all__ = ["Origin", "SlotRow", "SlotTable"]

#: Where a request's first token came from.
Origin = Literal["prefill", "prebuilt"]


@dataclass(frozen=False, slots=True, eq=False)
class SlotRow:
    """One request slot's state (see the module docstring); rows compare by identity."""

    request: Request
    slot: int
    origin: Origin
    reserved: int
    committed: list[int] = field(default_factory=list)
    bonus: int = -1
    output: list[int] = field(default_factory=list)
    finished: bool = False
    released: bool = False

    @property
    def sampling(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.sampling


class SlotTable:
    """Every live request's :class:`SlotRow`, by slot and by request id; the KV reserved in
    total; slot allocation from the target's request pool."""

    def __init__(self, pool: RequestPool, kv_capacity: int) -> None:
        self._pool, self.kv_capacity = pool, kv_capacity
        self._rows: list[SlotRow | None] = [None] * (pool.size + 1)
        self.by_rid: dict[str, SlotRow] = {}
        self.reserved = 0

    # -- the scheduler thread -------------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        """Request slots free for admission."""
        return self._pool.available

    def fits(self, need: int) -> bool:
        """Whether ``need`` more KV positions can be reserved."""
        return self.reserved + need <= self.kv_capacity

    def admit(self, request: Request, need: int, origin: Origin) -> int:
        """A slot for ``request`` with ``need`` KV positions reserved."""
        slot = self._pool.alloc()
        row = SlotRow(request, slot, origin, need)
        self._rows[slot] = row
        self.by_rid[request.rid] = row
        self.reserved += need
        return slot

    def unreserve(self, slots: Sequence[int]) -> None:
        """Finished requests about to be released: their KV reservation returns."""
        for slot in slots:
            row = self.row(slot)
            if row.finished and not row.released:
                row.released = True
                self.reserved -= row.reserved

    def running(self) -> list[int]:
        """Slots of the requests that have not finished, in admission order."""
        return [row.slot for row in self.by_rid.values() if not row.finished]

    def live_row(self, slot: int) -> SlotRow | None:
        """The row now in ``slot`` (``None`` once released)."""
        return self._rows[slot]

    def live_rows(self, slots: Sequence[int]) -> list[SlotRow | None]:
        """:meth:`live_row` of each of ``slots``, in order."""
        table = self._rows
        return [table[s] for s in slots]

    def take_outputs(self, rids: Sequence[str]) -> dict[str, list[int]]:
        """The outputs of finished requests ``rids``, forgotten here."""
        return {rid: self.by_rid.pop(rid).output for rid in rids}

    def reset(self) -> None:
        """Forget every request (after a failed run; the engine resets the pools)."""
        self._rows = [None] * len(self._rows)
        self.by_rid.clear()
        self.reserved = 0

    # -- the forward thread ---------------------------------------------------------------------

    def row(self, slot: int) -> SlotRow:
        """The live row of ``slot``."""
        row = self._rows[slot]
        if row is None:
            raise InternalError(f"slot {slot} holds no request; this is a bug in specstrat")
        return row

    def rows(self, slots: Sequence[int]) -> list[SlotRow]:
        """The rows of ``slots``, in order."""
        table = self._rows
        found = [table[s] for s in slots]
        if None in found:
            raise InternalError(f"slots {list(slots)} include a free one; a bug in specstrat")
        return found  # type: ignore[return-value]  # None was refused above

    def tokens(self, slot: int) -> Sequence[int]:
        """The committed tokens of ``slot`` (those in the target's KV), in order."""
        return self.row(slot).committed

    def lengths(self, slots: Sequence[int]) -> list[int]:
        """Committed tokens per slot: the target's sequence lengths between steps."""
        return [len(row.committed) for row in self.rows(slots)]

    def start(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], bonus: list[int]) -> None:
        """Prefilled or PREBUILT requests: the prompts are committed, ``bonus`` comes next."""
        for row, prompt, token in zip(self.rows(slots), prompts, bonus, strict=True):
            row.committed = list(prompt)
            row.bonus = token

    def commit(
        self, rows: Sequence[SlotRow], kept: Sequence[Sequence[int]], bonus: Sequence[int]
    ) -> None:
        """After a verify step: each row's old bonus token and its accepted drafts ``kept``
        entered the KV; ``bonus`` is each row's next input."""
        for row, tokens, token in zip(rows, kept, bonus, strict=True):
            committed = row.committed
            committed.append(row.bonus)
            committed.extend(tokens)
            row.bonus = token

    def forget(self, slots: Sequence[int]) -> None:
        """Released slots: their rows leave the slot index (the scheduler still holds each by
        request id until it takes the output)."""
        for slot in slots:
            self._rows[slot] = None
