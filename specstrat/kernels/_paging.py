"""Where a batch's tokens sit in the KV pool: the one paging value every metadata builder takes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int, index_tensor
from specstrat.kernels._triton import cdiv

__all__ = ["Paging"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Paging:
    """The page-table inputs of one metadata build: which pool rows the batch reads, the pool's
    request-to-token table, and its page size.

    ``req_pool_indices [bs]`` (int32/int64): request ``i`` of the batch is row
    ``req_pool_indices[i]`` of ``req_to_token``. ``req_to_token [pool, ctx]`` (int32/int64):
    ``req_to_token[r, j]`` is the KV index of token ``j`` of pool row ``r``. ``page_size``
    (int >= 1): tokens per KV page; page ``p`` of a row is ``req_to_token[r, p * page_size] //
    page_size``. With a ``Paging`` a builder writes ``page_table``; without one (``paging=None``)
    it writes none.

    The fields are keyword-only because the two tensors have the same dtypes and are easily
    swapped. What needs no batch is checked here, eagerly: ranks, dtypes, contiguity, one device
    for both tensors, a non-empty ``req_to_token`` and ``page_size >= 1``, each an
    :class:`~specstrat.errors.InvalidConfig` naming the value. A builder then checks the paging
    against its batch: one row of ``req_pool_indices`` per request and the device of
    ``seq_lens``; and, where it reads values (see :mod:`specstrat.kernels.verify_metadata`),
    pool indices in range and every row's tokens inside ``req_to_token``.

    The host mirror ``seq_lens_cpu`` is not part of this value: it mirrors ``seq_lens``, not the
    page table, and callers without a page table pass one too, so it stays a keyword of the
    builders beside the lengths it copies.
    """

    req_pool_indices: torch.Tensor
    req_to_token: torch.Tensor
    page_size: int = 1

    def __post_init__(self) -> None:
        host_int("page_size", self.page_size, minimum=1)
        rtt = index_tensor("req_to_token", self.req_to_token, ndim=2)
        if rtt.shape[0] == 0 or rtt.shape[1] == 0:
            raise InvalidConfig(
                f"req_to_token.shape={tuple(rtt.shape)} is empty; size it [pool, ctx]"
            )
        index_tensor("req_pool_indices", self.req_pool_indices, ndim=1, device=rtt.device)

    @property
    def max_pages(self) -> int:
        """Pages a row of ``req_to_token`` spans, ``ceil(ctx / page_size)``: the page table's
        width in the allocating builders, and enough for static buffers."""
        return cdiv(self.req_to_token.shape[1], self.page_size)
