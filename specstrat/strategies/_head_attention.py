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
    see at least one key (a row with none would be NaN)."""
    b, t, heads, d = q.shape
    group = heads // k.shape[2]
    scale = d**-0.5
    qh = q.transpose(1, 2)  # [B, h, T, d]
    kh = k.repeat_interleave(group, dim=2).transpose(1, 2)  # [B, h, L, d]
    vh = v.repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # [B, h, T, L]
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    if path_k is None or path_v is None or path_k.shape[2] == 0:
        out = scores.softmax(-1) @ vh
    else:
        pk = path_k.repeat_interleave(group, dim=3)  # [B, T, E, h, d]
        pv = path_v.repeat_interleave(group, dim=3)
        own = torch.einsum("bhtd,btehd->bhte", qh, pk) * scale
        probs = torch.cat([scores, own], dim=-1).softmax(-1)
        length = kh.shape[2]
        out = probs[..., :length] @ vh
        out = out + torch.einsum("bhte,btehd->bhtd", probs[..., length:], pv)
    merged: torch.Tensor = out.transpose(1, 2).reshape(b, t, heads * d)
    return merged
