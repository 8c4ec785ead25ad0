"""Launcher-side checks of the TARGET_VERIFY metadata inputs; each message names the value and
the fix.

Two kinds. Shape, dtype and host-int checks never read tensor data and always run. Value checks
(negative lengths, int32 overflow of every output, a ``req_to_token`` or page table too narrow for
a row, indices outside the pool, a CPU mirror that disagrees with the device lengths) read the
tensors: on the CPU that is free, so they always run; on CUDA every read is a host sync that the
fused path exists to avoid, so they run there only when the caller passes ``validate=True``.
Every value check is a vectorised torch reduction; only its verdict (and, on failure, the first
offending entry) comes back to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import torch
import torch.nn.functional as F

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int
from specstrat.kernels._paging import Paging
from specstrat.kernels._triton import cdiv
from specstrat.kernels._verify_buffers import PAD_SEQ_LEN

__all__ = [
    "INT32_MAX",
    "bucket_tokens",
    "check_bucket",
    "check_total",
    "check_values",
    "first_true",
    "host_mirror",
    "max_k_bound",
    "ragged_bounds",
    "ragged_mirrors",
    "uniform_tokens",
]

#: Largest value an int32 output holds; past it the kernel's store would wrap.
INT32_MAX: Final = 2**31 - 1


def uniform_tokens(num_tokens: int, bs: int) -> int:
    """``T = num_tokens // bs``, refusing a remainder, 0 tokens for a real batch, or bs=0 tokens."""
    num_tokens = host_int("num_tokens", num_tokens, minimum=0)
    if bs == 0:
        if num_tokens != 0:
            raise InvalidConfig(f"num_tokens={num_tokens} with bs=0; an empty batch has 0 tokens")
        return 0
    if num_tokens % bs != 0:
        raise InvalidConfig(
            f"num_tokens={num_tokens} is not a multiple of bs={bs}; "
            "pass bs * tokens_per_req tokens (use the ragged form for per-request token counts)"
        )
    if num_tokens == 0:
        raise InvalidConfig(
            f"num_tokens=0 with bs={bs}; TARGET_VERIFY needs >= 1 token per request"
        )
    return num_tokens // bs


def bucket_tokens(padded_tokens: int, bs: int, padded_bs: int) -> int:
    """The bucket's token count, refusing what needs no tensor read: fewer tokens than real rows
    (each verifies >= 1), or tokens past the int32 prefix sum."""
    padded_tokens = host_int("padded_tokens", padded_tokens, minimum=0)
    if padded_tokens < bs:
        raise InvalidConfig(
            f"padded_tokens={padded_tokens} is less than bs={bs}; every real row verifies >= 1 "
            "token, so pick a token bucket >= sum(num_tokens_per_req)"
        )
    check_total("cu_seqlens_q", padded_tokens, "query tokens of the bucket")
    if bs == 0:  # no token counts to read: the real tokens are known to be 0
        check_bucket(
            0, "num_tokens_per_req", bs=0, padded_bs=padded_bs, padded_tokens=padded_tokens
        )
    return padded_tokens


def check_bucket(real: int, source: str, *, bs: int, padded_bs: int, padded_tokens: int) -> None:
    """``real`` tokens (the sum of ``source``) fit the bucket, and any leftover has a padding
    row to go to (SGLang would widen the last real row instead; here real rows keep their
    token counts)."""
    if real > padded_tokens:
        raise InvalidConfig(
            f"{source} sums to {real} tokens, more than padded_tokens={padded_tokens}; "
            f"pick the smallest token bucket >= {real}"
        )
    if padded_bs == bs and real < padded_tokens:
        raise InvalidConfig(
            f"padded_tokens={padded_tokens} leaves {padded_tokens - real} tokens past the {real} "
            f"real ones but padded_bs=bs={bs} has no padding row to take them; use buffers with "
            f"padded_bs > bs, or padded_tokens={real}"
        )


def first_true(mask: torch.Tensor) -> int | None:
    """Flat index of the first ``True`` in ``mask``, or ``None`` (one host read, two on failure)."""
    if not bool(mask.any()):
        return None
    return int(mask.reshape(-1).to(torch.int32).argmax())


def check_total(name: str, total: int, what: str) -> None:
    """The last entry of an int32 prefix sum must fit int32 (all its terms are >= 0)."""
    if total > INT32_MAX:
        raise InvalidConfig(
            f"{name}[-1]={total} ({what}) exceeds the int32 max {INT32_MAX}; "
            "split the batch so the sum fits int32"
        )


def check_values(
    seq_lens: torch.Tensor,
    tokens: int | torch.Tensor,
    *,
    padded_bs: int,
    paging: Paging | None,
    page_cols: int | None,
    padded_tokens: int | None = None,
) -> None:
    """Value checks of one build; the caller has settled (with ``reads_values``) that they may run.

    ``tokens`` is ``T`` (uniform/graph) or per-request counts (ragged); ``padded_bs - bs`` padding
    rows each add ``T`` tokens, or share what the real rows leave of ``padded_tokens`` (bucketed
    ragged). ``page_cols`` is the width of the page table being written.
    """
    bs = seq_lens.shape[0]
    seq = seq_lens.to(torch.int64)
    if (i := first_true(seq < 0)) is not None:
        raise InvalidConfig(f"seq_lens[{i}]={int(seq[i])} is negative; sequence lengths are >= 0")
    if isinstance(tokens, torch.Tensor):
        tok = tokens.to(torch.int64)
        if (i := first_true(tok < 1)) is not None:
            raise InvalidConfig(
                f"num_tokens_per_req[{i}]={int(tok[i])} is < 1; every request verifies >= 1 token"
            )
        pad_tokens = 0
    else:
        tok = torch.full_like(seq, tokens)
        pad_tokens = (padded_bs - bs) * tokens
    # seq >= 0 and tok >= 1 here, so INT32_MAX - tok cannot wrap even for int64 inputs.
    if (i := first_true(seq > INT32_MAX - tok)) is not None:
        raise InvalidConfig(
            f"cache_seqlens[{i}]=seq_lens[{i}] + tokens={int(seq[i]) + int(tok[i])} exceeds the "
            f"int32 max {INT32_MAX}; sequences that long do not fit int32 metadata"
        )
    total_q = int(tok.sum()) + pad_tokens
    if padded_tokens is not None:
        source = "num_tokens_per_req"
        check_bucket(total_q, source, bs=bs, padded_bs=padded_bs, padded_tokens=padded_tokens)
        total_q = padded_tokens
    cache = seq + tok
    check_total("cu_seqlens_q", total_q, "query tokens of the batch")
    check_total("cu_seqlens_k", int(seq.sum()) + total_q, "sum of cache_seqlens")
    if paging is not None and bs:
        _check_pages(cache, paging, page_cols)


def _check_pages(cache: torch.Tensor, paging: Paging, page_cols: int | None) -> None:
    """Pool indices in range, every row's tokens inside req_to_token and the page table, and
    page ids that fit int32."""
    rpi, rtt, size = paging.req_pool_indices, paging.req_to_token, paging.page_size
    pool, width = rtt.shape
    if first_true((rpi < 0) | (rpi >= pool)) is not None:
        lo, hi = int(rpi.min()), int(rpi.max())
        raise InvalidConfig(
            f"req_pool_indices range {lo}..{hi} is outside req_to_token's {pool} rows; "
            f"every index must lie in 0..{pool - 1}"
        )
    # A row past req_to_token's width (or the page table's) would get PAD_PAGE for its tail.
    if (i := first_true(cache > width)) is not None:
        c = int(cache[i])
        raise InvalidConfig(
            f"cache_seqlens[{i}]={c} (seq_lens + tokens) needs {c} KV indices "
            f"({cdiv(c, size)} pages of page_size={size}) but req_to_token.shape[1]={width}; "
            f"widen req_to_token to >= {int(cache.max())} columns"
        )
    num_pages = (cache + size - 1) // size
    if page_cols is not None and (i := first_true(num_pages > page_cols)) is not None:
        raise InvalidConfig(
            f"row {i} needs {int(num_pages[i])} pages (cache_seqlens[{i}]={int(cache[i])}, "
            f"page_size={size}) but buffers.page_table has {page_cols} columns; allocate the "
            f"buffers with max_pages >= {int(num_pages.max())}"
        )
    if rtt.dtype != torch.int64:
        return  # an int32 KV index // page_size always fits int32
    # Reads the first KV index of each page a row uses, as the kernel does.
    pages = torch.arange(int(num_pages.max()), device=rtt.device)
    used = pages[None, :] < num_pages[:, None]
    indices = rtt[rpi.long()[:, None], (pages * size)[None, :]]
    if (flat := first_true(used & (indices // size > INT32_MAX))) is not None:
        row, page = divmod(flat, pages.shape[0])
        index = int(indices[row, page])
        raise InvalidConfig(
            f"req_to_token[{int(rpi[row])}, {page * size}]={index} gives page id {index // size}, "
            f"past the int32 max {INT32_MAX}; KV indices must be < {(INT32_MAX + 1) * size}"
        )


def host_mirror(
    name: str,
    mirror: Sequence[int] | torch.Tensor,
    bs: int,
    *,
    minimum: int,
    device_twin: torch.Tensor | None,
) -> torch.Tensor:
    """A host mirror as an int64 CPU tensor, checked: ``bs`` entries, each ``>= minimum``.

    The mirror is host data, so those checks always run. ``device_twin`` is the tensor it mirrors,
    passed only when ``reads_values`` allows reading it; the two must then agree entry by entry.
    """
    if isinstance(mirror, torch.Tensor):
        if mirror.device.type != "cpu":
            raise InvalidConfig(
                f"{name}.device={mirror.device}; the mirror must live on the CPU (reading a "
                "device tensor here would be a host sync)"
            )
        values = mirror.reshape(-1).to(torch.int64)
    else:
        values = torch.as_tensor(mirror, dtype=torch.int64).reshape(-1)
    if values.shape[0] != bs:
        raise InvalidConfig(f"{name} has {values.shape[0]} entries; expected bs={bs}")
    if (i := first_true(values < minimum)) is not None:
        raise InvalidConfig(f"{name}[{i}]={int(values[i])} must be >= {minimum}")
    if device_twin is not None:
        twin = device_twin.to(torch.int64)
        if (i := first_true(values.to(twin.device) != twin)) is not None:
            source = name.removesuffix("_cpu")
            raise InvalidConfig(
                f"{name}[{i}]={int(values[i])} but {source}[{i}]={int(twin[i])}; the CPU mirror "
                f"must be a copy of {source} taken at this step"
            )
    return values


def ragged_mirrors(
    seq_lens_cpu: Sequence[int] | torch.Tensor | None,
    num_tokens_per_req_cpu: Sequence[int] | torch.Tensor | None,
    seq_lens: torch.Tensor,
    ntok: torch.Tensor,
    *,
    read: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The ragged forms' host mirrors, checked (against the device tensors when ``read``)."""
    bs = seq_lens.shape[0]
    seq_mirror = tok_mirror = None
    if seq_lens_cpu is not None:
        twin = seq_lens if read else None
        seq_mirror = host_mirror("seq_lens_cpu", seq_lens_cpu, bs, minimum=0, device_twin=twin)
    if num_tokens_per_req_cpu is not None:
        twin = ntok if read else None
        name = "num_tokens_per_req_cpu"
        tok_mirror = host_mirror(name, num_tokens_per_req_cpu, bs, minimum=1, device_twin=twin)
    return seq_mirror, tok_mirror


def ragged_bounds(
    seq_mirror: torch.Tensor | None, tok_mirror: torch.Tensor | None
) -> tuple[int | None, int | None]:
    """``max_seq_len_q`` and ``max_seq_len_k`` over every row of the mirrors (``None`` without
    the mirrors they need); the mirrors are CPU tensors, so this reads nothing from a device."""
    if tok_mirror is None:
        return None, None
    rows = tok_mirror.shape[0]
    max_q = int(tok_mirror.max()) if rows else 0
    if seq_mirror is None:
        return max_q, None
    if seq_mirror.shape[0] < rows:  # bucketed: padding rows stand for PAD_SEQ_LEN
        seq_mirror = F.pad(seq_mirror, (0, rows - seq_mirror.shape[0]), value=PAD_SEQ_LEN)
    return max_q, int((seq_mirror + tok_mirror).max()) if rows else 0


def max_k_bound(
    seq_lens_cpu: Sequence[int] | torch.Tensor | None,
    device_twin: torch.Tensor | None,
    bs: int,
    tokens: int,
) -> int | None:
    """The host bound on keys per request, from the CPU mirror (checked against the device
    lengths when those are read); ``None`` without a mirror."""
    if seq_lens_cpu is None:
        return None
    mirror = host_mirror("seq_lens_cpu", seq_lens_cpu, bs, minimum=0, device_twin=device_twin)
    return (int(mirror.max()) if bs else 0) + tokens
