"""TARGET_VERIFY attention metadata: one fused Triton launch, no host sync, and its torch twin.

Four forms share one kernel body and one twin:

* **uniform** (:func:`build_verify_metadata`): ``T = num_tokens // bs`` tokens per request;
* **graph** (:func:`build_verify_metadata_into`): the same, written into caller-owned static
  buffers sized for a captured bucket ``padded_bs >= bs``; no allocation, so it can run inside a
  CUDA graph or right before its replay;
* **ragged** (:func:`build_ragged_verify_metadata`): per-request token counts from a device tensor;
* **ragged graph** (:func:`build_ragged_verify_metadata_into`): ragged rows written into static
  buffers for a token bucket (``padded_bs`` rows, ``padded_tokens`` tokens); the padding rows
  share the leftover tokens as SGLang's ``padded_to_bucket`` does, a padding row may get 0.

Outputs (int32): ``cu_seqlens_q [padded_bs+1]`` (exclusive prefix sum of tokens per row),
``cache_seqlens [padded_bs]`` (``seq_lens + tokens``), ``cu_seqlens_k [padded_bs+1]`` (exclusive
prefix sum of ``cache_seqlens``) and, with a request-to-token table, ``page_table
[padded_bs, max_pages]`` with ``page_table[i, p] = req_to_token[req_pool_indices[i], p * P] // P``
for the ``ceil(cache_seqlens[i] / P)`` pages row ``i`` uses and :data:`PAD_PAGE` after them.

Padding rows ``bs..padded_bs`` of the graph form are requests of length :data:`PAD_SEQ_LEN` that
still take ``T`` query tokens (the captured graph runs ``padded_bs * T`` tokens), so
``cu_seqlens_q`` keeps striding by ``T``, ``cache_seqlens`` is ``T`` and every page is
:data:`PAD_PAGE` (page 0 holds the pool's padding slot, which padded rows may read harmlessly).
Padding rows of the ragged graph form are the same, with their share of the bucket for ``T``.

Strides always follow ``T``, the target-verify width, never the draft width ``D``: one engine
backend strode ``cu_seqlens_q`` by ``D`` while offsetting keys by ``T``. Nothing here reads
device data on the host: ``max_seq_len_k`` comes from a CPU mirror of ``seq_lens`` when the caller
has one and is ``None`` otherwise.

Input values are checked where reading them is free: on CPU tensors every launcher refuses
negative lengths, outputs past int32, a ``req_to_token`` (or graph page table) too narrow for a
row, pool indices out of range and a CPU mirror that disagrees with the device lengths, each an
:class:`~specstrat.errors.InvalidConfig`. On CUDA those reads would be host syncs, so the fused
path skips them unless the caller passes ``validate=True``.

This module holds the launchers; the types live in ``_verify_buffers``, the kernel and its twin in
``_verify_kernel`` and the input checks in ``_verify_checks``, all re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int, index_tensor, reads_values
from specstrat.kernels._keyword_width import width_by_keyword
from specstrat.kernels._triton import Backend, cdiv, launch, resolve_backend
from specstrat.kernels._verify_buffers import PAD_PAGE as PAD_PAGE
from specstrat.kernels._verify_buffers import PAD_SEQ_LEN as PAD_SEQ_LEN
from specstrat.kernels._verify_buffers import VerifyMetadata as VerifyMetadata
from specstrat.kernels._verify_buffers import VerifyMetadataBuffers as VerifyMetadataBuffers
from specstrat.kernels._verify_checks import (
    Paging,
    bucket_tokens,
    check_bucket,
    check_paging,
    check_total,
    check_values,
    max_k_bound,
    ragged_bounds,
    ragged_mirrors,
    uniform_tokens,
)
from specstrat.kernels._verify_kernel import (
    _BLOCK_PAGES,
    _BLOCK_ROWS,
    _verify_metadata_kernel,
    bucket_widths_ref,
)
from specstrat.kernels._verify_kernel import verify_metadata_ref as verify_metadata_ref

__all__ = [
    "PAD_PAGE",
    "PAD_SEQ_LEN",
    "VerifyMetadata",
    "VerifyMetadataBuffers",
    "build_ragged_verify_metadata",
    "build_ragged_verify_metadata_into",
    "build_verify_metadata",
    "build_verify_metadata_into",
    "verify_metadata_ref",
]


def _run(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    out: VerifyMetadataBuffers,
    paging: Paging | None,
    backend: Backend,
    padded_tokens: int | None = None,
) -> None:
    """Dispatch one metadata build to the Triton kernel or the twin (``padded_tokens``: the
    bucketed ragged form)."""
    tensors = [seq_lens, out.cache_seqlens]
    if paging is not None:
        tensors += [paging.req_pool_indices, paging.req_to_token]
    rpi = paging.req_pool_indices if paging is not None else None
    rtt = paging.req_to_token if paging is not None else None
    page_size = paging.page_size if paging is not None else 1
    if resolve_backend(backend, *tensors) == "torch":
        verify_metadata_ref(seq_lens, tokens, out, rpi, rtt, page_size, padded_tokens)
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
        padded_tokens or 0,
        rtt.shape[1] if rtt is not None else 0,
        out.page_table.shape[1] if out.page_table is not None else 0,
        page_size,
        RAGGED=ragged,
        BUCKETED=padded_tokens is not None,
        HAS_PAGES=out.page_table is not None,
        BLOCK_ROWS=_BLOCK_ROWS,
        BLOCK_PAGES=_BLOCK_PAGES,
    )


def _check_values(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    padded_bs: int,
    paging: Paging | None,
    page_cols: int | None,
    validate: bool,
    padded_tokens: int | None = None,
) -> bool:
    """Run the value checks when they may read the tensors (see :func:`reads_values`); say if so."""
    tensors = [seq_lens, *(paging.tensors if paging is not None else ())]
    if isinstance(tokens, torch.Tensor):
        tensors.append(tokens)
    if not reads_values(validate, *tensors):
        return False
    check_values(
        seq_lens,
        tokens,
        padded_bs=padded_bs,
        paging=paging,
        page_cols=page_cols,
        padded_tokens=padded_tokens,
    )
    return True


def _static_inputs(buffers: VerifyMetadataBuffers, seq_lens: torch.Tensor) -> torch.Tensor:
    """The in-place forms' first checks: real buffers, and ``seq_lens`` on their device."""
    if not isinstance(buffers, VerifyMetadataBuffers):
        raise InvalidConfig(
            f"buffers={type(buffers).__name__}; pass VerifyMetadataBuffers.allocate(padded_bs, ...)"
        )
    return index_tensor("seq_lens", seq_lens, ndim=1, device=buffers.cache_seqlens.device)


def _fits(
    buffers: VerifyMetadataBuffers,
    bs: int,
    req_pool_indices: torch.Tensor | None,
    req_to_token: torch.Tensor | None,
    page_size: int,
    seq_lens: torch.Tensor,
) -> tuple[Paging | None, int | None]:
    """The batch fits the buffers' rows, and they hold a page table exactly when one is built;
    the checked paging inputs and the page table's width."""
    if bs > buffers.padded_bs:
        raise InvalidConfig(
            f"bs={bs} exceeds the buffers' padded_bs={buffers.padded_bs}; "
            "pick the smallest captured bucket with padded_bs >= bs"
        )
    paging = check_paging(req_pool_indices, req_to_token, page_size, seq_lens)
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
    return paging, buffers.page_table.shape[1] if buffers.page_table is not None else None


@width_by_keyword("num_tokens", positional=1)
def build_verify_metadata(
    seq_lens: torch.Tensor,
    *,
    num_tokens: int,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Uniform TARGET_VERIFY metadata for ``bs = len(seq_lens)`` requests of ``num_tokens // bs``.

    ``num_tokens`` is the batch's *total* query tokens and keyword-only (the graph form takes a
    per-request ``tokens_per_req``; positional use is deprecated, see
    :mod:`specstrat.kernels._keyword_width`).

    ``num_tokens % bs != 0`` is an :class:`~specstrat.errors.InvalidConfig` (never a silent
    floor); ``bs == 0`` needs ``num_tokens == 0`` and gives empty, well-formed metadata. With
    ``req_pool_indices`` and ``req_to_token`` the page table for ``page_size`` is built too.
    Values (negative lengths, int32 overflow, a too-narrow ``req_to_token``, pool indices out of
    range, a disagreeing ``seq_lens_cpu``) are checked on CPU tensors, and on CUDA tensors only
    with ``validate=True`` (there the checks are host syncs).
    """
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1)
    bs = seq_lens.shape[0]
    tokens = uniform_tokens(num_tokens, bs)
    paging = check_paging(req_pool_indices, req_to_token, page_size, seq_lens)
    max_pages = paging.max_pages if paging is not None else None
    check_total("cu_seqlens_q", bs * tokens, "query tokens of the batch")
    read = _check_values(seq_lens, tokens, bs, paging, max_pages, validate)
    max_k = max_k_bound(seq_lens_cpu, seq_lens if read else None, bs, tokens)
    out = VerifyMetadataBuffers.uninitialized(bs, max_pages, seq_lens.device)
    _run(seq_lens, tokens, out, paging, backend)
    return VerifyMetadata(out, bs, page_size, tokens, tokens, max_k)


@width_by_keyword("tokens_per_req", positional=2)
def build_verify_metadata_into(
    buffers: VerifyMetadataBuffers,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Graph form: write uniform metadata for ``len(seq_lens) <= buffers.padded_bs`` in place.

    ``tokens_per_req`` (keyword-only; positional use is deprecated) is ``T`` per request, from
    the algorithm's :class:`~specstrat.protocols.TargetVerifyPolicy`. Rows past the real batch are padding (see
    the module docstring). On the Triton path this is one launch, no allocation, no host sync;
    ``validate=True`` adds the value checks of :func:`build_verify_metadata` (host syncs) and
    checks that ``buffers.page_table`` has a column for every page a row uses. On CPU tensors
    those checks always run. Nothing is written when a check fails.
    """
    seq_lens = _static_inputs(buffers, seq_lens)
    bs = seq_lens.shape[0]
    tokens = host_int("tokens_per_req", tokens_per_req, minimum=1)
    paging, page_cols = _fits(buffers, bs, req_pool_indices, req_to_token, page_size, seq_lens)
    padded_bs = buffers.padded_bs
    check_total("cu_seqlens_q", padded_bs * tokens, "query tokens of the padded batch")
    read = _check_values(seq_lens, tokens, padded_bs, paging, page_cols, validate)
    max_k = max_k_bound(seq_lens_cpu, seq_lens if read else None, bs, tokens)
    _run(seq_lens, tokens, buffers, paging, backend)
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
    validate: bool = False,
) -> VerifyMetadata:
    """Ragged form: request ``i`` verifies ``num_tokens_per_req[i] >= 1`` tokens.

    ``cu_seqlens_q`` is the exclusive prefix sum of ``num_tokens_per_req`` (on the device, in the
    same single launch). The counts and the value checks of :func:`build_verify_metadata` are
    checked on CPU tensors; on CUDA they are host syncs, so they run only with ``validate=True``
    and are otherwise the caller's contract. Host bounds need both mirrors.
    """
    seq_lens = index_tensor("seq_lens", seq_lens, ndim=1)
    bs = seq_lens.shape[0]
    ntok = index_tensor(
        "num_tokens_per_req", num_tokens_per_req, ndim=1, device=seq_lens.device, rows=bs
    )
    paging = check_paging(req_pool_indices, req_to_token, page_size, seq_lens)
    max_pages = paging.max_pages if paging is not None else None
    read = _check_values(seq_lens, ntok, bs, paging, max_pages, validate)
    seq_mirror, tok_mirror = ragged_mirrors(
        seq_lens_cpu, num_tokens_per_req_cpu, seq_lens, ntok, read=read
    )
    out = VerifyMetadataBuffers.uninitialized(bs, max_pages, seq_lens.device)
    _run(seq_lens, ntok, out, paging, backend)
    return VerifyMetadata(out, bs, page_size, None, *ragged_bounds(seq_mirror, tok_mirror))


def build_ragged_verify_metadata_into(
    buffers: VerifyMetadataBuffers,
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    *,
    padded_tokens: int,
    req_pool_indices: torch.Tensor | None = None,
    req_to_token: torch.Tensor | None = None,
    page_size: int = 1,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    num_tokens_per_req_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Bucketed ragged form: ragged metadata written in place into a token bucket.

    The buffers hold ``padded_bs`` rows for ``padded_tokens`` query tokens (a captured graph's
    shape). Rows ``0..bs`` are the real requests with their widths ``num_tokens_per_req[i] >= 1``,
    exactly as :func:`build_ragged_verify_metadata` writes them. The ``leftover = padded_tokens -
    sum(num_tokens_per_req)`` tokens are spread over the ``padded_bs - bs`` padding rows as
    SGLang 0.5.23's ``padded_to_bucket`` does: ``base = leftover // (padded_bs - bs)`` tokens
    each, plus one for the first ``leftover % (padded_bs - bs)`` padding rows, so a padding row
    may get width 0 and ``cu_seqlens_q[-1] == padded_tokens``. Padding rows are harmless as in
    the graph form: length :data:`PAD_SEQ_LEN`, ``cache_seqlens`` = their width, every page
    :data:`PAD_PAGE`.

    Refused with :class:`~specstrat.errors.InvalidConfig`: ``padded_tokens < bs``, ``bs >
    padded_bs``, real widths summing past ``padded_tokens``, and leftover tokens with no padding
    row (``padded_bs == bs``; SGLang would widen the last real row). The last two read the
    widths, so they run on the host mirror ``num_tokens_per_req_cpu`` when given, on CPU tensors,
    and on CUDA only with ``validate=True``; unchecked on CUDA, the kernel follows SGLang's rule.
    The other value checks are those of :func:`build_verify_metadata_into`. The Triton path is
    one launch, no allocation, no host sync; nothing is written when a check fails.
    ``max_seq_len_q``/``max_seq_len_k`` cover every row, padding included, and need the mirrors
    (``max_seq_len_q``: ``num_tokens_per_req_cpu``; ``max_seq_len_k``: both).
    """
    seq_lens = _static_inputs(buffers, seq_lens)
    bs, padded_bs = seq_lens.shape[0], buffers.padded_bs
    ntok = index_tensor(
        "num_tokens_per_req", num_tokens_per_req, ndim=1, device=seq_lens.device, rows=bs
    )
    paging, page_cols = _fits(buffers, bs, req_pool_indices, req_to_token, page_size, seq_lens)
    total = bucket_tokens(padded_tokens, bs, padded_bs)
    read = _check_values(seq_lens, ntok, padded_bs, paging, page_cols, validate, total)
    seq_mirror, tok_mirror = ragged_mirrors(
        seq_lens_cpu, num_tokens_per_req_cpu, seq_lens, ntok, read=read
    )
    if tok_mirror is not None:
        real = int(tok_mirror.sum())
        name = "num_tokens_per_req_cpu"
        check_bucket(real, name, bs=bs, padded_bs=padded_bs, padded_tokens=total)
        tok_mirror = bucket_widths_ref(tok_mirror, padded_bs, total)
    _run(seq_lens, ntok, buffers, paging, backend, total)
    return VerifyMetadata(buffers, bs, page_size, None, *ragged_bounds(seq_mirror, tok_mirror))
