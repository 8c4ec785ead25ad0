"""Training-time test for a head: a batch of captured sequences and the unrolled loss.

Each sequence is queried at its anchors only (its rows past its context, but the last): a
head that attends over the context reads the context rows as keys
(:func:`~specstrat.train.unroll.unroll_context`); one that attends to itself only runs from
the anchors' own features. Step ``i`` of the unroll weighs ``TTT_DECAY ** i``, a soft
cross-entropy against the target's distribution on the draft vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specstrat.train.capture import CapturedData, CapturedSequence
from specstrat.train.eagle3 import Eagle3Head
from specstrat.train.unroll import unroll_context

__all__ = ["TTT_DECAY", "batch_of", "ttt_loss"]

#: Step ``i`` of the unrolled head weighs ``TTT_DECAY ** i`` in the loss (EAGLE-3's 0.8).
TTT_DECAY = 0.8


@dataclass(frozen=True, slots=True)
class _Batch:
    features: torch.Tensor  # [B, R, k*H], zero past each sequence
    tokens: torch.Tensor  # [B, R]
    lengths: torch.Tensor  # [B] rows per sequence
    starts: torch.Tensor  # [B] absolute position of row 0
    context: torch.Tensor  # [B] rows before the first anchor (the prompt's, keys only)
    # From each sequence's first anchor on (row t: the sequence's row context + t):
    answer: torch.Tensor  # [B, Q + 1] tokens
    targets: torch.Tensor  # [B, Q + 1, N] target logits on the draft vocabulary


def batch_of(data: CapturedData, sequences: Sequence[CapturedSequence]) -> _Batch:
    rows = max(s.tokens.numel() for s in sequences)
    answered = max(s.tokens.numel() - s.context for s in sequences)

    def pad(x: torch.Tensor, n: int = rows) -> torch.Tensor:
        return F.pad(x, [0, 0] * (x.dim() - 1) + [0, n - x.shape[0]])

    return _Batch(
        features=torch.stack([pad(s.features) for s in sequences]).float(),
        tokens=torch.stack([pad(s.tokens) for s in sequences]),
        lengths=torch.tensor([s.tokens.numel() for s in sequences]),
        starts=torch.tensor([s.start for s in sequences]),
        context=torch.tensor([s.context for s in sequences]),
        answer=torch.stack([pad(s.tokens[s.context :], answered) for s in sequences]),
        targets=data.target_logits(
            torch.stack([pad(s.final[s.context :], answered) for s in sequences])
        ),
    )


def _shift(x: torch.Tensor, by: int, rows: int) -> torch.Tensor:
    """``x[:, by : by + rows]`` padded with zeros to ``rows`` rows."""
    part = x[:, by : by + rows]
    return F.pad(part, [0, 0] * (x.dim() - 2) + [0, rows - part.shape[1]])


def ttt_loss(
    head: Eagle3Head, batch: _Batch, steps: int, context: bool
) -> tuple[torch.Tensor, list[float]]:
    """The unrolled loss over each sequence's anchors (its rows past its context, but the
    last) and each step's top-1 accuracy against the target's restricted argmax. Only the
    anchors are queried: the context rows pass the head's input half alone, as keys."""
    queries = batch.answer.shape[1] - 1
    t = torch.arange(queries)
    if context:
        rows = batch.tokens.shape[1] - 1
        logits_of = unroll_context(
            head,
            batch.features[:, :rows],
            _shift(batch.tokens, 1, rows),
            batch.starts[:, None] + torch.arange(rows)[None] + 1,
            steps,
            lambda i, _logits: _shift(batch.answer, 1 + i, queries),
            batch.context,
            queries,
        )
    else:
        logits_of = _self_only(head, batch, steps, queries)
    total = batch.features.new_zeros(())
    accuracy: list[float] = []
    for i, logits in enumerate(logits_of):
        valid = (t[None] + 1 + i) < (batch.lengths - batch.context)[:, None]
        if not bool(valid.any()):
            break
        target = _shift(batch.targets, 1 + i, queries)
        soft = -(target.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        total = total + TTT_DECAY**i * soft[valid].mean()
        agree = logits.argmax(-1) == target.argmax(-1)
        accuracy.append(float(agree[valid].float().mean()))
    return total, accuracy


def _self_only(head: Eagle3Head, batch: _Batch, steps: int, queries: int) -> Iterator[torch.Tensor]:
    """Each step's logits at each sequence's anchors, of a head whose rows attend to
    themselves only."""
    index = (batch.context[:, None] + torch.arange(queries)[None]).clamp(
        max=batch.features.shape[1] - 1
    )
    hidden = batch.features[torch.arange(index.shape[0])[:, None], index]
    for i in range(steps):
        tokens = _shift(batch.answer, 1 + i, queries)
        positions = batch.starts[:, None] + index + 1 + i
        logits, hidden = head(hidden, tokens, positions, causal=False)
        yield logits
