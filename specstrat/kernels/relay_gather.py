"""Relay gather: every relay buffer gathered by slot index in one launch, and its torch twin.

``gather_relay(source, index)`` returns, for each present field of ``source`` (a
:class:`~specstrat.relay.RelayPayload` whose rows are relay rows, e.g. the slot-indexed buffers of
a FutureMap), ``field.index_select(0, index)``, bit for bit, in a single kernel launch whatever
subset of bonus tokens, seq lens, topk_p, topk_index and hidden states is present. Empty and
duplicate indices are fine.

Indices are checked against the buffers' rows when they are on the CPU. On a GPU that check
would be a host sync, so it runs only with ``validate=True``; otherwise the kernel reads an
out-of-range index as row 0, the padding row every relay keeps, rather than reading past the
buffer.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import index_tensor, reads_values
from specstrat.kernels._triton import Backend, cdiv, jit, launch, resolve_backend, tl
from specstrat.relay import RELAY_FIELDS, RelayPayload

__all__ = ["gather_relay", "gather_relay_ref"]

# 64 rows x 128 columns per step keeps the hidden-state copy vectorised; not yet swept on a GPU.
_BLOCK_ROWS: Final = 64
_BLOCK_COLS: Final = 128


@jit
def _gather_rows(  # type: ignore[no-untyped-def]
    src_ptr, dst_ptr, idx, rows, row_mask, width, BLOCK_COLS: tl.constexpr
):
    # Copies row idx[i] of a contiguous [*, width] source to row rows[i] of the destination.
    for c0 in range(0, width, BLOCK_COLS):
        cols = c0 + tl.arange(0, BLOCK_COLS)
        mask = row_mask[:, None] & (cols[None, :] < width)
        vals = tl.load(src_ptr + idx[:, None] * width + cols[None, :], mask=mask)
        tl.store(dst_ptr + rows[:, None] * width + cols[None, :], vals, mask=mask)


@jit
def _relay_gather_kernel(  # type: ignore[no-untyped-def]
    index_ptr,
    n,
    source_rows,
    bonus_src,
    bonus_dst,
    seq_src,
    seq_dst,
    topk_p_src,
    topk_p_dst,
    topk_index_src,
    topk_index_dst,
    hidden_src,
    hidden_dst,
    topk_p_width,
    topk_index_width,
    hidden_width,
    HAS_BONUS: tl.constexpr,
    HAS_SEQ: tl.constexpr,
    HAS_TOPK_P: tl.constexpr,
    HAS_TOPK_INDEX: tl.constexpr,
    HAS_HIDDEN: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows < n
    idx = tl.load(index_ptr + rows, mask=live, other=0).to(tl.int64)
    idx = tl.where((idx >= 0) & (idx < source_rows), idx, 0)  # out of range -> padding row 0
    if HAS_BONUS:
        tl.store(bonus_dst + rows, tl.load(bonus_src + idx, mask=live), mask=live)
    if HAS_SEQ:
        tl.store(seq_dst + rows, tl.load(seq_src + idx, mask=live), mask=live)
    if HAS_TOPK_P:
        _gather_rows(topk_p_src, topk_p_dst, idx, rows, live, topk_p_width, BLOCK_COLS)
    if HAS_TOPK_INDEX:
        _gather_rows(topk_index_src, topk_index_dst, idx, rows, live, topk_index_width, BLOCK_COLS)
    if HAS_HIDDEN:
        _gather_rows(hidden_src, hidden_dst, idx, rows, live, hidden_width, BLOCK_COLS)


def gather_relay_ref(source: RelayPayload, index: torch.Tensor) -> RelayPayload:
    """Torch twin: ``index_select`` of every present field (the oracle the kernel must match)."""
    return RelayPayload(**{name: t.index_select(0, index) for name, t in source.present().items()})


def _check_out(source: RelayPayload, out: RelayPayload, n: int) -> None:
    src, dst = source.present(), out.present()
    if src.keys() != dst.keys():
        raise InvalidConfig(
            f"out has fields {sorted(dst)} but source has {sorted(src)}; "
            "give out exactly the source's fields"
        )
    for name, s in src.items():
        d = dst[name]
        want = (n, *s.shape[1:])
        if d.dtype != s.dtype or tuple(d.shape) != want or d.device != s.device:
            raise InvalidConfig(
                f"out.{name} is {d.dtype} {tuple(d.shape)} on {d.device}; it must be "
                f"{s.dtype} {want} on {s.device}"
            )
        if not d.is_contiguous():
            raise InvalidConfig(f"out.{name} is not contiguous; pass a contiguous buffer")


def gather_relay(
    source: RelayPayload,
    index: torch.Tensor,
    *,
    out: RelayPayload | None = None,
    backend: Backend = "auto",
    validate: bool = False,
) -> RelayPayload:
    """Rows ``index`` of every present field of ``source``, into fresh tensors or ``out``.

    ``index`` is a 1-D int32/int64 tensor on the source's device. Returns ``out`` when given
    (its fields must match the source's: same set, dtypes, widths, ``len(index)`` rows).
    An index outside the source's rows is an ``InvalidConfig`` on the CPU, and on CUDA with
    ``validate=True`` (a host sync, so the default reads it as padding row 0 instead).
    """
    if not isinstance(source, RelayPayload):
        raise InvalidConfig(f"source={type(source).__name__}; pass a RelayPayload")
    fields = source.present()
    device = next(iter(fields.values())).device if fields else None
    index = index_tensor("index", index, ndim=1, device=device)
    n, source_rows = index.shape[0], source.num_rows
    for name, tensor in fields.items():
        if not tensor.is_contiguous():
            raise InvalidConfig(f"source.{name} is not contiguous; relay buffers must be")
    # Reading the index is free on the CPU; on CUDA it is a host sync, so only on opt-in.
    if reads_values(validate, index) and n and fields:
        lo, hi = int(index.min()), int(index.max())
        if lo < 0 or hi >= source_rows:
            raise InvalidConfig(
                f"index range {lo}..{hi} is outside the source's {source_rows} rows; "
                f"every index must lie in 0..{source_rows - 1}"
            )
    if out is not None:
        _check_out(source, out, n)
    if not fields:
        return out if out is not None else RelayPayload()
    if resolve_backend(backend, index) == "torch":
        result = gather_relay_ref(source, index)
        if out is None:
            return result
        for name, tensor in result.present().items():
            getattr(out, name).copy_(tensor)
        return out
    if out is None:
        out = RelayPayload(**{name: t.new_empty((n, *t.shape[1:])) for name, t in fields.items()})
    if n == 0:
        return out
    dst = out.present()
    args: list[Any] = [index, n, source_rows]
    for name in RELAY_FIELDS:  # absent fields get a placeholder pointer the kernel never reads
        args += [fields.get(name, index), dst.get(name, index)]
    args += [
        t.shape[1] if t is not None else 0
        for t in (source.topk_p, source.topk_index, source.hidden_states)
    ]
    launch(
        _relay_gather_kernel,
        (cdiv(n, _BLOCK_ROWS),),
        *args,
        HAS_BONUS="bonus_tokens" in fields,
        HAS_SEQ="seq_lens" in fields,
        HAS_TOPK_P="topk_p" in fields,
        HAS_TOPK_INDEX="topk_index" in fields,
        HAS_HIDDEN="hidden_states" in fields,
        BLOCK_ROWS=_BLOCK_ROWS,
        BLOCK_COLS=_BLOCK_COLS,
    )
    return out
