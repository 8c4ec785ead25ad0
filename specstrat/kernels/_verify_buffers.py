"""The TARGET_VERIFY metadata types: the int32 buffers attention reads and the host-side facts.

See :mod:`specstrat.kernels.verify_metadata` for what each buffer holds and how padding rows of
the graph form are filled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import torch

from specstrat.kernels._checks import host_int, static_buffer

__all__ = ["PAD_PAGE", "PAD_SEQ_LEN", "VerifyMetadata", "VerifyMetadataBuffers"]

#: Sequence length that padding rows of the graph form stand for.
PAD_SEQ_LEN: Final = 0
#: Page id written for pages a row does not use, and for every page of a padding row.
PAD_PAGE: Final = 0


@dataclass(frozen=True, slots=True)
class VerifyMetadataBuffers:
    """The int32 tensors TARGET_VERIFY attention reads; static buffers in the graph form."""

    cu_seqlens_q: torch.Tensor
    cache_seqlens: torch.Tensor
    cu_seqlens_k: torch.Tensor
    page_table: torch.Tensor | None = None

    def __post_init__(self) -> None:
        padded_bs = self.cache_seqlens.shape[0] if self.cache_seqlens.dim() == 1 else -1
        device = self.cache_seqlens.device
        static_buffer("cache_seqlens", self.cache_seqlens, shape=(padded_bs,), device=device)
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            static_buffer(name, getattr(self, name), shape=(padded_bs + 1,), device=device)
        if self.page_table is not None:
            width = self.page_table.shape[-1] if self.page_table.dim() == 2 else -1
            static_buffer("page_table", self.page_table, shape=(padded_bs, width), device=device)

    @classmethod
    def allocate(
        cls, padded_bs: int, *, max_pages: int | None = None, device: torch.device | str = "cpu"
    ) -> VerifyMetadataBuffers:
        """Zeroed buffers for ``padded_bs`` rows (and ``max_pages`` pages per row, if given)."""
        padded_bs = host_int("padded_bs", padded_bs, minimum=0)
        dev = torch.device(device)

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int32, device=dev)

        pages = None
        if max_pages is not None:
            pages = zeros(padded_bs, host_int("max_pages", max_pages, minimum=1))
        return cls(zeros(padded_bs + 1), zeros(padded_bs), zeros(padded_bs + 1), pages)

    @classmethod
    def uninitialized(
        cls, padded_bs: int, max_pages: int | None, device: torch.device
    ) -> VerifyMetadataBuffers:
        """Buffers without the zero fill: for the allocating launchers, whose kernel and twin
        write every element (so the fill's launches would be wasted)."""

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.int32, device=device)

        pages = empty(padded_bs, max_pages) if max_pages is not None else None
        return cls(empty(padded_bs + 1), empty(padded_bs), empty(padded_bs + 1), pages)

    @property
    def padded_bs(self) -> int:
        """Rows the buffers hold (the captured batch bucket)."""
        return self.cache_seqlens.shape[0]


@dataclass(frozen=True, slots=True)
class VerifyMetadata:
    """TARGET_VERIFY metadata: the buffers plus the host-side facts attention needs.

    ``bs`` real rows come first; rows ``bs..padded_bs`` are padding (graph and ragged graph
    forms). ``max_seq_len_q`` is ``T`` (uniform) or the max of the host mirror of per-request
    tokens (ragged; ``None`` without one; the ragged graph form's covers its padding rows too).
    ``max_seq_len_k`` is a host bound from the CPU mirror of ``seq_lens``, or ``None`` when the
    caller had none (never read back from the device). ``tokens_per_req`` is ``T`` for the
    uniform and graph forms and ``None`` for the ragged ones.
    """

    buffers: VerifyMetadataBuffers
    bs: int
    page_size: int
    tokens_per_req: int | None
    max_seq_len_q: int | None
    max_seq_len_k: int | None

    @property
    def cu_seqlens_q(self) -> torch.Tensor:
        """``[padded_bs + 1]`` int32 query offsets."""
        return self.buffers.cu_seqlens_q

    @property
    def cache_seqlens(self) -> torch.Tensor:
        """``[padded_bs]`` int32 key lengths after the verify tokens are appended."""
        return self.buffers.cache_seqlens

    @property
    def cu_seqlens_k(self) -> torch.Tensor:
        """``[padded_bs + 1]`` int32 key offsets."""
        return self.buffers.cu_seqlens_k

    @property
    def page_table(self) -> torch.Tensor | None:
        """``[padded_bs, max_pages]`` int32 page ids, or ``None`` without a token table."""
        return self.buffers.page_table

    @property
    def padded_bs(self) -> int:
        """Rows in the buffers, padding included."""
        return self.buffers.padded_bs
