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
prefix sum of ``cache_seqlens``) and, with a :class:`~specstrat.kernels.Paging`, ``page_table
[padded_bs, max_pages]`` with ``page_table[i, p] = req_to_token[req_pool_indices[i], p * P] // P``
for the ``ceil(cache_seqlens[i] / P)`` pages row ``i`` uses and :data:`PAD_PAGE` after them.

Padding rows ``bs..padded_bs`` of the graph form are requests of length :data:`PAD_SEQ_LEN` that
still take ``T`` query tokens (the captured graph runs ``padded_bs * T`` tokens), so
``cu_seqlens_q`` keeps striding by ``T``, ``cache_seqlens`` is ``T`` and every page is
:data:`PAD_PAGE` (page 0 holds the pool's padding KV index, which padded rows may read
harmlessly).
Padding rows of the ragged graph form are the same, with their share of the bucket for ``T``.

Strides always follow ``T``, the tokens per request the target verifies, never ``D``, the
draft tokens: one engine backend strode ``cu_seqlens_q`` by ``D`` while offsetting keys by
``T``. Nothing here reads device data on the host: ``max_seq_len_k`` comes from a CPU mirror of
``seq_lens`` when the caller has one and is ``None`` otherwise.

Every builder (the tree builders of :mod:`specstrat.kernels.tree_metadata` too) takes, after its
own inputs, the same keywords:

* ``paging``: a :class:`~specstrat.kernels.Paging` (pool rows, request-to-token table, page
  size), or ``None`` for no page table;
* ``seq_lens_cpu``: the host mirror of ``seq_lens`` (the ragged forms also take
  ``num_tokens_per_req_cpu``), which gives the host bounds; it sits beside the lengths it copies,
  not in the paging, because it describes the lengths and callers without a page table have one;
* ``backend`` (``"auto" | "triton" | "torch"``) and ``validate``: options of the one call, not
  facts about the batch (which path runs, and whether to pay host syncs for the value checks),
  so they stay plain keywords, as on every other kernel launcher of the package.

Input values are checked where reading them is free: on CPU tensors every builder refuses
negative lengths, outputs past int32, a ``req_to_token`` (or graph page table) too narrow for a
row, pool indices out of range and a CPU mirror that disagrees with the device lengths, each an
:class:`~specstrat.errors.InvalidConfig`. On CUDA those reads would be host syncs, so the fused
path skips them unless the caller passes ``validate=True``. Nothing is written when a check
fails.

This module holds the launchers; the types live in ``_verify_buffers`` and ``_paging``, the
kernel and its twin in ``_verify_kernel``, the shared setup in ``_verify_inputs`` and the input
checks in ``_verify_checks``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int, index_tensor
from specstrat.kernels._paging import Paging as Paging
from specstrat.kernels._triton import Backend, cdiv, launch, resolve_backend
from specstrat.kernels._verify_buffers import PAD_PAGE as PAD_PAGE
from specstrat.kernels._verify_buffers import PAD_SEQ_LEN as PAD_SEQ_LEN
from specstrat.kernels._verify_buffers import VerifyMetadata as VerifyMetadata
from specstrat.kernels._verify_buffers import VerifyMetadataBuffers as VerifyMetadataBuffers
from specstrat.kernels._verify_checks import (
    bucket_tokens,
    check_bucket,
    ragged_bounds,
    ragged_mirrors,
    uniform_tokens,
)
from specstrat.kernels._verify_inputs import Batch, check_batch
from specstrat.kernels._verify_kernel import (
    _BLOCK_PAGES,
    _BLOCK_ROWS,
    _verify_metadata_kernel,
    bucket_token_counts_ref,
)
from specstrat.kernels._verify_kernel import verify_metadata_ref as verify_metadata_ref

__all__ = [
    "PAD_PAGE",
    "PAD_SEQ_LEN",
    "Paging",
    "VerifyMetadata",
    "VerifyMetadataBuffers",
    "build_ragged_verify_metadata",
    "build_ragged_verify_metadata_into",
    "build_verify_metadata",
    "build_verify_metadata_into",
    "verify_metadata_ref",
]


def _run(
    batch: Batch,
    tokens: int | torch.Tensor,
    out: VerifyMetadataBuffers,
    backend: Backend,
    padded_tokens: int | None = None,
) -> None:
    """Dispatch one metadata build to the Triton kernel or the twin (``padded_tokens``: the
    bucketed ragged form)."""
    seq_lens, paging = batch.seq_lens, batch.paging
    if resolve_backend(backend, *batch.tensors, out.cache_seqlens) == "torch":
        verify_metadata_ref(seq_lens, tokens, out, paging, padded_tokens)
        return
    rpi = paging.req_pool_indices if paging is not None else seq_lens
    rtt = paging.req_to_token if paging is not None else seq_lens
    launch(
        _verify_metadata_kernel,
        (max(1, cdiv(out.padded_bs, _BLOCK_ROWS)),),
        seq_lens,
        tokens if isinstance(tokens, torch.Tensor) else seq_lens,
        rpi,
        rtt,
        out.cu_seqlens_q,
        out.cache_seqlens,
        out.cu_seqlens_k,
        out.page_table if out.page_table is not None else out.cache_seqlens,
        seq_lens.shape[0],
        out.padded_bs,
        0 if isinstance(tokens, torch.Tensor) else tokens,
        padded_tokens or 0,
        rtt.shape[1] if paging is not None else 0,
        out.page_table.shape[1] if out.page_table is not None else 0,
        batch.page_size,
        RAGGED=isinstance(tokens, torch.Tensor),
        BUCKETED=padded_tokens is not None,
        HAS_PAGES=out.page_table is not None,
        BLOCK_ROWS=_BLOCK_ROWS,
        BLOCK_PAGES=_BLOCK_PAGES,
    )


def _static(buffers: object) -> VerifyMetadataBuffers:
    """The in-place forms' buffers, refused unless they are :class:`VerifyMetadataBuffers`."""
    if not isinstance(buffers, VerifyMetadataBuffers):
        raise InvalidConfig(
            f"buffers={type(buffers).__name__}; pass VerifyMetadataBuffers.allocate(padded_bs, ...)"
        )
    return buffers


def _token_counts(batch: Batch, num_tokens_per_req: object) -> torch.Tensor:
    """The ragged forms' per-request token counts: one per request, on the batch's device."""
    device = batch.seq_lens.device
    return index_tensor(
        "num_tokens_per_req", num_tokens_per_req, ndim=1, device=device, rows=batch.bs
    )


def build_verify_metadata(
    seq_lens: torch.Tensor,
    *,
    num_tokens: int,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Uniform TARGET_VERIFY metadata for ``bs = len(seq_lens)`` requests of ``num_tokens // bs``.

    ``num_tokens`` is the batch's *total* query tokens and keyword-only, so it is never passed
    where the graph form's per-request ``tokens_per_req`` belongs, or the other way round.

    ``num_tokens % bs != 0`` is an :class:`~specstrat.errors.InvalidConfig` (never a silent
    floor); ``bs == 0`` needs ``num_tokens == 0`` and gives empty, well-formed metadata. With
    ``paging`` the page table is built too, ``paging.max_pages`` columns wide. ``paging``,
    ``seq_lens_cpu``, ``backend`` and ``validate`` are those of every builder (see the module
    docstring, with the value checks).
    """
    batch = check_batch(seq_lens, paging)
    tokens = uniform_tokens(num_tokens, batch.bs)
    batch.check_query_total(tokens)
    read = batch.reads_values(validate)
    if read:
        batch.check_values(tokens)
    max_k = batch.max_seq_len_k(seq_lens_cpu, tokens, read=read)
    out = batch.allocate()
    _run(batch, tokens, out, backend)
    return batch.metadata(out, tokens, tokens, max_k)


def build_verify_metadata_into(
    buffers: VerifyMetadataBuffers,
    seq_lens: torch.Tensor,
    *,
    tokens_per_req: int,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Graph form: write uniform metadata for ``len(seq_lens) <= buffers.padded_bs`` in place.

    ``tokens_per_req`` (keyword-only, see :func:`build_verify_metadata`) is ``T`` per request, from
    the algorithm's :class:`~specstrat.protocols.TargetVerifyPolicy`. Rows past the real batch
    are padding (see the module docstring). ``buffers`` hold a page table exactly when
    ``paging`` is given; the value checks also check that it has a column for every page a row
    uses. On the Triton path this is one launch, no allocation, no host sync.
    """
    buffers = _static(buffers)
    batch = check_batch(seq_lens, paging, buffers)
    tokens = host_int("tokens_per_req", tokens_per_req, minimum=1)
    batch.check_query_total(tokens)
    read = batch.reads_values(validate)
    if read:
        batch.check_values(tokens)
    max_k = batch.max_seq_len_k(seq_lens_cpu, tokens, read=read)
    _run(batch, tokens, buffers, backend)
    return batch.metadata(buffers, tokens, tokens, max_k)


def build_ragged_verify_metadata(
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    *,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    num_tokens_per_req_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Ragged form: request ``i`` verifies ``num_tokens_per_req[i] >= 1`` tokens.

    ``cu_seqlens_q`` is the exclusive prefix sum of ``num_tokens_per_req`` (on the device, in the
    same single launch). The counts are value-checked with the rest (see the module docstring).
    The host bounds need the mirrors: ``max_seq_len_q`` ``num_tokens_per_req_cpu``,
    ``max_seq_len_k`` both.
    """
    batch = check_batch(seq_lens, paging)
    ntok = _token_counts(batch, num_tokens_per_req)
    read = batch.reads_values(validate, ntok)
    if read:
        batch.check_values(ntok)
    mirrors = ragged_mirrors(seq_lens_cpu, num_tokens_per_req_cpu, batch.seq_lens, ntok, read=read)
    out = batch.allocate()
    _run(batch, ntok, out, backend)
    return batch.metadata(out, None, *ragged_bounds(*mirrors))


def build_ragged_verify_metadata_into(
    buffers: VerifyMetadataBuffers,
    seq_lens: torch.Tensor,
    num_tokens_per_req: torch.Tensor,
    *,
    padded_tokens: int,
    paging: Paging | None = None,
    seq_lens_cpu: Sequence[int] | torch.Tensor | None = None,
    num_tokens_per_req_cpu: Sequence[int] | torch.Tensor | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> VerifyMetadata:
    """Bucketed ragged form: ragged metadata written in place into a token bucket.

    The buffers hold ``padded_bs`` rows for ``padded_tokens`` query tokens (a captured graph's
    shape). Rows ``0..bs`` are the real requests with their token counts
    ``num_tokens_per_req[i] >= 1``, exactly as :func:`build_ragged_verify_metadata` writes them. The
    ``leftover = padded_tokens - sum(num_tokens_per_req)`` tokens are spread over the
    ``padded_bs - bs`` padding rows as SGLang 0.5.23's ``padded_to_bucket`` does:
    ``base = leftover // (padded_bs - bs)`` tokens each, plus one for the first
    ``leftover % (padded_bs - bs)`` padding rows, so a padding row may get 0 tokens and
    ``cu_seqlens_q[-1] == padded_tokens``. Padding rows are harmless as in the graph form: length
    :data:`PAD_SEQ_LEN`, ``cache_seqlens`` = their token count, every page :data:`PAD_PAGE`.

    Refused with :class:`~specstrat.errors.InvalidConfig`: ``padded_tokens < bs``,
    ``bs > padded_bs``, real token counts summing past ``padded_tokens``, and leftover tokens with
    no padding row (``padded_bs == bs``; SGLang would widen the last real row). The last two read
    the counts, so they run on the host mirror ``num_tokens_per_req_cpu`` when given, on CPU
    tensors, and on CUDA only with ``validate=True``; unchecked on CUDA, the kernel follows SGLang's
    rule. The other value checks are those of :func:`build_verify_metadata_into`. The Triton path is
    one launch, no allocation, no host sync. ``max_seq_len_q``/``max_seq_len_k`` cover every row,
    padding included, and need the mirrors (``max_seq_len_q``: ``num_tokens_per_req_cpu``;
    ``max_seq_len_k``: both).
    """
    buffers = _static(buffers)
    batch = check_batch(seq_lens, paging, buffers)
    ntok = _token_counts(batch, num_tokens_per_req)
    total = bucket_tokens(padded_tokens, batch.bs, batch.padded_bs)
    read = batch.reads_values(validate, ntok)
    if read:
        batch.check_values(ntok, total)
    seq_mirror, tok_mirror = ragged_mirrors(
        seq_lens_cpu, num_tokens_per_req_cpu, batch.seq_lens, ntok, read=read
    )
    if tok_mirror is not None:
        real, name = int(tok_mirror.sum()), "num_tokens_per_req_cpu"
        check_bucket(real, name, bs=batch.bs, padded_bs=batch.padded_bs, padded_tokens=total)
        tok_mirror = bucket_token_counts_ref(tok_mirror, batch.padded_bs, total)
    _run(batch, ntok, buffers, backend, total)
    return batch.metadata(buffers, None, *ragged_bounds(seq_mirror, tok_mirror))
