"""Block drafting: the draft model proposes a whole block in one forward on the draft worker.

This is why DFLASH and DSPARK run TARGET_VERIFY on the draft worker: each step the drafter
catches its own KV up on the committed tokens it lacks (one DRAFT_EXTEND, as the draft-LM
drafter does), then runs ONE draft-worker TARGET_VERIFY forward of ``T_draft`` tokens per
request, ``T_draft = get_num_tokens_per_req_for_target_verify(D, is_draft_worker=True)``,
through the engine's draft-worker graph runner (buckets of ``bs * T_draft`` tokens). The rows
hold placeholders (:meth:`~specstrat.models.BlockDraftModel.placeholder`) whose outputs are the
drafts, read in parallel; the placeholders are rewound out of the draft KV before ``propose``
returns.

**The mapping** (:func:`block_layout`). The target verifies ``T_target`` tokens per request: the
anchor (the last verified token, at position ``n``) and ``T_target - 1`` drafts at ``n + 1 ..``.
A placeholder at position ``n + k`` predicts the token at ``n + k``, so draft ``k`` is the output
of the ``k``-th placeholder, and the block is the target's verify row with its drafts replaced by
placeholders — minus the anchor when the draft worker runs one token fewer:

* ``T_draft == T_target`` (DFLASH, ``D, D``): the block is ``[anchor, placeholder 1 .. T_target -
  1]``; the anchor's own output is not a draft.
* ``T_draft == T_target - 1`` (DSPARK, ``D, D - 1``): the anchor joins the catch-up, the block is
  ``[placeholder 1 .. T_target - 1]``.
* Anything else is refused with :class:`~specstrat.errors.InvalidConfig` at engine start: more
  positions than ``T_target`` would invent drafts the target never verifies, fewer than
  ``T_target - 1`` would leave verify positions without a draft (filler).

Either way every placeholder yields exactly one draft and every draft the target verifies comes
from exactly one placeholder. At ``D = 1`` the target verifies the anchor alone (``T_target =
1``; DSPARK's draft worker answers ``max(1, D - 1) = 1`` where SGLang answers 0, because the
policy contract is ``T >= 1``): the layout has no drafts and the drafter runs no forward.

**Confidence.** Each node reports the peak probability of its draft distribution (softmax of the
block head's logits at temperature 1): for a greedy request, the drafted token's probability. A
``confidence_threshold`` keeps each request's block up to (not including) its first node below
it; the target then verifies only what was kept (ragged metadata, for an algorithm with
``supports_ragged_verify``). The confidence never depends on a sampled token (the nodes of a
block are drawn independently, from distributions fixed by the context), so the stopping point
is fixed before sampling and rejection sampling stays lossless in distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specstrat._ints import is_int
from specstrat.drafting import (
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
)
from specstrat.errors import InvalidConfig
from specstrat.models import BlockDraftModel, BlockKV, LoadedModels
from specstrat.relay import RelayPayload
from specstrat.sampling import DraftChooser
from specstrat.strategies.drafters import DraftRows

__all__ = ["BlockDrafter", "BlockDrafterFactory", "BlockLayout", "block_layout"]

_NOTHING = RelayPayload()


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockLayout:
    """Where the drafts come from: ``anchor_in_block`` says whether the block's first row is
    the anchor (else the catch-up forward runs it); ``drafts`` placeholders follow, the ``k``-th
    giving draft ``k``. The block is ``int(anchor_in_block) + drafts`` rows (``T_draft``)."""

    anchor_in_block: bool
    drafts: int

    @property
    def rows(self) -> int:
        """``T_draft``: tokens per request of the draft worker's TARGET_VERIFY forward."""
        return int(self.anchor_in_block) + self.drafts


def block_layout(t_draft: int, t_target: int) -> BlockLayout:
    """The layout mapping ``t_draft`` draft-worker positions to the ``t_target - 1`` drafts the
    target verifies (see the module docstring); other combinations raise InvalidConfig."""
    for name, value in (("T_draft", t_draft), ("T_target", t_target)):
        if not is_int(value) or value < 1:
            raise InvalidConfig(f"{name}={value!r} must be an int >= 1")
    if t_draft == t_target:
        return BlockLayout(anchor_in_block=True, drafts=t_target - 1)
    if t_draft == t_target - 1:
        return BlockLayout(anchor_in_block=False, drafts=t_target - 1)
    problem = (
        f"would invent {t_draft - t_target} draft(s) the target never verifies"
        if t_draft > t_target
        else f"gives {t_draft} drafts for the {t_target - 1} the target verifies"
    )
    raise InvalidConfig(
        f"block drafting with T_draft={t_draft} draft-worker tokens per request and "
        f"T_target={t_target} {problem}; use a target_verify policy with T_target - 1 <= "
        "T_draft <= T_target (DFLASH: D, D; DSPARK: D, D - 1)"
    )


class BlockDrafter:
    """Drafts a block per request in one draft-worker TARGET_VERIFY forward (see the module).

    Its KV holds a prefix of each request's committed tokens; after ``propose`` it holds them
    up to and including the anchor, so the next step catches up on the accepted drafts only.
    """

    def __init__(
        self,
        runner: BlockKV,
        model: BlockDraftModel,
        target_tokens: Callable[[int], Sequence[int]],
        layout: BlockLayout,
        threshold: float | None,
    ) -> None:
        self.runner = runner
        self.layout, self.threshold = layout, threshold
        self.blanks = [model.placeholder(k) for k in range(1, layout.drafts + 1)]
        self.rows = DraftRows(runner, target_tokens)

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """A draft-KV index per request (filled at the first proposal; the KV never travels)."""
        self.rows.admit(admission.slots)
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Free the requests' draft KV."""
        self.rows.release(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        """One block per request: catch up, one draft-worker TARGET_VERIFY, rewind."""
        bs, n, dev = len(step.slots), self.layout.drafts, step.bonus_tokens.device
        if step.max_nodes > n:
            raise InvalidConfig(
                f"the step verifies max_nodes={step.max_nodes} drafts but this block drafter "
                f"was laid out for {n} (T_target={n + 1}); create it with the engine's "
                "verify_tokens_per_req (the largest candidate's)"
            )
        if not step.max_nodes or not bs:  # D = 1: no forward; the next step catches up
            return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=dev))
        own, lacking = self.rows.behind(step.slots)
        last = [int(t) for t in step.bonus_tokens.tolist()]
        anchor = self.layout.anchor_in_block
        behind = [
            (o, [*tokens, *([] if anchor else [tok])])
            for o, tokens, tok in zip(own, lacking, last, strict=True)
        ]
        behind = [(o, tokens) for o, tokens in behind if tokens]
        if behind:
            self.runner.extend([o for o, _ in behind], [tokens for _, tokens in behind])
        rows = [[tok] if anchor else [] for tok in last]
        block = torch.tensor([[*r, *self.blanks] for r in rows], dtype=torch.int64, device=dev)
        logits, _ = self.runner.verify(own, block)
        logits = logits.view(bs, self.layout.rows, -1)[:, self.layout.rows - n :]
        for o, length in zip(own, step.seq_lens.tolist(), strict=True):
            self.runner.rewind(o, int(length) + 1)  # keep the anchor, drop the placeholders
        # A narrower step (a speculation policy's smaller D) keeps the first placeholders: each
        # attends only to the prefix and the placeholders before it, so its drafts are those of
        # a block laid out for that width; the forward itself stays the widest candidate's.
        logits = logits[:, : step.max_nodes]
        chooser = DraftChooser(step)
        for j in range(step.max_nodes):
            chooser.pick(logits[:, j])
        drafted = chooser.tree(dev)
        confidence = logits.double().softmax(-1).amax(-1).to(dev)
        lengths = None
        if self.threshold is not None:
            kept = (confidence >= self.threshold).to(torch.int64).cumprod(dim=1)
            lengths = kept.sum(dim=1)
        return DraftTree.chain(drafted.tokens, lengths=lengths, q=drafted.q, confidence=confidence)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Nothing to learn: accepted drafts land in the target's pool, caught up next step."""
        return _NOTHING


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockDrafterFactory:
    """Block drafting with ``models.block`` (a :class:`~specstrat.models.BlockDraftModel`) on a
    draft worker that runs TARGET_VERIFY; ``confidence_threshold`` in ``[0, 1]`` (or ``None``:
    keep whole blocks) cuts each request's block at its first node below it."""

    confidence_threshold: float | None = None

    def __post_init__(self) -> None:
        t = self.confidence_threshold
        if t is not None and (
            isinstance(t, bool)
            or not isinstance(t, int | float)
            or not math.isfinite(t)
            or not 0 <= t <= 1
        ):
            raise InvalidConfig(
                f"confidence_threshold={t!r} must be a number in [0, 1] (a draft probability), "
                "or None to keep whole blocks"
            )

    @property
    def needs(self) -> DrafterNeeds:
        """A draft model with its own KV, and TARGET_VERIFY on the draft worker."""
        return DrafterNeeds(draft_model=True, draft_worker_verify=True)

    def create_drafter(self, context: DrafterContext) -> BlockDrafter:
        """A drafter over a draft-worker runner the engine makes for ``models.block``."""
        block = getattr(context.models, "block", None)
        if block is None:
            raise InvalidConfig(
                "BlockDrafterFactory needs a block draft model but models.block is None or "
                "missing; load one (EmbeddedModels.load() ships it; a Hugging Face model: "
                "specstrat.train.attach_block or --block FILE, trained by specstrat train --kind "
                "block; or ModelSet(target=..., block=...))"
            )
        if not isinstance(block, BlockDraftModel):
            raise InvalidConfig(
                f"models.block={type(block).__name__} is not a BlockDraftModel; it needs what a "
                "CausalLM has and `placeholder(offset) -> int`"
            )
        if context.new_block_runner is None or context.verify_tokens_per_req is None:
            raise InvalidConfig(
                "BlockDrafterFactory needs DrafterContext.new_block_runner and "
                "verify_tokens_per_req (a draft worker that runs TARGET_VERIFY); this context "
                "has none: run it in specstrat's Engine"
            )
        runner = context.new_block_runner(block)
        layout = block_layout(runner.tokens_per_req, context.verify_tokens_per_req)
        return BlockDrafter(runner, block, context.target_tokens, layout, self.confidence_threshold)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the decode side rebuilds the draft KV from the prompt."""
        return _NOTHING
