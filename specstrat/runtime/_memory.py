"""The request pool (token ids and KV locations per request) and the KV cache indexed through it.

Row 0 of the request pool and index 0 of the KV cache are padding: padded graph rows point at them
and may read and write them harmlessly; no request ever owns them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specstrat.errors import CapacityError, InvalidConfig
from specstrat.models import ModelShape

__all__ = ["KVPool", "RequestPool"]


class RequestPool:
    """Where each row's tokens sit: ``req_to_token[row, pos]`` (the KV index of that position)
    and ``cached[row]`` (how many positions of the row hold KV: the page table's fill, the nodes
    a forward placed included until the step keeps or drops them).

    It owns no sequence length: committed tokens and their count are the slot table's
    (:mod:`specstrat.runtime._slots`); between steps the target's fill equals them, which the
    step checks. A draft model's pool says only where its draft KV sits.
    """

    def __init__(self, size: int, context_len: int, device: torch.device) -> None:
        self.req_to_token = torch.zeros(size + 1, context_len, dtype=torch.int32, device=device)
        self.cached = [0] * (size + 1)  # host side
        self.size = size
        self._free = list(range(size, 0, -1))

    @property
    def available(self) -> int:
        """Free request slots."""
        return len(self._free)

    def alloc(self) -> int:
        """A free slot in ``1..size``."""
        if not self._free:
            raise CapacityError(
                f"request pool is full ({self.size} slots); raise max_running_requests"
            )
        return self._free.pop()

    def free(self, slot: int) -> None:
        """Return ``slot`` (its KV must be released first)."""
        self.cached[slot] = 0
        self._free.append(slot)

    def reset(self) -> None:
        """Every slot free (after a failed run; the KV pool is reset alongside)."""
        self.cached = [0] * (self.size + 1)
        self._free = list(range(self.size, 0, -1))


class KVPool:
    """Per-layer K and V for ``num_tokens`` KV indices plus padding index 0, with the model's
    key/value heads (``ModelShape.num_kv_heads``), and ``positions``: the absolute position of
    the token each KV index holds (a draft-tree node's is its prefix plus depth, not its column; a
    sliding window measures distance in positions).

    With ``blocks`` (the request pool's size), request slot ``s`` owns the block of
    ``block_size = num_tokens // blocks`` indices from ``1 + (s - 1) * block_size``: its KV is
    taken from there first, lowest free index first, so a request's keys run consecutively and
    requests in neighbouring slots sit a fixed stride apart (attention on the CPU then reads a
    batch's keys as one strided view of the pool, with no gather:
    :class:`~specstrat.runtime._attention.PagedAttention`). A request that outgrows its block
    borrows the indices past the last block, then the highest free indices of the block with
    most free; nothing is refused while any index is free.
    """

    def __init__(
        self,
        num_tokens: int,
        shape: ModelShape,
        dtype: torch.dtype,
        device: torch.device,
        blocks: int = 0,
    ) -> None:
        dims = (shape.layers, num_tokens + 1, shape.num_kv_heads, shape.head_dim)
        self.k = torch.zeros(dims, dtype=dtype, device=device)
        self.v = torch.zeros(dims, dtype=dtype, device=device)
        self.positions = torch.zeros(num_tokens + 1, dtype=torch.int64, device=device)
        self.capacity = num_tokens
        #: Indices per request slot's block (0: no blocks, one free list).
        self.block_size = num_tokens // blocks if blocks > 0 else 0
        self.blocks = blocks if self.block_size else 0
        self.reset()

    @property
    def available(self) -> int:
        """Free KV indices."""
        return self._available

    def alloc(self, n: int, owner: int = 0) -> list[int]:
        """``n`` free KV indices: request slot ``owner``'s block first, ascending, then borrowed
        ones (a pool without blocks: the lowest free indices). The free lists are kept so that a
        request gets consecutive indices step after step."""
        return self.alloc_many([owner], [n])

    def alloc_many(self, owners: Sequence[int], counts: Sequence[int]) -> list[int]:
        """:meth:`alloc` for each ``(owner, count)`` in turn, all or none, concatenated."""
        if len(owners) != len(counts) or any(n < 0 for n in counts):
            raise InvalidConfig(
                f"alloc_many(owners={list(owners)}, counts={list(counts)}): pass one count >= 0 "
                "per owner"
            )
        need = sum(counts)
        if need > self._available:
            raise CapacityError(
                f"KV pool has {self._available} free KV indices, {need} needed; raise "
                "max_total_tokens or lower max_running_requests"
            )
        return [i for owner, n in zip(owners, counts, strict=True) for i in self._take(n, owner)]

    def free(self, indices: list[int]) -> None:
        """Return KV indices to the pool (each to its block; the lowest taken first by the next
        :meth:`alloc` from that block)."""
        if indices and not 1 <= min(indices) <= max(indices) <= self.capacity:
            bad = next(i for i in indices if not 1 <= i <= self.capacity)
            raise InvalidConfig(
                f"KV index {bad} is not in 1..{self.capacity}; free only indices alloc returned"
            )
        size, lists = self.block_size, self._free
        for index in sorted(indices, reverse=True):
            block = min((index - 1) // size, self.blocks) if size else 0
            free = lists[block]
            if free and free[-1] < index:
                self._unsorted.add(block)
            free.append(index)
        self._available += len(indices)

    def reset(self) -> None:
        """Every KV index free."""
        size, n = self.block_size, self.blocks
        self._free = [list(range((b + 1) * size, b * size, -1)) for b in range(n)]
        self._free.append(list(range(self.capacity, n * size, -1)))  # past the last block
        self._unsorted: set[int] = set()
        self._available = self.capacity

    def _take(self, n: int, owner: int) -> list[int]:
        """``n`` indices (checked free): the owner's block lowest first, then the rest."""
        own = owner - 1 if 0 < owner <= self.blocks else None
        taken = [] if own is None else self._lowest(own, n)
        if len(taken) < n:
            taken += self._lowest(self.blocks, n - len(taken))
        if len(taken) < n:  # borrow the highest indices, away from where their owners grow
            fullest = sorted(range(self.blocks), key=lambda b: -len(self._free[b]))
            for block in (b for b in fullest if b != own):
                free = self._sorted(block)
                k = min(n - len(taken), len(free))
                taken += free[:k]
                del free[:k]
                if len(taken) == n:
                    break
        self._available -= n
        return taken

    def _lowest(self, block: int, n: int) -> list[int]:
        """Up to ``n`` of ``block``'s lowest free indices, ascending, taken."""
        free = self._sorted(block)
        k = min(n, len(free))
        taken = free[len(free) - k :]
        del free[len(free) - k :]
        taken.reverse()
        return taken

    def _sorted(self, block: int) -> list[int]:
        """Block ``block``'s free list, descending (sorted again after an out-of-order free)."""
        free = self._free[block]
        if block in self._unsorted:
            free.sort(reverse=True)
            self._unsorted.discard(block)
        return free
