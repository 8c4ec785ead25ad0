"""How well a head agrees with its target: chained top-1 acceptance by draft position, and the
implied tokens per verify step (tau), measured on captured data."""

from __future__ import annotations

from typing import TypedDict

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.models import DraftHead
from specstrat.train.capture import CapturedData
from specstrat.train.eagle3 import Eagle3Head

__all__ = ["Agreement", "evaluate"]


class Agreement(TypedDict):
    """:func:`evaluate`'s answer: ``acceptance[i]``, the share of anchors whose first ``i + 1``
    chained drafts all equal the target's greedy tokens; ``conditional[i]``, that share given
    the first ``i`` were accepted; ``tau = 1 + sum(acceptance)``, the implied tokens per verify
    step; ``anchors``, how many anchors were measured."""

    acceptance: list[float]
    conditional: list[float]
    tau: float
    anchors: int


def evaluate(head: Eagle3Head | DraftHead, data: CapturedData, *, depth: int = 5) -> Agreement:
    """The head's chained top-1 agreement with the target's greedy tokens on ``data``.

    From each anchor row ``j`` (every row with ``depth`` rows after it) the head drafts
    ``depth`` tokens one at a time, as the engine would: first from the target's fused features
    at ``j`` and the sequence's token at ``j + 1``, then from its own hidden state and its own
    previous draft. Draft ``i`` agrees when it equals the target's greedy token at row
    ``j + 1 + i``; a held-out set generated greedily makes these the target's own
    continuations."""
    if not is_int(depth) or depth < 1:
        raise InvalidConfig(f"depth={depth!r} must be an int >= 1")
    drafter: DraftHead = head.draft_head() if isinstance(head, Eagle3Head) else head
    hits = torch.zeros(depth, dtype=torch.float64)
    anchors = 0
    with torch.inference_mode():
        for seq in data.sequences:
            count = seq.tokens.numel() - depth  # anchors j with rows j + 1 .. j + depth
            if count < 1:
                continue
            hidden, token = seq.features[:count], seq.tokens[1 : count + 1]
            alive = torch.ones(count, dtype=torch.bool)
            for i in range(depth):
                logits, hidden = drafter(hidden, token)
                token = logits.argmax(-1)
                alive &= token == seq.greedy[1 + i : count + 1 + i]
                hits[i] += alive.sum()
            anchors += count
    acceptance = (hits / max(anchors, 1)).tolist()
    previous = [1.0, *acceptance[:-1]]
    conditional = [a / p if p > 0 else 0.0 for a, p in zip(acceptance, previous, strict=True)]
    return Agreement(
        acceptance=acceptance, conditional=conditional, tau=1.0 + sum(acceptance), anchors=anchors
    )
