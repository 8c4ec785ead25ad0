"""The slot table: the one owner of what the engine knows about each request slot.

Per slot (a row of the target's request pool): the request and its sampling parameters, where
it came from (a local prefill or a PREBUILT batch), the KV positions it reserved, its
**committed tokens** (those in the target's KV: the prompt, then every token a step kept), its
**bonus token** (the next input, not yet in the KV), and what the caller gets back (the output,
budget and stop tokens applied), and the **draft rows** it holds: per draft pool (each KV runner
the engine made for a drafter, :meth:`SlotTable.add_draft_pool`), the row of that pool that holds
the request's draft KV. The scheduler admits and releases through it, the step reads and commits
through it, drafters read committed tokens from it (``DrafterContext.target_tokens``) and hold
draft rows through their runner's slot-aware calls (``alloc_for``/``rows_for``/``free_for``),
which record them here. So the engine knows every draft row a slot holds: at release it frees
what the drafter's ``release`` left, and a failed run's reset (every pool reset with the table)
leaves every draft pool free. Drafts never enter it: a step's drafts live in the step until
commit appends the accepted ones.

Admission runs on the scheduler thread and the steps on the forward thread; a row is created
before its slot reaches any step and read by the scheduler only through fields the forward
thread does not write (``output``, ``finished``, ``released``); draft rows are held and freed on
the forward thread (a drafter's ``admit`` and ``release``, the step's release).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specstrat._ints import is_int
from specstrat.drafting import SamplingParams
from specstrat.errors import InternalError, InvalidConfig
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
    #: draft pool (its :meth:`SlotTable.add_draft_pool` key) -> the draft row held in it
    draft_rows: dict[int, int] = field(default_factory=dict)

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
        self._draft_pools: list[Callable[[list[int]], None]] = []

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
        """Forget every request and the draft rows it held (after a failed run; the engine
        resets every pool, draft pools included, so nothing is freed one by one)."""
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

    def start(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], bonus: list[int]
    ) -> None:
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

    # -- draft rows (the forward thread) --------------------------------------------------------

    def add_draft_pool(self, free: Callable[[list[int]], None]) -> int:
        """A drafter's own request pool joins the table; its key in :attr:`SlotRow.draft_rows`.
        ``free(rows)`` releases draft rows of it (for :meth:`free_draft_rows`)."""
        self._draft_pools.append(free)
        return len(self._draft_pools) - 1

    def hold_draft_rows(
        self, pool: int, slots: Sequence[int], alloc: Callable[[int], list[int]]
    ) -> list[int]:
        """A fresh draft row of ``pool`` for each of ``slots``, from ``alloc(len(slots))``,
        recorded in the slots' rows: all or none. A free slot, a repeated one, or one that holds
        a row of ``pool`` already is refused before anything is allocated."""
        found = [self._live(s) for s in slots]
        for slot, row in zip(slots, found, strict=True):
            if row is None:
                raise InvalidConfig(
                    f"slot {slot} holds no request; alloc_for takes the target's slots of the "
                    "requests being admitted (DraftAdmission.slots)"
                )
            if pool in row.draft_rows:
                raise InvalidConfig(
                    f"slot {slot} already holds draft row {row.draft_rows[pool]} of this runner; "
                    f"read it with rows_for([{slot}]), or free_for([{slot}]) first"
                )
        if len(set(slots)) != len(slots):
            raise InvalidConfig(f"slots={list(slots)} repeat a slot; one draft row per slot")
        fresh = alloc(len(slots))
        for row, draft in zip(found, fresh, strict=True):
            row.draft_rows[pool] = draft  # type: ignore[union-attr]  # None was refused above
        return fresh

    def draft_rows(self, pool: int, slots: Sequence[int]) -> list[int]:
        """The draft rows of ``pool`` that ``slots`` hold, in order. Every step asks, so the
        lookup is one comprehension and a slot holding none is diagnosed only when it fails."""
        table = self._rows
        try:
            return [table[s].draft_rows[pool] for s in slots]  # type: ignore[union-attr]
        except (AttributeError, IndexError, KeyError, TypeError):  # a free slot, a non-slot, none
            missing = [s for s in slots if pool not in self._held(s)] or list(slots)
            raise InvalidConfig(
                f"slot {missing[0]} holds no draft row of this runner (slots={list(slots)}); "
                "allocate one per request with alloc_for(admission.slots) in the drafter's "
                "admit, and ask only for admitted, unreleased slots"
            ) from None

    def drop_draft_rows(self, pool: int, slots: Sequence[int]) -> list[int]:
        """The draft rows of ``pool`` that ``slots`` hold (those holding none are skipped), no
        longer recorded: the caller frees them."""
        return [held.pop(pool) for s in slots if pool in (held := self._held(s))]

    def held_draft_rows(self, pool: int) -> set[int]:
        """Every draft row of ``pool`` that some slot holds."""
        return {row.draft_rows[pool] for row in self._rows if row and pool in row.draft_rows}

    def free_draft_rows(self, slots: Sequence[int]) -> None:
        """Free every draft row ``slots`` still hold, in every pool, and forget them: the
        engine's backstop at release, after the drafter's own ``release``."""
        left: dict[int, list[int]] = {}
        for slot in slots:
            held = self._held(slot)
            for pool, draft in held.items():
                left.setdefault(pool, []).append(draft)
            held.clear()
        for pool, drafts in left.items():
            self._draft_pools[pool](drafts)

    def _live(self, slot: int) -> SlotRow | None:
        """The row in ``slot``; ``None`` for a free slot or a value that is not a slot."""
        ok = is_int(slot) and 0 < slot < len(self._rows)
        return self._rows[slot] if ok else None

    def _held(self, slot: int) -> dict[int, int]:
        """The draft rows ``slot`` holds, by pool (a fresh empty dict for a free slot)."""
        row = self._live(slot)
        return row.draft_rows if row is not None else {}
