"""Built-in drafters: prompt lookup, a draft LM with its own KV, none (the EAGLE-style head's
drafter is in :mod:`specstrat.strategies.eagle_head`).

Each ``*DrafterFactory`` is the frozen, picklable value an algorithm's ``drafter`` field holds;
the engine calls ``create_drafter`` once and gets the stateful ``*Drafter``, whose per-request
state is keyed by the request's target slot. The drafters reach models only through
:mod:`specstrat.models` Protocols, so they never import the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
from specstrat.models import CausalLM, DraftKV, LoadedModels
from specstrat.protocols import Drafter
from specstrat.relay import RelayPayload
from specstrat.sampling import DraftChooser
from specstrat.strategies.tree_expansion import TreeExpansion

__all__ = [
    "DraftRows",
    "DraftModelDrafter",
    "DraftModelDrafterFactory",
    "NgramDrafter",
    "NgramDrafterFactory",
    "NoDrafter",
    "NoDrafterFactory",
    "draft_lm_drafter",
]

_NOTHING = RelayPayload()


def _empty_tree(bs: int, device: torch.device) -> DraftTree:
    return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=device))


# -- no drafting -------------------------------------------------------------------------------


class NoDrafter:
    """Proposes nothing: every step verifies only the bonus token (plain decoding).

    A base for a drafter of your own that keeps nothing per request: it inherits ``admit``,
    ``release`` and ``commit`` (which do nothing) and overrides ``propose``. Its factory need not
    subclass :class:`NoDrafterFactory`.
    """

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """Nothing to set up."""
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Nothing was kept."""

    def propose(self, step: DraftStep) -> DraftTree:
        """A tree of zero nodes per request."""
        return _empty_tree(len(step.slots), step.bonus_tokens.device)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Nothing to learn."""
        return _NOTHING


@dataclass(frozen=True, slots=True)
class NoDrafterFactory:
    """The drafter of the NONE algorithm (target-only decoding).

    A base for a factory of your own that needs nothing and sends nothing across
    disaggregation: it inherits ``needs`` and ``prefill_payload``. ``create_drafter`` returns a
    ``Drafter[Any]``, so an override may return any drafter (a :class:`NoDrafter` subclass or
    not); annotate it with the algorithm's ``Drafter[DraftT]``, so mypy checks the drafter there
    and names the member that does not fit.
    """

    @property
    def needs(self) -> DrafterNeeds:
        """Nothing."""
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> Drafter[Any]:
        """A drafter that proposes nothing (a :class:`NoDrafter`, which admits any draft input)."""
        return NoDrafter()

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels."""
        return _NOTHING


# -- prompt lookup -----------------------------------------------------------------------------


def _find(history: list[int], min_ngram: int, max_ngram: int, steps: int) -> list[int]:
    """The continuation of the latest earlier occurrence of the longest matching suffix."""
    if max(history) < 256:  # byte vocabulary: bytes.rfind searches in C
        text = bytes(history)
        for n in range(min(max_ngram, len(text) - 1), min_ngram - 1, -1):
            at = text.rfind(text[-n:], 0, len(text) - 1)
            if at >= 0 and at + n < len(text):
                return list(text[at + n : at + n + steps])
        return []
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        tail = history[-n:]
        for at in range(len(history) - n - 1, -1, -1):
            if history[at : at + n] == tail:
                return history[at + n : at + n + steps]
    return []


class NgramDrafter:
    """Prompt lookup over the request's committed tokens (read from the target's request pool)."""

    def __init__(
        self, min_ngram: int, max_ngram: int, target_tokens: Callable[[int], Sequence[int]]
    ) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.target_tokens = target_tokens

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """Nothing to set up: the history is the target's."""
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Nothing was kept."""

    def propose(self, step: DraftStep) -> DraftTree:
        """Looked-up continuations, each row padded with its last token; ``lengths`` = found."""
        steps = step.max_nodes
        rows, found = [], []
        for slot, last in zip(step.slots, step.bonus_tokens.tolist(), strict=True):
            history = [*self.target_tokens(slot), int(last)]
            got = _find(history, self.min_ngram, self.max_ngram, steps) if steps else []
            found.append(len(got))
            rows.append(got + [got[-1] if got else int(last)] * (steps - len(got)))
        dev = step.bonus_tokens.device
        tokens = torch.tensor(rows, dtype=torch.int64, device=dev).reshape(len(rows), steps)
        return DraftTree.chain(tokens, lengths=torch.tensor(found, dtype=torch.int64, device=dev))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Nothing to learn: the accepted tokens land in the target's request pool."""
        return _NOTHING


@dataclass(frozen=True, slots=True, kw_only=True)
class NgramDrafterFactory:
    """Prompt lookup: continue the latest earlier occurrence of the request's last n-gram.

    Tries n-grams of ``max_ngram`` down to ``min_ngram`` tokens (a single token recurs
    everywhere and predicts little; with ragged verify, proposing nothing is cheaper). Reports
    per row how many tokens it found, so a ragged verify runs only those.
    """

    min_ngram: int = 2
    max_ngram: int = 4

    def __post_init__(self) -> None:
        for value in (self.min_ngram, self.max_ngram):
            if not is_int(value):
                raise InvalidConfig(f"n-gram size {value!r} must be an int")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InvalidConfig(
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}: need "
                "1 <= min_ngram <= max_ngram"
            )

    @property
    def needs(self) -> DrafterNeeds:
        """Only the target's committed tokens."""
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> NgramDrafter:
        """A lookup drafter reading the engine's request pool."""
        return NgramDrafter(self.min_ngram, self.max_ngram, context.target_tokens)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the prompt does anyway."""
        return _NOTHING


# -- a draft LM --------------------------------------------------------------------------------


class DraftRows:
    """A drafter's draft rows: one row of its own request pool (a draft LM's) per request,
    allocated at admission and filled at the first proposal (the draft KV never travels, so
    PREBUILT requests start empty too). The runner records which slot holds which row in the
    engine's slot table (:class:`~specstrat.models.KVSlotRows`); nothing is kept here."""

    def __init__(self, runner: DraftKV, target_tokens: Callable[[int], Sequence[int]]) -> None:
        self.runner, self.target_tokens = runner, target_tokens

    def admit(self, slots: Sequence[int]) -> None:
        """A draft row for each of ``slots``."""
        self.runner.alloc_for(slots)

    def release(self, slots: Sequence[int]) -> None:
        """Free the draft KV of those of ``slots`` that have one."""
        self.runner.free_for(slots)

    def behind(self, slots: Sequence[int]) -> tuple[list[int], list[list[int]]]:
        """The draft rows of ``slots``, and the committed tokens each one's KV lacks."""
        own = self.runner.rows_for(slots)
        have = self.runner.cached(own)
        lacking = [list(self.target_tokens(s)[n:]) for s, n in zip(slots, have, strict=True)]
        return own, lacking


class DraftModelDrafter:
    """A small LM with its own KV drafts greedily, one token per forward.

    Its KV holds a prefix of the committed tokens; each proposal first catches up on the
    committed tokens it lacks plus the last verified one (from length 0 after admission, local
    or PREBUILT alike: the draft KV never travels), then decodes. After verification its KV is
    rewound to the drafts the target accepted.
    """

    def __init__(self, runner: DraftKV, target_tokens: Callable[[int], Sequence[int]]) -> None:
        self.runner = runner
        self.rows = DraftRows(runner, target_tokens)

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """A draft row per request (filled at the first proposal)."""
        self.rows.admit(admission.slots)
        return _NOTHING

    def release(self, slots: Sequence[int]) -> None:
        """Free the requests' draft KV."""
        self.rows.release(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        """``max_nodes`` tokens from the draft LM (none when T = 1): a chain, one token per
        forward, or the step's top-k tree, one forward per depth."""
        bs, steps, dev = len(step.slots), step.max_nodes, step.bonus_tokens.device
        if not steps or not bs:
            return _empty_tree(bs, dev)
        own, lacking = self.rows.behind(step.slots)
        lasts = step.bonus_tokens.tolist()
        catch_up = [[*tokens, int(last)] for tokens, last in zip(lacking, lasts, strict=True)]
        logits, _ = self.runner.extend(own, catch_up)
        ends = torch.tensor([len(c) for c in catch_up], device=logits.device).cumsum(0) - 1
        if not step.shape.is_chain:
            return self._tree(step, own, logits[ends])
        chooser = DraftChooser(step)
        token = chooser.pick(logits[ends])
        for _ in range(steps - 1):
            logits, _ = self.runner.extend(own, [[t] for t in token.tolist()])
            token = chooser.pick(logits)
        return chooser.tree(dev)

    def _tree(self, step: DraftStep, own: list[int], root_logits: torch.Tensor) -> DraftTree:
        """EAGLE-2's top-k tree over the draft LM: each depth's kept nodes run in one
        tree-attention forward (each sees the prefix, its ancestors and itself); the tree's KV
        is dropped afterwards, so the draft KV ends at the root."""
        shape, bs = step.shape, len(step.slots)
        k, dev = shape.topk, root_logits.device
        root_len = self.runner.cached(own)
        expansion = TreeExpansion(shape)
        expansion.start(root_logits.log_softmax(-1))
        rows = torch.zeros(bs, k, 0, dtype=torch.bool, device=dev)  # frontier's ancestor columns
        placed = 0
        for depth in range(1, shape.num_steps):
            eye = torch.eye(k, dtype=torch.bool, device=dev).expand(bs, k, k)
            mask = torch.cat([rows, eye], dim=2)  # [bs, k, placed + k]
            positions = (step.seq_lens.to(dev) + depth)[:, None].expand(bs, k)
            logits, _ = self.runner.extend_tree(own, expansion.frontier, positions, mask)
            parent = expansion.expand(logits.log_softmax(-1).view(bs, k, -1))
            rows = mask.gather(1, parent[:, :, None].expand(-1, -1, mask.shape[2]))
            placed += k
        for slot, length in zip(own, root_len, strict=True):
            self.runner.rewind(slot, length)
        return expansion.tree(torch.full((bs,), step.max_nodes, dtype=torch.int64, device=dev))

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """Keep the draft KV of accepted drafts only (drafting fed all but the last draft; a
        tree's KV is gone already: the next catch-up feeds the accepted path)."""
        steps = outcome.drafts.num_nodes
        if steps and outcome.step.shape.is_chain:
            accepted = outcome.acceptance.accept_lengths.tolist()
            seq_lens = outcome.step.seq_lens.tolist()
            own = self.runner.rows_for(outcome.step.slots)
            for row, a, n in zip(own, accepted, seq_lens, strict=True):
                self.runner.rewind(row, n + 1 + min(int(a), steps - 1))
        return _NOTHING


def draft_lm_drafter(context: DrafterContext, draft: CausalLM) -> DraftModelDrafter:
    """A drafter over ``draft`` in a KV runner of its own, once the tree's ``topk`` fits the
    draft's vocabulary (the draft-LM and early-exit factories both build theirs so)."""
    vocab = draft.shape.vocab_size
    if context.tree is not None and context.tree.topk > vocab:
        raise InvalidConfig(
            f"tree topk={context.tree.topk} exceeds the draft LM's vocabulary of {vocab} "
            f"tokens; use topk <= {vocab}"
        )
    return DraftModelDrafter(context.new_kv_runner(draft), context.target_tokens)


@dataclass(frozen=True, slots=True)
class DraftModelDrafterFactory:
    """Drafts with the loaded draft LM (``models.draft``) in a KV cache of its own."""

    @property
    def needs(self) -> DrafterNeeds:
        """A draft LM with its own KV; drafts trees too."""
        return DrafterNeeds(draft_model=True, trees=True)

    def create_drafter(self, context: DrafterContext) -> DraftModelDrafter:
        """A drafter over a KV runner the engine makes for the draft LM."""
        draft = context.models.draft
        if draft is None:
            raise InvalidConfig(
                "DraftModelDrafterFactory needs a draft LM but models.draft is None; load "
                "one (EmbeddedModels.load(), or ModelSet(target=..., draft=...))"
            )
        return draft_lm_drafter(context, draft)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the decode side rebuilds the draft KV from the prompt."""
        return _NOTHING
