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
    first: torch.Tensor,
    anchors: int,
) -> Iterator[torch.Tensor]:
    """Draft logits ``[B, anchors, N]`` of each step at each sequence's anchors ``first[b] ..
    first[b] + anchors - 1`` (past the last row: the last row again), for rows ``features
    [B, A, k*H]``, ``tokens [B, A]`` (the token after each row) at ``positions [B, A]``; steps
    after the first are fed the tokens ``next_tokens(i, logits of step i - 1)`` returns
    (``[B, anchors]``). Rows before a sequence's first anchor are keys only: they pass the
    layer's input half alone (what the drafter caches of a prompt)."""
    b, a = tokens.shape
    residual, q, k, v = head.layer_input(features, tokens, positions)
    index = (first[:, None] + torch.arange(anchors)[None]).clamp(max=a - 1).to(tokens.device)
    batch = torch.arange(b, device=tokens.device)[:, None]
    residual, q, at = residual[batch, index], q[batch, index], positions[batch, index]
    mask = index[:, :, None] >= torch.arange(a, device=tokens.device)[None, None]
    logits, hidden = head.layer_output(residual, attend(q, k, v, mask))
    yield logits
    path_k: list[torch.Tensor] = []
    path_v: list[torch.Tensor] = []
    for i in range(1, steps):
        residual, q, k_i, v_i = head.layer_input(hidden, next_tokens(i, logits), at + i)
        path_k.append(k_i)
        path_v.append(v_i)
        out = attend(q, k, v, mask, torch.stack(path_k, dim=2), torch.stack(path_v, dim=2))
        logits, hidden = head.layer_output(residual, out)
        yield logits
