"""The setup every TARGET_VERIFY metadata builder shares, written once.

A builder checks what is its own (its tokens-per-request argument, per-request counts, tree parents,
the type of its buffers) and hands the rest to :func:`check_batch`: ``seq_lens``, the
:class:`~specstrat.kernels.Paging` against them and, for the in-place forms, whether the batch fits
the buffers. The :class:`Batch` it returns carries those through the value checks, the host bound
from the mirror, the allocation and the returned :class:`VerifyMetadata`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import index_tensor, reads_values
from specstrat.kernels._paging import Paging
from specstrat.kernels._verify_buffers import VerifyMetadata, VerifyMetadataBuffers
from specstrat.kernels._verify_checks import check_total, check_values, max_k_bound

__all__ = ["Batch", "check_batch"]


@dataclass(frozen=True, slots=True)
class Batch:
    """One build's checked shared inputs: the lengths, the paging (``None``: no page table),
    the rows written (``padded_bs``: the buffers' rows in place, ``bs`` otherwise) and the width
    of the page table written (``None`` without one)."""

    seq_lens: torch.Tensor
    paging: Paging | None
    padded_bs: int
    page_cols: int | None
    in_place: bool

    @property
    def bs(self) -> int:
        """Real requests."""
        return self.seq_lens.shape[0]

    @property
    def page_size(self) -> int:
        """The paging's page size; 1 without paging (every token its own page)."""
        return self.paging.page_size if self.paging is not None else 1

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The device inputs: ``seq_lens`` and the paging's tensors."""
        if self.paging is None:
            return (self.seq_lens,)
        return self.seq_lens, self.paging.req_pool_indices, self.paging.req_to_token

    def reads_values(self, validate: bool, *tensors: torch.Tensor) -> bool:
        """Whether the value checks may read these inputs and ``tensors`` (see
        :func:`~specstrat.kernels._checks.reads_values`)."""
        return reads_values(validate, *self.tensors, *tensors)

    def check_query_total(self, tokens_per_req: int) -> None:
        """``T`` tokens in every row written, padding included, fit the int32 ``cu_seqlens_q``."""
        what = "query tokens of the padded batch" if self.in_place else "query tokens of the batch"
        check_total("cu_seqlens_q", self.padded_bs * tokens_per_req, what)

    def check_values(self, tokens: int | torch.Tensor, padded_tokens: int | None = None) -> None:
        """The value checks of :func:`~specstrat.kernels._verify_checks.check_values`."""
        check_values(
            self.seq_lens,
            tokens,
            padded_bs=self.padded_bs,
            paging=self.paging,
            page_cols=self.page_cols,
            padded_tokens=padded_tokens,
        )

    def max_seq_len_k(
        self, seq_lens_cpu: Sequence[int] | torch.Tensor | None, tokens_per_req: int, *, read: bool
    ) -> int | None:
        """The host bound from the mirror (checked against ``seq_lens`` when ``read``)."""
        twin = self.seq_lens if read else None
        return max_k_bound(seq_lens_cpu, twin, self.bs, tokens_per_req)

    def allocate(self) -> VerifyMetadataBuffers:
        """Output buffers for the allocating forms (the kernel and twin write every element)."""
        return VerifyMetadataBuffers.uninitialized(self.bs, self.page_cols, self.seq_lens.device)

    def metadata(
        self,
        buffers: VerifyMetadataBuffers,
        tokens_per_req: int | None,
        max_seq_len_q: int | None,
        max_seq_len_k: int | None,
    ) -> VerifyMetadata:
        """The metadata of this batch, written into ``buffers``."""
        return VerifyMetadata(
            buffers, self.bs, self.page_size, tokens_per_req, max_seq_len_q, max_seq_len_k
        )


def _batch_paging(paging: object, bs: int, device: torch.device) -> Paging | None:
    """``paging`` checked against the batch: one pool row per request, on the batch's device."""
    if paging is None:
        return None
    if not isinstance(paging, Paging):
        raise InvalidConfig(
            f"paging={type(paging).__name__}; pass "
            "Paging(req_pool_indices=..., req_to_token=..., page_size=...) or None"
        )
    if paging.req_to_token.device != device:
        raise InvalidConfig(
            f"paging.req_to_token.device={paging.req_to_token.device} differs from "
            f"seq_lens.device={device}; put every input on one device"
        )
    rows = paging.req_pool_indices.shape[0]
    if rows != bs:
        raise InvalidConfig(
            f"paging.req_pool_indices has {rows} rows; expected {bs} (one per request)"
        )
    return paging


def check_batch(
    seq_lens: object,
    paging: object,
    buffers: VerifyMetadataBuffers | None = None,
    *,
    table: str = "buffers.page_table",
) -> Batch:
    """``seq_lens`` and ``paging`` checked, and for an in-place build (``buffers`` given) the
    batch's fit: at most ``buffers.padded_bs`` rows, on the buffers' device, and a page table
    (named ``table`` in the errors) exactly when ``paging`` is given."""
    device = buffers.cache_seqlens.device if buffers is not None else None
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1, device=device)
    bs = seq_lens.shape[0]
    checked = _batch_paging(paging, bs, seq_lens.device)
    if buffers is None:
        page_cols = checked.max_pages if checked is not None else None
        return Batch(seq_lens, checked, bs, page_cols, in_place=False)
    if bs > buffers.padded_bs:
        raise InvalidConfig(
            f"bs={bs} exceeds the buffers' padded_bs={buffers.padded_bs}; "
            "pick the smallest captured bucket with padded_bs >= bs"
        )
    page_table = buffers.page_table
    if (checked is None) != (page_table is None):
        have = "None but paging was given" if checked is not None else "set but paging=None"
        raise InvalidConfig(
            f"{table} is {have}; allocate the buffers with max_pages exactly when a page table "
            "is built"
        )
    page_cols = page_table.shape[1] if page_table is not None else None
    return Batch(seq_lens, checked, buffers.padded_bs, page_cols, in_place=True)
