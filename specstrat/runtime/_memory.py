"""The request pool (token ids and KV locations per request) and the KV cache indexed through it.

Row 0 of the request pool and index 0 of the KV cache are padding: padded graph rows point at them
and may read and write them harmlessly; no request ever owns them.
"""

from __future__ import annotations

import torch

from specstrat.errors import CapacityError
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
    sliding window measures distance in positions)."""

    def __init__(
        self, num_tokens: int, shape: ModelShape, dtype: torch.dtype, device: torch.device
    ) -> None:
        dims = (shape.layers, num_tokens + 1, shape.num_kv_heads, shape.head_dim)
        self.k = torch.zeros(dims, dtype=dtype, device=device)
        self.v = torch.zeros(dims, dtype=dtype, device=device)
        self.positions = torch.zeros(num_tokens + 1, dtype=torch.int64, device=device)
        self.capacity = num_tokens
        self._free = list(range(num_tokens, 0, -1))

    @property
    def available(self) -> int:
        """Free KV indices."""
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """``n`` free KV indices, ascending. The free list is kept so that a request running
        alone gets consecutive indices step after step (its keys then read as one slice of the
        pool, with no gather: :class:`~specstrat.runtime._attention.PagedAttention`)."""
        if n > len(self._free):
            raise CapacityError(
                f"KV pool has {len(self._free)} free KV indices, {n} needed; raise "
                "max_total_tokens or lower max_running_requests"
            )
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        taken.reverse()
        return taken

    def free(self, indices: list[int]) -> None:
        """Return KV indices to the pool (the lowest taken first by the next :meth:`alloc`)."""
        self._free.extend(sorted(indices, reverse=True))

    def reset(self) -> None:
        """Every KV index free."""
        self._free = list(range(self.capacity, 0, -1))
