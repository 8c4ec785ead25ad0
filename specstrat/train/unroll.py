"""A context head unrolled over a sequence the way it drafts: EAGLE-3's training-time test.

Step 0 runs every row of the sequence (row ``j``: the target's fused features at ``j`` and the
token at ``j + 1``) with causal attention; these rows are what the drafter caches. Step ``i``
continues each anchor ``j`` from its own hidden state of step ``i - 1``, attending to the step-0
rows up to ``j`` and to its own rows of steps ``1 .. i`` (the drafts on its path), as
:class:`~specstrat.strategies.ContextHeadDrafter` attends to its cache and its path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from specstrat._head_attention import attend
from specstrat.train.eagle3 import Eagle3Head

__all__ = ["unroll_context"]


def unroll_context(
    head: Eagle3Head,
    features: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    steps: int,
    next_tokens: Callable[[int, torch.Tensor], torch.Tensor],
    first_anchor: int = 0,
) -> Iterator[torch.Tensor]:
    """Draft logits ``[B, A, N]`` of each step for rows ``features [B, A, k*H]``, ``tokens
    [B, A]`` (the token after each row) at ``positions [B, A]``; steps after the first give
    the anchors from ``first_anchor`` on only (``[B, A - first_anchor, N]``), fed the tokens
    ``next_tokens(i, logits of step i - 1)`` returns."""
    c = head.config
    group = c.heads // c.kv_heads
    residual, q, k, v = head.layer_input(features, tokens, positions)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    attn = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=c.head_dim**-0.5)
    b, a = tokens.shape
    logits, hidden = head.layer_output(residual, attn.transpose(1, 2).reshape(b, a, -1))
    yield logits
    rows = torch.arange(a, device=tokens.device)
    mask = (rows[first_anchor:, None] >= rows[None, :])[None].expand(b, -1, -1)
    hidden, logits = hidden[:, first_anchor:], logits[:, first_anchor:]
    at = positions[:, first_anchor:]
    path_k: list[torch.Tensor] = []
    path_v: list[torch.Tensor] = []
    for i in range(1, steps):
        residual, q, k_i, v_i = head.layer_input(hidden, next_tokens(i, logits), at + i)
        path_k.append(k_i)
        path_v.append(v_i)
        out = attend(q, k, v, mask, torch.stack(path_k, dim=2), torch.stack(path_v, dim=2))
        logits, hidden = head.layer_output(residual, out)
        yield logits
