"""The fused TARGET_VERIFY metadata kernel and its torch twin, which compute the same outputs.

The launchers in :mod:`specstrat.kernels.verify_metadata` validate the inputs and pick the path;
these two only compute.
"""

from __future__ import annotations

from typing import Final

import torch
import torch.nn.functional as F

from specstrat.kernels._paging import Paging
from specstrat.kernels._triton import jit, tl
from specstrat.kernels._verify_buffers import PAD_PAGE, PAD_SEQ_LEN, VerifyMetadataBuffers

__all__ = ["bucket_token_counts_ref", "verify_metadata_ref"]

# One program covers 128 rows: decode batches of <=128 need a single program and no prefix loop.
# Not yet swept on a GPU (no device was lent to the session that wrote this).
_BLOCK_ROWS: Final = 128
_BLOCK_PAGES: Final = 64


@jit
def _bucket_tokens(tok, rows, bs, padded_bs, leftover):  # type: ignore[no-untyped-def]
    """Token counts of ``rows`` in a bucket: real rows keep ``tok``; the ``leftover`` tokens go to
    the padding rows, ``base + 1`` to the first ``rem`` of them and ``base`` to the rest (0 when
    ``leftover`` is smaller than the number of padding rows); with no padding row the last real row
    takes them (SGLang's rule; the launchers refuse that case wherever they can check)."""
    # A tensor even where Triton specialises padded_bs or bs (== 1) to a constexpr.
    num_pad = tl.zeros((), dtype=tl.int64) + padded_bs - bs
    safe = tl.maximum(num_pad, 1)
    base = leftover // safe
    rem = leftover - base * safe
    pad = base + tl.where(rows - bs < rem, 1, 0).to(tl.int64)
    tok = tl.where((rows >= bs) & (rows < padded_bs), pad, tok)
    return tok + tl.where((rows == bs - 1) & (num_pad == 0), leftover, 0)


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
    padded_tokens,
    req_to_token_width,
    max_pages,
    page_size,
    RAGGED: tl.constexpr,
    BUCKETED: tl.constexpr,
    HAS_PAGES: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row0 = pid * BLOCK_ROWS
    # Bucketed ragged form: the tokens the real rows leave in the bucket, split over padding rows
    # as SGLang's PaddedToBucket does (see _bucket_tokens). Every program sums all real counts:
    # O(bs) per program, like the carry loop below, and still one launch.
    leftover = tl.zeros((), dtype=tl.int64)
    if BUCKETED:
        real_sum = tl.zeros((), dtype=tl.int64)
        for start in range(0, bs, BLOCK_ROWS):
            real_rows = start + tl.arange(0, BLOCK_ROWS)
            counts = tl.load(tokens_ptr + real_rows, mask=real_rows < bs, other=0)
            real_sum += tl.sum(counts.to(tl.int64), axis=0)
        leftover = tl.maximum(padded_tokens - real_sum, 0)
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
            if BUCKETED:
                prev_tok = _bucket_tokens(  # type: ignore[no-untyped-call]
                    prev_tok, prev, bs, padded_bs, leftover
                )
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
        if BUCKETED:
            tok = _bucket_tokens(  # type: ignore[no-untyped-call]
                tok, rows, bs, padded_bs, leftover
            )
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


def bucket_token_counts_ref(
    num_tokens_per_req: torch.Tensor, padded_bs: int, padded_tokens: int
) -> torch.Tensor:
    """Per-row token counts of a token bucket, ``[padded_bs]`` int64, on the counts' device, no
    host read.

    SGLang 0.5.23's ``PaddedToBucket`` rule (full-coverage variant): real rows keep
    ``num_tokens_per_req``; ``leftover = padded_tokens - sum(num_tokens_per_req)`` (0 if negative)
    is split over the ``padded_bs - bs`` padding rows as ``base = leftover // num_pad`` each plus
    one more for the first ``leftover % num_pad`` of them, so a padding row gets 0 when
    ``leftover < num_pad``. With no padding row the last real row takes the leftover (the launchers
    refuse that case wherever they can read the counts).
    """
    bs = num_tokens_per_req.shape[0]
    tok = num_tokens_per_req.to(torch.int64)
    # Reads every real count (one reduction on the device); leftover stays a 0-d device tensor.
    leftover = (padded_tokens - tok.sum()).clamp(min=0)
    num_pad = padded_bs - bs
    if num_pad == 0:
        if bs == 0:
            return tok
        return torch.cat([tok[:-1], tok[-1:] + leftover])
    base = leftover // num_pad
    extra = torch.arange(num_pad, device=tok.device) < leftover - base * num_pad
    return torch.cat([tok, base + extra.to(torch.int64)])


def verify_metadata_ref(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    out: VerifyMetadataBuffers,
    paging: Paging | None = None,
    padded_tokens: int | None = None,
) -> None:
    """Torch twin of the kernel: writes the metadata for ``seq_lens`` into ``out``.

    ``tokens`` is ``T`` (an int: uniform and graph forms) or per-request counts (a tensor: ragged
    form, where ``out.padded_bs == bs`` unless ``padded_tokens`` is given: then the bucketed ragged
    form, whose padding rows share the bucket's leftover tokens as :func:`bucket_token_counts_ref`
    says). With ``paging`` (and ``out.page_table``) the page table is written too. The launchers
    validate; this only computes.
    """
    bs, padded_bs = seq_lens.shape[0], out.padded_bs
    dev = seq_lens.device
    # Per-row query tokens: the real rows' counts, then T (graph) or the bucket's share
    # (bucketed ragged) for each padding row.
    if isinstance(tokens, int):
        tok = torch.full((padded_bs,), tokens, dtype=torch.int64, device=dev)
    elif padded_tokens is not None:
        tok = bucket_token_counts_ref(tokens, padded_bs, padded_tokens)
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
    if out.page_table is None or paging is None:
        return
    # Reads the first KV index of each used page from the request's row of req_to_token.
    req_to_token, page_size = paging.req_to_token, paging.page_size
    width = req_to_token.shape[1]
    pages = torch.arange(out.page_table.shape[1], device=dev)
    token_pos = pages * page_size
    num_pages = (cache[:bs] + page_size - 1) // page_size
    used = (pages[None, :] < num_pages[:, None]) & (token_pos[None, :] < width)
    pool_rows = paging.req_pool_indices.long()[:, None]
    rows = req_to_token[pool_rows, token_pos.clamp(max=width - 1)[None, :]]
    page_ids = rows if page_size == 1 else rows // page_size
    out.page_table[:bs].copy_(torch.where(used, page_ids, PAD_PAGE))
    out.page_table[bs:].fill_(PAD_PAGE)
