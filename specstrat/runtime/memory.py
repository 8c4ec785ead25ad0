"""The request pool (a token table per request) and the KV cache indexed through it.

Row 0 of the request pool and slot 0 of the KV cache are padding: padded graph rows point at them
and may read and write them harmlessly; no request ever owns them.
"""

from __future__ import annotations

import torch

from specstrat.errors import InvalidConfig
from specstrat.runtime.model import ModelConfig

__all__ = ["KVPool", "RequestPool"]


class RequestPool:
    """``req_to_token[slot, position]`` is the KV slot holding that request's position."""

    def __init__(self, size: int, context_len: int, device: torch.device) -> None:
        self.req_to_token = torch.zeros(size + 1, context_len, dtype=torch.int32, device=device)
        self.lens = [0] * (size + 1)  # KV length per slot, host side
        self._free = list(range(size, 0, -1))

    @property
    def available(self) -> int:
        """Free request slots."""
        return len(self._free)

    def alloc(self) -> int:
        """A free slot in ``1..size``."""
        if not self._free:
            raise InvalidConfig(
                f"request pool is full ({len(self.lens) - 1} slots); raise max_running_requests"
            )
        return self._free.pop()

    def free(self, slot: int) -> None:
        """Return ``slot`` (its KV must be released first)."""
        self.lens[slot] = 0
        self._free.append(slot)


class KVPool:
    """Per-layer K and V for ``num_tokens`` token slots plus padding slot 0."""

    def __init__(
        self, num_tokens: int, cfg: ModelConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (cfg.layers, num_tokens + 1, cfg.heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._free = list(range(num_tokens, 0, -1))
        self.capacity = num_tokens

    @property
    def available(self) -> int:
        """Free token slots."""
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """``n`` free token slots."""
        if n > len(self._free):
            raise InvalidConfig(
                f"KV pool has {len(self._free)} free token slots, {n} needed; raise "
                "max_total_tokens or lower max_running_requests"
            )
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        return taken

    def free(self, slots: list[int]) -> None:
        """Return token slots to the pool."""
        self._free.extend(slots)
