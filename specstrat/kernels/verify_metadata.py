"""TARGET_VERIFY attention metadata: one fused Triton launch, no host sync, and its torch twin.

Three forms share one kernel body and one twin:

* **uniform** (:func:`build_verify_metadata`): ``T = num_tokens // bs`` tokens per request;
* **graph** (:func:`build_verify_metadata_into`): the same, written into caller-owned static
  buffers sized for a captured bucket ``padded_bs >= bs``; no allocation, so it can run inside a
  CUDA graph or right before its replay;
* **ragged** (:func:`build_ragged_verify_metadata`): per-request token counts from a device tensor.

Outputs (int32): ``cu_seqlens_q [padded_bs+1]`` (exclusive prefix sum of tokens per row),
``cache_seqlens [padded_bs]`` (``seq_lens + tokens``), ``cu_seqlens_k [padded_bs+1]`` (exclusive
prefix sum of ``cache_seqlens``) and, with a request-to-token table, ``page_table
[padded_bs, max_pages]`` with ``page_table[i, p] = req_to_token[req_pool_indices[i], p * P] // P``
for the ``ceil(cache_seqlens[i] / P)`` pages row ``i`` uses and :data:`PAD_PAGE` after them.

Padding rows ``bs..padded_bs`` of the graph form are requests of length :data:`PAD_SEQ_LEN` that
still take ``T`` query tokens (the captured graph runs ``padded_bs * T`` tokens), so
``cu_seqlens_q`` keeps striding by ``T``, ``cache_seqlens`` is ``T`` and every page is
:data:`PAD_PAGE` (page 0 holds the pool's padding slot, which padded rows may read harmlessly).

Strides always follow ``T``, the target-verify width, never the draft width ``D``: one engine
backend strode ``cu_seqlens_q`` by ``D`` while offsetting keys by ``T``. Nothing here reads
device data on the host: ``max_seq_len_k`` comes from a CPU mirror of ``seq_lens`` when the caller
has one and is ``None`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch
import torch.nn.functional as F

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int, index_tensor, static_buffer
from specstrat.kernels._triton import Backend, cdiv, jit, launch, resolve_backend, tl

__all__ = [
    "PAD_PAGE",
    "PAD_SEQ_LEN",
    "VerifyMetadata",
    "VerifyMetadataBuffers",
    "build_ragged_verify_metadata",
    "build_verify_metadata",
    "build_verify_metadata_into",
    "verify_metadata_ref",
]

#: Sequence length that padding rows of the graph form stand for.
PAD_SEQ_LEN: Final = 0
#: Page id written for pages a row does not use, and for every page of a padding row.
PAD_PAGE: Final = 0

# One program covers 128 rows: decode batches of <=128 need a single program and no prefix loop.
# Not yet swept on a GPU (no device was lent to the session that wrote this).
_BLOCK_ROWS: Final = 128
_BLOCK_PAGES: Final = 64


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
    def _uninitialized(
        cls, padded_bs: int, max_pages: int | None, device: torch.device
    ) -> VerifyMetadataBuffers:
        # Both paths write every element, so the allocating forms skip the zero-fill launches.
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

    ``bs`` real rows come first; rows ``bs..padded_bs`` are padding (graph form only).
    ``max_seq_len_q`` is ``T`` (uniform) or the max of the host mirror of per-request tokens
    (ragged; ``None`` without one). ``max_seq_len_k`` is a host bound from the CPU mirror of
    ``seq_lens``, or ``None`` when the caller had none (never read back from the device).
    ``tokens_per_req`` is ``T`` for the uniform and graph forms and ``None`` for ragged.
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


@jit
def _verify_metadata_kernel(  # type: ignore[no-untyped-def]
    seq_lens_ptr,
    tokens_ptr,
    req_pool_ptr,
    req_to_token_ptr,
    cu_q_ptr,
    cache_ptr,
    cu_k_ptr,
    page_ptr,
    bs,
    padded_bs,
    tokens_per_req,
    req_to_token_width,
    max_pages,
    page_size,
    RAGGED: tl.constexpr,
    HAS_PAGES: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row0 = pid * BLOCK_ROWS
    # Rows before this program's block: their token and key totals are this block's carries.
    # O(bs) per program, and bs / BLOCK_ROWS programs: cheaper than a second launch.
    carry_q = tl.zeros((), dtype=tl.int64)
    carry_k = tl.zeros((), dtype=tl.int64)
    for start in range(0, row0, BLOCK_ROWS):
        prev = start + tl.arange(0, BLOCK_ROWS)
        prev_real = prev < bs
        prev_seq = tl.load(seq_lens_ptr + prev, mask=prev_real, other=0).to(tl.int64)
        if RAGGED:
            prev_tok = tl.load(tokens_ptr + prev, mask=prev_real, other=0).to(tl.int64)
        else:
            prev_tok = tl.where(prev < padded_bs, tokens_per_req, 0).to(tl.int64)
        carry_q += tl.sum(prev_tok, axis=0)
        carry_k += tl.sum(prev_seq + prev_tok, axis=0)

    rows = row0 + tl.arange(0, BLOCK_ROWS)
    real = rows < bs
    in_bucket = rows < padded_bs
    seq = tl.load(seq_lens_ptr + rows, mask=real, other=0).to(tl.int64)  # padding: PAD_SEQ_LEN
    if RAGGED:
        tok = tl.load(tokens_ptr + rows, mask=real, other=0).to(tl.int64)
    else:
        tok = tl.where(in_bucket, tokens_per_req, 0).to(tl.int64)
    cache = seq + tok
    cu_q = carry_q + tl.cumsum(tok, axis=0)
    cu_k = carry_k + tl.cumsum(cache, axis=0)
    tl.store(cache_ptr + rows, cache.to(tl.int32), mask=in_bucket)
    tl.store(cu_q_ptr + rows + 1, cu_q.to(tl.int32), mask=in_bucket)
    tl.store(cu_k_ptr + rows + 1, cu_k.to(tl.int32), mask=in_bucket)
    first = rows == 0
    tl.store(cu_q_ptr + rows, tl.zeros_like(rows).to(tl.int32), mask=first)
    tl.store(cu_k_ptr + rows, tl.zeros_like(rows).to(tl.int32), mask=first)

    if HAS_PAGES:
        slot = tl.load(req_pool_ptr + rows, mask=real, other=0).to(tl.int64)
        num_pages = tl.where(real, (cache + page_size - 1) // page_size, 0)
        for p0 in range(0, max_pages, BLOCK_PAGES):
            pages = p0 + tl.arange(0, BLOCK_PAGES)
            token_pos = pages.to(tl.int64) * page_size
            used = (
                real[:, None]
                & (pages[None, :] < num_pages[:, None])
                & (token_pos[None, :] < req_to_token_width)
            )
            src = req_to_token_ptr + slot[:, None] * req_to_token_width + token_pos[None, :]
            first_token = tl.load(src, mask=used, other=0).to(tl.int64)
            page_id = tl.where(used, first_token // page_size, 0)  # 0 == PAD_PAGE
            dst = page_ptr + rows[:, None] * max_pages + pages[None, :]
            tl.store(
                dst, page_id.to(tl.int32), mask=in_bucket[:, None] & (pages[None, :] < max_pages)
            )


def verify_metadata_ref(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    out: VerifyMetadataBuffers,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
) -> None:
    """Torch twin of the kernel: writes the metadata for ``seq_lens`` into ``out``.

    ``tokens`` is ``T`` (an int: uniform and graph forms) or per-request counts (a tensor:
    ragged form, where ``out.padded_bs == bs``). The launchers validate; this only computes.
    """
    bs, padded_bs = seq_lens.shape[0], out.padded_bs
    dev = seq_lens.device
    # Per-row query tokens: the real rows' counts, then T for each padding row.
    if isinstance(tokens, int):
        tok = torch.full((padded_bs,), tokens, dtype=torch.int64, device=dev)
    else:
        tok = tokens.to(torch.int64)
    # Per-row prefix length: seq_lens, then PAD_SEQ_LEN for each padding row.
    seq = seq_lens.to(torch.int64)
    if padded_bs > bs:
        seq = F.pad(seq, (0, padded_bs - bs), value=PAD_SEQ_LEN)
    cache = seq + tok
    # Both exclusive prefix sums in one cumsum: row 0 is tokens, row 1 is cache_seqlens.
    prefix = F.pad(torch.cumsum(torch.stack([tok, cache]), dim=1), (1, 0))
    out.cache_seqlens.copy_(cache)
    out.cu_seqlens_q.copy_(prefix[0])
    out.cu_seqlens_k.copy_(prefix[1])
    if out.page_table is None or req_pool_indices is None or req_to_token is None:
        return
    # Reads the first token slot of each used page from the request's row of req_to_token.
    width = req_to_token.shape[1]
    pages = torch.arange(out.page_table.shape[1], device=dev)
    token_pos = pages * page_size
    num_pages = (cache[:bs] + page_size - 1) // page_size
    used = (pages[None, :] < num_pages[:, None]) & (token_pos[None, :] < width)
    rows = req_to_token[req_pool_indices.long()[:, None], token_pos.clamp(max=width - 1)[None, :]]
    page_ids = rows if page_size == 1 else rows // page_size
    out.page_table[:bs].copy_(torch.where(used, page_ids, PAD_PAGE))
    out.page_table[bs:].fill_(PAD_PAGE)


def _run(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    out: VerifyMetadataBuffers,
    paging: _Paging | None,
    backend: Backend,
) -> None:
    """Dispatch one metadata build to the Triton kernel or the twin."""
    tensors = [seq_lens, out.cache_seqlens]
    if paging is not None:
        tensors += [paging.req_pool_indices, paging.req_to_token]
    rpi = paging.req_pool_indices if paging is not None else None
    rtt = paging.req_to_token if paging is not None else None
    page_size = paging.page_size if paging is not None else 1
    if resolve_backend(backend, *tensors) == "torch":
        verify_metadata_ref(seq_lens, tokens, out, rpi, rtt, page_size)
        return
    ragged = isinstance(tokens, torch.Tensor)
    padded_bs = out.padded_bs
    launch(
        _verify_metadata_kernel,
        (max(1, cdiv(padded_bs, _BLOCK_ROWS)),),
        seq_lens,
        tokens if isinstance(tokens, torch.Tensor) else seq_lens,
        rpi if rpi is not None else seq_lens,
        rtt if rtt is not None else seq_lens,
        out.cu_seqlens_q,
        out.cache_seqlens,
        out.cu_seqlens_k,
        out.page_table if out.page_table is not None else out.cache_seqlens,
        seq_lens.shape[0],
        padded_bs,
        0 if isinstance(tokens, torch.Tensor) else tokens,
        rtt.shape[1] if rtt is not None else 0,
        out.page_table.shape[1] if out.page_table is not None else 0,
        page_size,
        RAGGED=ragged,
        HAS_PAGES=out.page_table is not None,
        BLOCK_ROWS=_BLOCK_ROWS,
        BLOCK_PAGES=_BLOCK_PAGES,
    )


@dataclass(frozen=True, slots=True)
class _Paging:
    req_pool_indices: torch.Tensor
    req_to_token: torch.Tensor
    page_size: int

    @property
    def max_pages(self) -> int:
        return cdiv(self.req_to_token.shape[1], self.page_size)


def _paging(
    req_pool_indices: torch.Tensor | None,
    req_to_token: torch.Tensor | None,
    page_size: int,
    seq_lens: torch.Tensor,
) -> _Paging | None:
    page_size = host_int("page_size", page_size, minimum=1)
    if req_pool_indices is None and req_to_token is None:
        return None
    if req_pool_indices is None or req_to_token is None:
        missing = "req_pool_indices" if req_pool_indices is None else "req_to_token"
        raise InvalidConfig(f"{missing}=None; pass req_pool_indices and req_to_token together")
    bs, dev = seq_lens.shape[0], seq_lens.device
    rpi = index_tensor("req_pool_indices", req_pool_indices, ndim=1, device=dev, rows=bs)
    rtt = index_tensor("req_to_token", req_to_token, ndim=2, device=dev)
    if rtt.shape[1] == 0 or rtt.shape[0] == 0:
        raise InvalidConfig(f"req_to_token.shape={tuple(rtt.shape)} is empty; size it [pool, ctx]")
    if rpi.device.type == "cpu" and bs:
        lo, hi = int(rpi.min()), int(rpi.max())
        if lo < 0 or hi >= rtt.shape[0]:
            raise InvalidConfig(
                f"req_pool_indices range {lo}..{hi} is outside req_to_token's "
                f"{rtt.shape[0]} rows; every index must lie in 0..{rtt.shape[0] - 1}"
            )
    return _Paging(rpi, rtt, page_size)


def _host_max(name: str, mirror: Sequence[int] | torch.Tensor, bs: int) -> int:
    """Max of a host mirror (0 for an empty batch); refuses device tensors and wrong lengths."""
    if isinstance(mirror, torch.Tensor):
        if mirror.device.type != "cpu":
            raise InvalidConfig(
                f"{name}.device={mirror.device}; the mirror must live on the CPU (reading a "
                "device tensor here would be a host sync)"
            )
        values = [int(v) for v in mirror.reshape(-1).tolist()]
    else:
        values = [int(v) for v in mirror]
    if len(values) != bs:
        raise InvalidConfig(f"{name} has {len(values)} entries; expected bs={bs}")
    return max(values, default=0)


def _tokens_per_req(num_tokens: int, bs: int) -> int:
    num_tokens = host_int("num_tokens", num_tokens, minimum=0)
    if bs == 0:
        if num_tokens != 0:
            raise InvalidConfig(f"num_tokens={num_tokens} with bs=0; an empty batch has 0 tokens")
        return 0
    if num_tokens % bs != 0:
        raise InvalidConfig(
            f"num_tokens={num_tokens} is not a multiple of bs={bs}; "
            "pass bs * tokens_per_req tokens (use the ragged form for per-request widths)"
        )
    if num_tokens == 0:
        raise InvalidConfig(
            f"num_tokens=0 with bs={bs}; TARGET_VERIFY needs >= 1 token per request"
        )
    return num_tokens // bs


def build_verify_metadata(
    seq_lens: torch.Tensor,
    num_tokens: int,
    *,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
) -> VerifyMetadata:
    """Uniform TARGET_VERIFY metadata for ``bs = len(seq_lens)`` requests of ``num_tokens // bs``.

    ``num_tokens % bs != 0`` is an :class:`~specstrat.errors.InvalidConfig` (never a silent
    floor); ``bs == 0`` needs ``num_tokens == 0`` and gives empty, well-formed metadata. With
    ``req_pool_indices`` and ``req_to_token`` the page table for ``page_size`` is built too.
    """
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1)
    bs = seq_lens.shape[0]
    tokens = _tokens_per_req(num_tokens, bs)
    paging = _paging(req_pool_indices, req_to_token, page_size, seq_lens)
    max_pages = paging.max_pages if paging is not None else None
    out = VerifyMetadataBuffers._uninitialized(bs, max_pages, seq_lens.device)
    _run(seq_lens, tokens, out, paging, backend)
    max_k = None if seq_lens_cpu is None else _host_max("seq_lens_cpu", seq_lens_cpu, bs) + tokens
    return VerifyMetadata(out, bs, page_size, tokens, tokens, max_k)


def build_verify_metadata_into(
    buffers: VerifyMetadataBuffers,
    seq_lens: torch.Tensor,
    tokens_per_req: int,
    *,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
) -> VerifyMetadata:
    """Graph form: write uniform metadata for ``len(seq_lens) <= buffers.padded_bs`` in place.

    ``tokens_per_req`` is ``T`` from the algorithm's
    :class:`~specstrat.protocols.TargetVerifyPolicy`. Rows past the real batch are padding (see
    the module docstring). On the Triton path this is one launch, no allocation, no host sync.
    """
    if not isinstance(buffers, VerifyMetadataBuffers):
        raise InvalidConfig(
            f"buffers={type(buffers).__name__}; pass VerifyMetadataBuffers.allocate(padded_bs, ...)"
        )
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1, device=buffers.cache_seqlens.device)
    bs = seq_lens.shape[0]
    tokens = host_int("tokens_per_req", tokens_per_req, minimum=1)
    if bs > buffers.padded_bs:
        raise InvalidConfig(
            f"bs={bs} exceeds the buffers' padded_bs={buffers.padded_bs}; "
            "pick the smallest captured bucket with padded_bs >= bs"
        )
    paging = _paging(req_pool_indices, req_to_token, page_size, seq_lens)
    if (paging is None) != (buffers.page_table is None):
        raise InvalidConfig(
            "buffers.page_table is "
            + (
                "None but req_to_token was given"
                if paging is not None
                else "set but no req_to_token"
            )
            + "; allocate the buffers with max_pages exactly when a page table is built"
        )
    _run(seq_lens, tokens, buffers, paging, backend)
    max_k = None if seq_lens_cpu is None else _host_max("seq_lens_cpu", seq_lens_cpu, bs) + tokens
    return VerifyMetadata(buffers, bs, page_size, tokens, tokens, max_k)


def build_ragged_verify_metadata(
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    *,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    num_tokens_per_req_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
) -> VerifyMetadata:
    """Ragged form: request ``i`` verifies ``num_tokens_per_req[i] >= 1`` tokens.

    ``cu_seqlens_q`` is the exclusive prefix sum of ``num_tokens_per_req`` (on the device, in the
    same single launch). Counts are checked ``>= 1`` when they are on the CPU; on a GPU that check
    would be a host sync, so it is the caller's contract there. Host bounds need both mirrors.
    """
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1)
    bs = seq_lens.shape[0]
    ntok = index_tensor(
        "num_tokens_per_req", num_tokens_per_req, ndim=1, device=seq_lens.device, rows=bs
    )
    if ntok.device.type == "cpu" and bs and int(ntok.min()) < 1:
        raise InvalidConfig(
            f"num_tokens_per_req={ntok.tolist()} has an entry < 1; every request verifies "
            ">= 1 token"
        )
    paging = _paging(req_pool_indices, req_to_token, page_size, seq_lens)
    max_pages = paging.max_pages if paging is not None else None
    out = VerifyMetadataBuffers._uninitialized(bs, max_pages, seq_lens.device)
    _run(seq_lens, ntok, out, paging, backend)
    max_q = max_k = None
    if num_tokens_per_req_cpu is not None:
        max_q = _host_max("num_tokens_per_req_cpu", num_tokens_per_req_cpu, bs)
        if seq_lens_cpu is not None:
            _host_max("seq_lens_cpu", seq_lens_cpu, bs)  # validates the mirror's length
            pairs = zip(_as_list(seq_lens_cpu), _as_list(num_tokens_per_req_cpu), strict=True)
            max_k = max((s + t for s, t in pairs), default=0)
    return VerifyMetadata(out, bs, page_size, None, max_q, max_k)


def _as_list(mirror: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(mirror, torch.Tensor):
        return [int(v) for v in mirror.reshape(-1).tolist()]
    return [int(v) for v in mirror]
