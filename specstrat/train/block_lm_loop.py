"""Train a block drafter (:class:`~specstrat.train.BlockLM`) for DFLASH and DSPARK on a CPU
budget.

:func:`train_block_lm` shares the draft LM's path (:func:`~specstrat.train.train_draft_lm`'s):
the target's own responses to the prompts with the prompt's rows, the draft vocabulary, the fit,
the checkpoints and ``resume``. Each step lays every sequence of the batch out with
``config.anchors`` blocks (:func:`~specstrat.train.block_batch`, anchors drawn from the response
rows, seeded) and takes, for each offset ``k``, the soft cross-entropy of placeholder ``k``
against the target's distribution for the token ``k`` after its anchor, weighted ``0.8 ** (k -
1)`` (a later draft counts only when the earlier ones were accepted).

:func:`block_agreement` measures the held-out agreement of ``docs/glossary.md`` exactly for a
block drafter: from each anchor, draft ``k`` is accepted when the drafts at offsets ``1..k`` all
equal the target's greedy tokens there, which is what a greedy verify of the block accepts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from specstrat.errors import InvalidConfig
from specstrat.train._ttt import TTT_DECAY
from specstrat.train.agreement import Agreement, agreement_of
from specstrat.train.block_lm import BlockLM, block_batch, block_targets, default_block_layers
from specstrat.train.capture import CapturedData, CapturedSequence
from specstrat.train.checkpoint import Checkpoint
from specstrat.train.draft_lm import DraftLM, soft_cross_entropy
from specstrat.train.draft_lm_file import TrainedDraftLM
from specstrat.train.draft_lm_loop import Student, check_depth, distil
from specstrat.train.head_config import HeadConfig

__all__ = ["block_agreement", "train_block_lm"]

#: Anchors a held-out sequence runs per forward in :func:`block_agreement`.
_EVAL_CHUNK = 64


def train_block_lm(
    config: HeadConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    progress: bool = True,
    source: str = "prompts",
    command: str = "",
    checkpoint: str | os.PathLike[str] | None = None,
    resume: Checkpoint | None = None,
    captured: Checkpoint | None = None,
) -> TrainedDraftLM:
    """A block drafter trained for ``model`` on its own responses to ``prompts`` (see the
    module docstring; the arguments are :func:`~specstrat.train.train_head`'s, ``config.kind``
    must be ``"block"``; ``captured`` as for :func:`~specstrat.train.train_draft_lm`); the
    result's ``draft`` is a :class:`~specstrat.train.BlockLM`."""

    def loss(
        draft: DraftLM,
        data: CapturedData,
        seqs: Sequence[CapturedSequence],
        order: torch.Generator,
    ) -> tuple[torch.Tensor, str]:
        assert isinstance(draft, BlockLM)
        picked = [_anchors(s, config.anchors, order) for s in seqs]
        return _block_loss(draft, data, seqs, picked)

    student = Student(
        kind="block",
        name="train_block_lm",
        build=lambda lm, layers, d2t: BlockLM.from_target(lm, layers, d2t, block=config.block),
        default_layers=default_block_layers,
        loss=loss,
        agreement=block_agreement,
    )
    run = (config, model, tokenizer, prompts)
    return distil(student, *run, progress, source, command, checkpoint, resume, captured)


def _anchors(seq: CapturedSequence, count: int, order: torch.Generator) -> list[int]:
    """``count`` anchors among ``seq``'s response tokens (distinct while there are enough):
    an anchor is the last token a step knows, at the earliest the first response token (the
    engine drafts first after prefill has given it)."""
    n = int(seq.tokens.numel())
    first = min(seq.context + 1, n - 1)
    rows = n - first
    if rows >= count:
        return (first + torch.randperm(rows, generator=order)[:count]).tolist()
    return (first + torch.randint(rows, (count,), generator=order)).tolist()


def _block_loss(
    draft: BlockLM,
    data: CapturedData,
    seqs: Sequence[CapturedSequence],
    anchors: Sequence[Sequence[int]],
) -> tuple[torch.Tensor, str]:
    """The offset-weighted soft cross-entropy of ``seqs`` with blocks at ``anchors`` (see the
    module docstring), and the first placeholder's top-1 agreement as progress text."""
    batch = block_batch(seqs, anchors, draft.block, draft.embedding.rows)
    device = next(draft.model.parameters()).device
    logits = draft.block_logits(batch)[:, batch.context_rows :]
    logits = logits.reshape(*batch.valid.shape, -1)
    want = block_targets(data, seqs, batch).to(device)
    valid = batch.valid.to(device)
    total, weights, first = logits.new_zeros(()), 0.0, 0.0
    for k in range(draft.block):
        rows = valid[:, :, k]
        if not rows.any():
            continue
        lost, agree = soft_cross_entropy(logits[:, :, k], want[:, :, k], rows)
        total, weights = total + TTT_DECAY**k * lost, weights + TTT_DECAY**k
        first = agree.item() if k == 0 else first
    return total / max(weights, 1e-9), f"top-1 {first:.2f}"


def block_agreement(draft: DraftLM, data: CapturedData, *, depth: int = 5) -> Agreement:
    """The block drafter's greedy agreement with the target on ``data`` (see the module
    docstring) for the first ``min(depth, draft.block)`` drafts of each block: every response
    token with that many rows after it is an anchor, as
    :func:`~specstrat.train.draft_agreement` counts them (in sampled data a chain ends where the
    sample left the greedy path)."""
    if not isinstance(draft, BlockLM):
        raise InvalidConfig(
            f"draft={type(draft).__name__} is not a BlockLM; measure a draft LM with "
            "draft_agreement"
        )
    check_depth(depth)
    depth = min(depth, draft.block)
    d2t = draft.get_buffer("d2t")
    hits = torch.zeros(depth, dtype=torch.float64)
    anchors = 0
    with torch.inference_mode():
        for seq in data.sequences:
            n = int(seq.tokens.numel())
            every = list(range(seq.context + 1, n - depth + 1))
            greedy_path = torch.ones(n, dtype=torch.bool)
            greedy_path[1:] = seq.tokens[1:] == seq.greedy[:-1]  # token r is the greedy one
            for at in range(0, len(every), _EVAL_CHUNK):
                chunk = every[at : at + _EVAL_CHUNK]
                batch = block_batch([seq], [chunk], draft.block, draft.embedding.rows)
                logits = draft.block_logits(batch)[0, batch.context_rows :]
                drafted = d2t[logits.argmax(-1)].cpu().view(len(chunk), draft.block)[:, :depth]
                rows = batch.labels[0][:, :depth]  # row a + k - 1
                match = drafted == seq.greedy[rows]
                match[:, 1:] &= greedy_path[rows[:, 1:]]  # the drafts before k were greedy
                hits += match.cumprod(dim=1).sum(0).double()
                anchors += len(chunk)
    return agreement_of(hits, anchors)
