"""TARGET_VERIFY metadata invariants: a batch description and a checker for any metadata object.

:func:`check_verify_metadata` states every invariant from the definitions (not by calling the
twin), so it judges the kernel, the twin and a user's own metadata builder alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from specstrat.errors import ConformanceError, InvalidConfig
from specstrat.kernels import (
    PAD_PAGE,
    PAD_SEQ_LEN,
    Backend,
    Paging,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_ragged_verify_metadata_into,
    build_verify_metadata,
    build_verify_metadata_into,
)

__all__ = [
    "Form",
    "VerifyBatch",
    "check_verify_metadata",
]

Form = Literal["uniform", "graph", "ragged", "ragged_graph"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifyBatch:
    """Inputs of one TARGET_VERIFY metadata build, in one of the four forms.

    Uniform: ``tokens_per_req`` set, ``padded_bs`` None. Graph: ``tokens_per_req`` and
    ``padded_bs >= bs`` set. Ragged: ``num_tokens_per_req`` set. Ragged graph (bucketed):
    ``num_tokens_per_req``, ``padded_bs`` and ``padded_tokens`` set. ``paging`` is what the
    builder gets (``None``: no page table). ``num_draft_tokens`` is D when ``tokens_per_req``
    came from a policy (the checker then also asserts ``1 <= T <= D + 1``).
    """

    seq_lens: torch.Tensor
    tokens_per_req: int | None = None
    num_tokens_per_req: torch.Tensor | None = None
    padded_bs: int | None = None
    paging: Paging | None = None
    num_draft_tokens: int | None = None
    padded_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.tokens_per_req is None) == (self.num_tokens_per_req is None):
            raise InvalidConfig(
                "set exactly one of tokens_per_req (uniform/graph) and num_tokens_per_req (ragged)"
            )
        bucketed = self.padded_tokens is not None
        if bucketed and (self.num_tokens_per_req is None or self.padded_bs is None):
            raise InvalidConfig(
                f"padded_tokens={self.padded_tokens} is for the ragged graph form; set it with "
                "num_tokens_per_req and padded_bs"
            )
        if self.padded_bs is not None and self.num_tokens_per_req is not None and not bucketed:
            raise InvalidConfig(
                f"padded_bs={self.padded_bs} with num_tokens_per_req needs padded_tokens (the "
                "ragged graph form); the plain ragged form has no padding"
            )

    @property
    def bs(self) -> int:
        """Real requests in the batch."""
        return self.seq_lens.shape[0]

    @property
    def form(self) -> Form:
        """Which builder this batch is for."""
        if self.num_tokens_per_req is not None:
            return "ragged" if self.padded_tokens is None else "ragged_graph"
        return "uniform" if self.padded_bs is None else "graph"

    def tokens(self) -> torch.Tensor:
        """Per-request query tokens, ``[bs]`` int64."""
        if self.num_tokens_per_req is not None:
            return self.num_tokens_per_req.to(torch.int64)
        return torch.full((self.bs,), self.tokens_per_req or 0, dtype=torch.int64)

    def padding_tokens(self) -> torch.Tensor:
        """Query tokens of each padding row, ``[padded_bs - bs]`` int64: ``T`` in the graph form; in
        the ragged graph form the bucket's leftover ``L = padded_tokens - sum(num_tokens_per_req)``
        split as SGLang's ``padded_to_bucket`` does: ``L // pad + 1`` for the first ``L % pad``
        rows, ``L // pad`` for the rest (so 0 when ``L < pad``)."""
        pad = (self.padded_bs or self.bs) - self.bs
        if self.padded_tokens is None:
            return torch.full((pad,), self.tokens_per_req or 0, dtype=torch.int64)
        leftover = self.padded_tokens - int(self.tokens().sum())
        base, rem = divmod(leftover, pad) if pad else (0, 0)
        return torch.tensor([base + 1] * rem + [base] * (pad - rem), dtype=torch.int64)

    def build(self, backend: Backend = "auto") -> VerifyMetadata:
        """Run the library's builder for this batch's form."""
        paging, seq_cpu = self.paging, self.seq_lens.cpu()
        if self.num_tokens_per_req is not None and self.padded_tokens is None:
            return build_ragged_verify_metadata(
                self.seq_lens,
                self.num_tokens_per_req,
                paging=paging,
                seq_lens_cpu=seq_cpu,
                num_tokens_per_req_cpu=self.num_tokens_per_req.cpu(),
                backend=backend,
            )
        tokens = self.tokens_per_req or 0
        if self.padded_bs is None:
            return build_verify_metadata(
                self.seq_lens,
                num_tokens=self.bs * tokens,
                paging=paging,
                seq_lens_cpu=seq_cpu,
                backend=backend,
            )
        max_pages = paging.max_pages if paging is not None else None
        buffers = VerifyMetadataBuffers.allocate(
            self.padded_bs, max_pages=max_pages, device=self.seq_lens.device
        )
        # Poison the static buffers so a builder that skips a row is caught.
        for tensor in (buffers.cu_seqlens_q, buffers.cache_seqlens, buffers.cu_seqlens_k):
            tensor.fill_(-7)
        if buffers.page_table is not None:
            buffers.page_table.fill_(-7)
        if self.num_tokens_per_req is not None and self.padded_tokens is not None:
            return build_ragged_verify_metadata_into(
                buffers,
                self.seq_lens,
                self.num_tokens_per_req,
                padded_tokens=self.padded_tokens,
                paging=paging,
                seq_lens_cpu=seq_cpu,
                num_tokens_per_req_cpu=self.num_tokens_per_req.cpu(),
                backend=backend,
            )
        return build_verify_metadata_into(
            buffers,
            self.seq_lens,
            tokens_per_req=tokens,
            paging=paging,
            seq_lens_cpu=seq_cpu,
            backend=backend,
        )


def _require(ok: bool, invariant: str, detail: str) -> None:
    if not ok:
        raise ConformanceError(f"verify metadata broke '{invariant}': {detail}")


def _equal(got: torch.Tensor, want: torch.Tensor, invariant: str) -> None:
    got, want = got.cpu().to(torch.int64), want.cpu().to(torch.int64)
    same = got.shape == want.shape and torch.equal(got, want)
    _require(same, invariant, f"got {got.tolist()}, want {want.tolist()}")


def check_verify_metadata(meta: VerifyMetadata, batch: VerifyBatch) -> None:
    """Assert every TARGET_VERIFY invariant of ``meta`` for ``batch``; raise naming the first
    broken.

    Dtypes and shapes; ``cu_seqlens_q`` and ``cu_seqlens_k`` start at 0 and step by each row's
    tokens and ``cache_seqlens``; ``cache_seqlens = seq_lens + tokens``; padding rows stand for
    :data:`~specstrat.kernels.PAD_SEQ_LEN` with ``T`` tokens (ragged graph: their share of the
    bucket, see :meth:`VerifyBatch.padding_tokens`, and ``cu_seqlens_q[-1] == padded_tokens``)
    and only :data:`~specstrat.kernels.PAD_PAGE` pages; host bounds; ``1 <= T <= D + 1``; page
    ids.
    """
    bs = batch.bs
    padded_bs = batch.padded_bs if batch.padded_bs is not None else bs
    _require(meta.bs == bs, "bs is the number of real requests", f"meta.bs={meta.bs}, bs={bs}")
    shapes = {
        "cu_seqlens_q": (padded_bs + 1,),
        "cache_seqlens": (padded_bs,),
        "cu_seqlens_k": (padded_bs + 1,),
    }
    for name, shape in shapes.items():
        tensor = getattr(meta, name)
        _require(
            tensor.dtype == torch.int32 and tuple(tensor.shape) == shape,
            f"{name} is int32 of shape {shape}",
            f"{tensor.dtype} {tuple(tensor.shape)}",
        )
    t = batch.tokens_per_req
    if t is not None and batch.num_draft_tokens is not None:
        d = batch.num_draft_tokens
        _require(1 <= t <= d + 1, "1 <= T <= num_draft_tokens + 1", f"T={t}, D={d}")
    pad = padded_bs - bs
    tokens = torch.cat([batch.tokens(), batch.padding_tokens()])
    seq = torch.cat(
        [batch.seq_lens.cpu().to(torch.int64), torch.full((pad,), PAD_SEQ_LEN, dtype=torch.int64)]
    )
    cache = seq + tokens
    _equal(meta.cache_seqlens, cache, "cache_seqlens = seq_lens + tokens per request")
    cu_q, cu_k = meta.cu_seqlens_q.cpu().to(torch.int64), meta.cu_seqlens_k.cpu().to(torch.int64)
    _require(
        int(cu_q[0]) == 0 and int(cu_k[0]) == 0, "prefix sums start at 0", f"{cu_q[0]}, {cu_k[0]}"
    )
    _equal(cu_q.diff(), tokens, "cu_seqlens_q steps by each row's tokens (T, never D)")
    _equal(cu_k.diff(), cache, "cu_seqlens_k steps by cache_seqlens")
    if batch.padded_tokens is not None:
        _require(
            int(cu_q[-1]) == batch.padded_tokens and bool((tokens >= 0).all()),
            "the bucket's padded_tokens are all covered, padding rows of >= 0 tokens",
            f"cu_seqlens_q[-1]={int(cu_q[-1])}, padded_tokens={batch.padded_tokens}",
        )
    if batch.form not in ("ragged", "ragged_graph"):
        # An empty uniform batch has 0 tokens, so T = 0 // 0 is defined as 0.
        want_t = t if bs or batch.form == "graph" else 0
        _require(
            meta.max_seq_len_q == want_t, "max_seq_len_q = T", f"{meta.max_seq_len_q} != {want_t}"
        )
    elif padded_bs:
        # Ragged graph: padding rows are attended too, so the bound covers them.
        rows = padded_bs if batch.form == "ragged_graph" else bs
        want_q = int(tokens[:rows].max())
        _require(
            meta.max_seq_len_q in (None, want_q),
            "max_seq_len_q is the largest per-request token count",
            f"{meta.max_seq_len_q} != {want_q}",
        )
    if meta.max_seq_len_k is not None:
        rows = padded_bs if batch.form == "ragged_graph" else bs
        want_k = int(cache[:rows].max()) if rows else 0
        _require(
            meta.max_seq_len_k >= want_k,
            "max_seq_len_k bounds every real row's cache_seqlens (ragged graph: every row)",
            f"{meta.max_seq_len_k} < {want_k}",
        )
    _check_pages(meta, batch, cache, padded_bs)


def _check_pages(
    meta: VerifyMetadata, batch: VerifyBatch, cache: torch.Tensor, padded_bs: int
) -> None:
    paging = batch.paging
    if paging is None:
        _require(meta.page_table is None, "no page table without paging", "one was built")
        return
    table = meta.page_table
    rtt, rpi, p = paging.req_to_token, paging.req_pool_indices, paging.page_size
    max_pages = -(-rtt.shape[1] // p)
    if table is None:
        raise ConformanceError("verify metadata broke 'a page table with paging': missing")
    _require(
        table.dtype == torch.int32 and tuple(table.shape) == (padded_bs, max_pages),
        f"page_table is int32 of shape {(padded_bs, max_pages)}",
        f"{table.dtype} {tuple(table.shape)}",
    )
    want = torch.full((padded_bs, max_pages), PAD_PAGE, dtype=torch.int64)
    rtt_cpu, rpi_cpu = rtt.cpu().to(torch.int64), rpi.cpu().to(torch.int64)
    for i in range(batch.bs):
        used = min(-(-int(cache[i]) // p), -(-rtt.shape[1] // p))
        first_tokens = rtt_cpu[rpi_cpu[i], torch.arange(used) * p]
        want[i, :used] = first_tokens // p
    _equal(table, want, "page_table[i, p] = req_to_token[req_pool_indices[i], p*P] // P")
