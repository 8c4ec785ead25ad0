"""How well a head agrees with its target, measured offline on captured data: the held-out
agreement of ``docs/glossary.md``, τ and acceptance by draft position (unconditional and
conditional) with the engine's formulas, each anchor counted as one drafted step of a chain."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.models import DraftHead
from specstrat.train.capture import CapturedData, CapturedSequence
from specstrat.train.eagle3 import Eagle3DraftHead, Eagle3Head
from specstrat.train.unroll import unroll_context

__all__ = ["Agreement", "agreement_of", "chained_conditional", "evaluate"]


class Agreement(TypedDict):
    """:func:`evaluate`'s answer: ``acceptance[i]``, acceptance (unconditional) of draft
    position ``i + 1``, the share of anchors whose first ``i + 1`` chained drafts all equal the
    target's greedy tokens; ``conditional[i]``, acceptance (conditional), that share given the
    first ``i`` were accepted (:func:`chained_conditional`; ``None`` where no anchor reached
    the position); ``tau = 1 + sum(acceptance)``, τ, the accepted drafts and the bonus token
    per anchor; ``anchors``, how many anchors were measured."""

    acceptance: list[float]
    conditional: list[float | None]
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
    trained = head.head if isinstance(head, Eagle3DraftHead) else head
    if isinstance(trained, Eagle3Head) and trained.config.context:
        return _evaluate_context(trained, data, depth)
    drafter: DraftHead = head.draft_head() if isinstance(head, Eagle3Head) else head
    hits = torch.zeros(depth, dtype=torch.float64)
    anchors = 0
    with torch.inference_mode():
        for seq in data.sequences:
            count = seq.tokens.numel() - depth  # anchors j with rows j + 1 .. j + depth
            if count <= seq.context:
                continue
            if seq.context:  # the prompt's rows are no anchors
                seq = _response(seq)
                count = seq.tokens.numel() - depth
            hidden, token = seq.features[:count], seq.tokens[1 : count + 1]
            alive = torch.ones(count, dtype=torch.bool)
            for i in range(depth):
                logits, hidden = drafter(hidden, token)
                token = logits.argmax(-1)
                alive &= token == seq.greedy[1 + i : count + 1 + i]
                hits[i] += alive.sum()
            anchors += count
    return agreement_of(hits, anchors)


def _response(seq: CapturedSequence) -> CapturedSequence:
    """``seq`` from its first anchor on (without its context rows)."""
    at = seq.context
    return CapturedSequence(
        features=seq.features[at:],
        tokens=seq.tokens[at:],
        final=seq.final[at:],
        greedy=seq.greedy[at:],
        start=seq.start + at,
    )


def _evaluate_context(head: Eagle3Head, data: CapturedData, depth: int) -> Agreement:
    """:func:`evaluate` for a head that attends over the context: each sequence's rows up to
    the anchors are its context, unrolled as the drafter drafts (:func:`unroll_context`)."""
    hits = torch.zeros(depth, dtype=torch.float64)
    anchors = 0
    d2t = head.get_buffer("d2t")
    with torch.inference_mode():
        for seq in data.sequences:
            count = seq.tokens.numel() - depth
            first = seq.context
            if count <= first:
                continue
            rows = torch.arange(count)
            alive = torch.ones(count - first, dtype=torch.bool)
            steps = unroll_context(
                head,
                seq.features[None, :count].float(),
                seq.tokens[None, 1 : count + 1],
                seq.start + rows[None] + 1,
                depth,
                lambda _i, logits: d2t[logits.argmax(-1)],
                torch.tensor([first]),
                count - first,
            )
            for i, logits in enumerate(steps):
                token = d2t[logits[0].argmax(-1)]
                alive &= token == seq.greedy[first + 1 + i : count + 1 + i]
                hits[i] += alive.sum()
            anchors += count - first
    return agreement_of(hits, anchors)


def agreement_of(hits: torch.Tensor, anchors: int) -> Agreement:
    """The agreement of ``anchors`` anchors whose chains reached each draft position
    ``hits[i]`` times."""
    acceptance = (hits / max(anchors, 1)).tolist()
    return Agreement(
        acceptance=acceptance,
        conditional=chained_conditional(acceptance),
        tau=1.0 + sum(acceptance),
        anchors=anchors,
    )


def chained_conditional(acceptance: Sequence[float]) -> list[float | None]:
    """Acceptance (conditional) by draft position from :func:`evaluate`'s unconditional
    ``acceptance``: every anchor proposes every position of its chain, so the anchors that
    reached position ``i`` are those that accepted position ``i - 1`` (all of them for position
    1), and ``A_i / R_i`` is ``acceptance[i] / acceptance[i - 1]``; ``None`` where no anchor
    reached the position."""
    previous = [1.0, *acceptance[:-1]]
    return [a / p if p > 0 else None for a, p in zip(acceptance, previous, strict=True)]
