"""The KV runners the engine hands drafters: a draft LM's own request pool and KV cache
(:class:`KVRunner`, a :class:`~specstrat.models.DraftKV`), and one that also runs TARGET_VERIFY on
the draft worker (:class:`BlockKVRunner`, a :class:`~specstrat.models.BlockKV`).

Each runner is a draft pool of the engine's slot table: the draft rows a drafter takes for the
target's slots (``alloc_for``) are recorded in those slots' rows, so the engine frees what a
drafter's ``release`` leaves behind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from specstrat.errors import CapacityError, InvalidConfig
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._slots import SlotTable
from specstrat.runtime._worker import ModelWorker, TreeTokens

__all__ = ["BlockKVRunner", "KVRunner"]


class KVRunner:
    """A :class:`~specstrat.models.DraftKV` over a worker: what a drafter's draft LM runs on;
    its draft rows by slot are recorded in ``table`` (this runner is one of its draft pools)."""

    def __init__(self, worker: ModelWorker, table: SlotTable) -> None:
        self.worker, self._table = worker, table
        self._pool = table.add_draft_pool(self._release)

    def alloc(self, count: int) -> list[int]:
        """``count`` fresh draft rows, all or none, held for no slot."""
        if count > self.worker.requests.available:
            raise CapacityError(
                f"draft request pool has {self.worker.requests.available} free rows, "
                f"{count} needed; raise max_running_requests"
            )
        return [self.worker.alloc_request() for _ in range(count)]

    def free(self, rows: Sequence[int]) -> None:
        """Release draft ``rows`` of this pool from :meth:`alloc` and their KV; a row held for
        a target slot is refused."""
        held = self._table.held_draft_rows(self._pool).intersection(rows)
        if held:
            raise InvalidConfig(
                f"draft rows {sorted(held)} are held for slots (alloc_for); release them with "
                "free_for(slots), which also clears the record"
            )
        self._release(rows)

    def alloc_for(self, slots: Sequence[int]) -> list[int]:
        """A fresh draft row for each of the target's ``slots``, all or none, recorded."""
        return self._table.hold_draft_rows(self._pool, slots, self.alloc)

    def rows_for(self, slots: Sequence[int]) -> list[int]:
        """The draft rows ``slots`` hold, in order."""
        return self._table.draft_rows(self._pool, slots)

    def free_for(self, slots: Sequence[int]) -> None:
        """Release the draft rows of those of ``slots`` that hold one; the record goes too."""
        self._release(self._table.drop_draft_rows(self._pool, slots))

    def _release(self, rows: Sequence[int]) -> None:
        for row in rows:
            self.worker.free_request(row)

    def rewind(self, row: int, new_len: int) -> None:
        """Drop the KV of positions ``new_len..`` of draft ``row``."""
        self.worker.rewind(row, new_len)

    def extend(
        self, rows: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DECODE when every draft row adds one token, DRAFT_EXTEND otherwise."""
        single = all(len(t) == 1 for t in tokens)
        mode = ForwardMode.DECODE if single else ForwardMode.DRAFT_EXTEND
        return self.worker.forward(mode, rows, tokens)

    def extend_tree(
        self,
        rows: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``tokens [bs, k]`` as draft-tree nodes (see :class:`TreeTokens`); a draft
        forward (DECODE or DRAFT_EXTEND), never TARGET_VERIFY, which the algorithm's policy
        may refuse the draft worker."""
        mode = ForwardMode.DECODE if tokens.shape[1] == 1 else ForwardMode.DRAFT_EXTEND
        return self.worker.forward(mode, rows, tokens.tolist(), tree=TreeTokens(positions, mask))

    def cached(self, rows: Sequence[int]) -> list[int]:
        """Positions whose draft KV is written, per draft row."""
        return self.worker.cached(rows)


class _Replayer(Protocol):
    """What :class:`BlockKVRunner` needs of a graph runner (``GraphRunner``, is_draft_worker)."""

    def can_run(self, bs: int) -> bool: ...

    def replay(
        self, rows: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class BlockKVRunner(KVRunner):
    """A :class:`~specstrat.models.BlockKV`: a :class:`KVRunner` whose :meth:`verify` runs
    TARGET_VERIFY of ``tokens_per_req`` tokens per request on this (draft) worker, through the
    draft-worker graph runner's buckets when the batch fits one, eagerly otherwise; each forward
    calls ``on_verify`` (the engine counts them)."""

    def __init__(
        self,
        worker: ModelWorker,
        table: SlotTable,
        tokens_per_req: int,
        *,
        graphs: _Replayer | None,
        on_verify: Callable[[], None],
    ) -> None:
        super().__init__(worker, table)
        self._tokens, self.graphs, self.on_verify = tokens_per_req, graphs, on_verify

    @property
    def tokens_per_req(self) -> int:
        """``T_draft``: tokens per request of each verify forward."""
        return self._tokens

    def verify(
        self, rows: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TARGET_VERIFY (DECODE when ``T = 1``) of ``tokens [bs, T]`` after the draft rows'
        cached tokens."""
        bs, t = tokens.shape
        if t != self._tokens:
            raise InvalidConfig(
                f"tokens have {t} per draft row; this draft worker verifies "
                f"T_draft={self._tokens} tokens per request"
            )
        if self.graphs is not None and self.graphs.can_run(bs):
            out = self.graphs.replay(rows, tokens)
        else:
            mode = ForwardMode.TARGET_VERIFY if t > 1 else ForwardMode.DECODE
            out = self.worker.forward(mode, rows, tokens.tolist())
        self.on_verify()
        return out
