"""Attention for a draft head that keeps its own KV cache: rotary positions and one softmax over
a context of cached keys plus, per query, the keys of its own draft path.

A head drafting ``d_1, d_2, ..`` after a committed context attends, at draft ``i``, to every
cached row of the context and to the rows of ``d_1 .. d_i`` on its own path (EAGLE-3's
"training-time test" attention): the context part is one masked matrix product shared by all
of a request's queries, the path part a per-query dot product, and both share one softmax.
"""

from __future__ import annotations

import torch

__all__ = ["attend", "rope"]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """``x [B, T, heads, d]`` rotated by ``positions [B, T]`` (rotate-half form, as Llama)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.to(device=x.device, dtype=torch.float32)[:, :, None, None] * inv
    angles = torch.cat([angles, angles], -1)  # [B, T, 1, d]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * angles.cos().to(x.dtype) + half * angles.sin().to(x.dtype)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    path_k: torch.Tensor | None = None,
    path_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention output ``[B, T, heads * d]`` of queries ``q [B, T, heads, d]`` over context
    keys and values ``k, v [B, L, kv_heads, d]`` where ``mask [B, T, L]`` is true, and over each
    query's own path ``path_k, path_v [B, T, E, kv_heads, d]`` (all of it). Every query must
    see at least one key (a row with none would be NaN). Grouped queries share their key and
    value head without copies of it (query head ``j`` reads key head ``j // group``)."""
    b, t, heads, d = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(b, t, kv_heads, heads // kv_heads, d)
    scores = torch.einsum("btkgd,blkd->bkgtl", grouped, k) * d**-0.5
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    if path_k is None or path_v is None or path_k.shape[2] == 0:
        out = torch.einsum("bkgtl,blkd->btkgd", scores.softmax(-1), v)
    else:
        own = torch.einsum("btkgd,btekd->bkgte", grouped, path_k) * d**-0.5
        probs = torch.cat([scores, own], dim=-1).softmax(-1)
        length = k.shape[1]
        out = torch.einsum("bkgtl,blkd->btkgd", probs[..., :length], v)
        out = out + torch.einsum("bkgte,btekd->btkgd", probs[..., length:], path_v)
    merged: torch.Tensor = out.reshape(b, t, heads * d)
    return merged
