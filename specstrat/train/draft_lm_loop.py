"""Distil a draft LM (:class:`~specstrat.train.DraftLM`) from its target on a CPU budget.

:func:`train_draft_lm` shares the head's data path (:func:`~specstrat.train.train_head`'s): the
target's own responses to the prompts, captured with the prompt's rows, so the draft reads each
whole sequence as STANDALONE's drafter will. The draft vocabulary is the ``draft_vocab`` tokens
the target produced most often. Each step runs the draft over a batch of sequences (teacher
forcing: a draft the target accepts is the target's own token, so a chain never drafts from
anything else) and takes the soft cross-entropy against the target's distribution on the draft
vocabulary at every response row. AdamW, warm-up then cosine, gradient clipping, seeded; a
checkpoint after each epoch and ``resume``, as for a head.

:func:`draft_agreement` measures the held-out agreement of ``docs/glossary.md`` exactly for a
draft LM: a chain of greedy drafts from anchor ``j`` is accepted up to the first row where the
draft's top-1 differs from the target's greedy token, so one forward per sequence gives every
anchor's chain.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specstrat.errors import InvalidConfig
from specstrat.train.agreement import Agreement, agreement_of
from specstrat.train.artifact import target_name, target_sha256, trained_fields
from specstrat.train.capture import CapturedData, CapturedSequence, raw_model
from specstrat.train.checkpoint import Checkpoint
from specstrat.train.draft_lm import (
    DraftLM,
    check_draft_layers,
    default_draft_layers,
    soft_cross_entropy,
)
from specstrat.train.draft_lm_file import TrainedDraftLM
from specstrat.train.fit import FitState, fit
from specstrat.train.head_config import HeadConfig
from specstrat.train.loop import TrainingRun, collect

__all__ = [
    "Student",
    "check_captured",
    "check_depth",
    "distil",
    "draft_agreement",
    "train_draft_lm",
]


def train_draft_lm(
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
    """A draft LM distilled from ``model`` (a transformers causal LM, or an
    :class:`~specstrat.hf.HFCausalLM`) on its own responses to ``prompts`` (see the module
    docstring; the arguments are :func:`~specstrat.train.train_head`'s, ``config.kind`` must be
    ``"draft-lm"``; ``captured``: a checkpoint whose data to train on instead of generating,
    as ``specstrat train --data`` passes it)."""
    student = Student(
        kind="draft-lm",
        name="train_draft_lm",
        build=lambda lm, layers, d2t: DraftLM.from_target(lm, layers, d2t),
        default_layers=default_draft_layers,
        loss=_draft_loss,
        agreement=draft_agreement,
    )
    run = (config, model, tokenizer, prompts)
    return distil(student, *run, progress, source, command, checkpoint, resume, captured)


@dataclass(frozen=True, slots=True, kw_only=True)
class Student:
    """What :func:`distil` trains: the ``kind`` it takes (``name``: the function that trains
    it, for messages), how it is ``build``-t on the raw target from its layers and ``d2t``, the
    ``default_layers`` rule, the ``loss`` of a batch of sequences and its progress text (given
    the fit's shuffling generator, which a checkpoint keeps, for any draw it makes) and the
    held-out ``agreement``."""

    kind: str
    name: str
    build: Callable[[Any, tuple[int, ...], torch.Tensor], DraftLM]
    default_layers: Callable[[int], tuple[int, ...]]
    loss: Callable[
        [DraftLM, CapturedData, Sequence[CapturedSequence], torch.Generator],
        tuple[torch.Tensor, str],
    ]
    agreement: Callable[..., Agreement]


def distil(
    student: Student,
    config: HeadConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    progress: bool,
    source: str,
    command: str,
    checkpoint: str | os.PathLike[str] | None,
    resume: Checkpoint | None,
    captured: Checkpoint | None = None,
) -> TrainedDraftLM:
    """``student`` trained on ``model``'s responses to ``prompts``: the target's own data
    with the prompt's rows (or ``captured``'s data, bound to the same target), the fit, the
    held-out agreement (see the module docstring)."""
    from tqdm.auto import tqdm

    if config.kind != student.kind:
        raise InvalidConfig(
            f"HeadConfig.kind={config.kind!r}; {student.name} trains kind={student.kind!r} (a "
            "head: train_head, a draft LM: train_draft_lm, a block drafter: train_block_lm)"
        )
    if isinstance(prompts, str) or not prompts:
        raise InvalidConfig(f"prompts={prompts!r}; pass a non-empty sequence of prompt strings")
    if resume is not None:
        resume.check_resumes(config, source)
    start = time.monotonic()
    deadline = None if config.budget_seconds is None else start + config.budget_seconds
    with raw_model(model) as lm:
        name, digest = target_name(model), target_sha256(lm)
        num_layers = int(lm.config.num_hidden_layers)
    layers = config.layers if config.layers is not None else student.default_layers(num_layers)
    check_draft_layers(layers, num_layers)  # before any generation
    if resume is not None:
        resume.check_target(name, digest)
        data, held = resume.data, resume.held
    elif captured is not None:
        check_captured(captured)
        captured.check_target(name, digest, "data")
        data, held = captured.data, captured.held
    else:  # the prompt's rows are the draft's context; the fused layers are the default's
        rows = dataclasses.replace(config, context=True, layers=None)
        bar = progress and tqdm
        data, held = collect(rows, model, tokenizer, prompts, source, start, bar)
    with raw_model(model) as lm:
        draft = student.build(lm, tuple(layers), data.d2t)
    run = TrainingRun(config, name, digest, data, held, checkpoint, resume)
    steps, loss = _fit(draft, run, deadline, progress and tqdm, student)
    agreement = student.agreement(draft, held, depth=config.eval_depth) if held.sequences else None
    facts = trained_fields(
        (name, digest), (data.positions, data.source), (steps, loss), agreement, command
    )
    return TrainedDraftLM(draft=draft, **facts)


def check_captured(captured: Checkpoint) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) a checkpoint whose data lacks the
    prompt's rows (a head's run captures from the last prompt row on), which a draft LM and a
    block drafter read as their context."""
    seqs = captured.data.sequences
    if seqs and all(s.context == 0 for s in seqs):
        raise InvalidConfig(
            f"data={captured.file!r} holds generations captured without the prompt's rows (a "
            "head's run, --kind eagle3); pass the checkpoint of a --kind draft-lm or block run, "
            "or drop --data to generate them"
        )


def _draft_loss(
    draft: DraftLM, data: CapturedData, seqs: Sequence[CapturedSequence], order: torch.Generator
) -> tuple[torch.Tensor, str]:
    """Teacher-forced soft cross-entropy at every response row, and the top-1 agreement."""
    device = next(draft.model.parameters()).device
    tokens, mask, want, rows = (t.to(device) for t in _batch(data, seqs))
    loss, agree = soft_cross_entropy(draft.draft_logits(tokens, mask), want, rows)
    return loss, f"top-1 {agree.item():.2f}"


def _batch(
    data: CapturedData, seqs: Sequence[CapturedSequence]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``tokens [B, T]``, ``attention_mask [B, T]``, the target's logits on the
    draft vocabulary ``[B, T, N]`` and the rows trained on ``[B, T]`` (response rows)."""
    width = max(int(s.tokens.numel()) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.int64)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    final = torch.zeros(len(seqs), width, data.lm_rows.shape[1])
    rows = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = int(s.tokens.numel())
        tokens[b, :n], mask[b, :n], final[b, :n] = s.tokens, 1, s.final.float()
        rows[b, s.context : n] = True
    return tokens, mask, data.target_logits(final), rows


def _fit(
    draft: DraftLM, run: TrainingRun, deadline: float | None, bar: Any, student: Student
) -> tuple[int, float]:
    """:func:`~specstrat.train.fit.fit` of the draft, teacher-forced; (steps, final loss)."""
    config, data, resume = run.config, run.data, run.resume
    order = torch.Generator().manual_seed(config.seed)
    params = draft.train_parameters()
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)
    seqs = [s for s in data.sequences if s.tokens.numel() > s.context]
    if not seqs:
        raise InvalidConfig(
            f"the captured data has no response rows ({len(data.sequences)} sequences, "
            f"{data.positions} positions): nothing to distil; raise max_new_tokens or the budget"
        )
    at = FitState()
    if resume is not None:
        if set(resume.head) != set(draft.trainable()):
            raise InvalidConfig(
                f"resume={resume.file!r} holds tensors {sorted(set(resume.head))[:3]}... that "
                f"are not this model's; resume a checkpoint written by --kind {student.kind} "
                "with the same --layers"
            )
        draft.model.load_state_dict(resume.head, strict=False)
        opt.load_state_dict(resume.optimizer)
        order.set_state(resume.order)
        at = FitState(resume.epoch, resume.step, list(resume.recent))

    def loss_of(picked: list[int]) -> tuple[torch.Tensor, str]:
        return student.loss(draft, data, [seqs[i] for i in picked], order)

    fit(
        draft,
        opt,
        params,
        loss_of,
        count=len(seqs),
        config=config,
        state=at,
        order=order,
        deadline=deadline,
        save=lambda done: run.save(draft, opt, order, done),
        bar=bar,
        desc=f"train {student.kind}",
    )
    return at.step, at.loss


def draft_agreement(draft: DraftLM, data: CapturedData, *, depth: int = 5) -> Agreement:
    """The draft LM's chained greedy agreement with the target on ``data`` (see the module
    docstring): anchors as :func:`~specstrat.train.evaluate` counts them, every response row
    ``j`` with ``depth`` rows after it; draft ``i`` from anchor ``j`` agrees when the draft's
    top-1 at rows ``j + 1 .. j + 1 + i`` all equal the target's greedy tokens there (and the
    sequence's tokens are those greedy tokens: in sampled data a chain ends where the sample
    left the greedy path)."""
    check_depth(depth)
    d2t = draft.get_buffer("d2t")
    hits = torch.zeros(depth, dtype=torch.float64)
    anchors = 0
    with torch.inference_mode():
        for seq in data.sequences:
            count = int(seq.tokens.numel()) - depth
            if count <= seq.context:
                continue
            logits = draft.draft_logits(seq.tokens[None].to(d2t.device))[0]
            match = d2t[logits.argmax(-1)].cpu() == seq.greedy
            match[:-1] &= seq.tokens[1:] == seq.greedy[:-1]  # a sampled token ends a chain
            alive = torch.ones(count - seq.context, dtype=torch.bool)
            for i in range(depth):
                alive &= match[seq.context + 1 + i : count + 1 + i]
                hits[i] += alive.sum()
            anchors += count - seq.context
    return agreement_of(hits, anchors)


def check_depth(depth: object) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) a measuring depth that is not an int
    >= 1."""
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise InvalidConfig(f"depth={depth!r} must be an int >= 1 (draft tokens measured)")
