"""A drafter with a draft LM of its own: one draft row per request, held for the request's slot."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from specstrat import (
    STANDALONE,
    DraftAdmission,
    Drafter,
    DrafterContext,
    DrafterNeeds,
    DraftKV,
    DraftStep,
    DraftTree,
    InvalidConfig,
    RelayPayload,
    SpecAlgorithm,
)
from specstrat.strategies import NoDrafter, NoDrafterFactory


class GreedyDraftLMDrafter(NoDrafter):  # commit: nothing to learn
    def __init__(self, runner: DraftKV, tokens: Callable[[int], Sequence[int]]) -> None:
        self.runner, self.tokens = runner, tokens  # tokens: committed tokens per slot

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        self.runner.alloc_for(admission.slots)  # one empty draft row per request, all or none
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None:
        self.runner.free_for(slots)  # the rows these slots hold, and their KV

    def propose(self, step: DraftStep) -> DraftTree:
        bs, n, dev = len(step.slots), step.max_nodes, step.bonus_tokens.device
        if not n or not bs:
            return DraftTree.chain(torch.zeros(bs, 0, dtype=torch.int64, device=dev))
        rows = self.runner.rows_for(step.slots)  # the draft rows, in the step's order
        lasts = step.bonus_tokens.tolist()
        feed = [  # what each draft row lacks: committed tokens, then the bonus token
            [*self.tokens(slot)[cached:], last]
            for slot, cached, last in zip(step.slots, self.runner.cached(rows), lasts, strict=True)
        ]
        logits, _ = self.runner.extend(rows, feed)
        ends = torch.tensor([len(f) for f in feed], device=logits.device).cumsum(0) - 1
        token = logits[ends].argmax(-1)  # each row's prediction after its last fed token
        drafts = [token]
        for _ in range(n - 1):
            logits, _ = self.runner.extend(rows, [[t] for t in token.tolist()])
            token = logits.argmax(-1)
            drafts.append(token)
        for row, length in zip(rows, step.seq_lens.tolist(), strict=True):
            self.runner.rewind(row, int(length) + 1)  # keep the bonus token, drop the drafts
        return DraftTree.chain(torch.stack(drafts, dim=1).to(dev))


@dataclass(frozen=True, slots=True)
class GreedyDraftLMDrafterFactory(NoDrafterFactory):  # nothing crosses disaggregation
    @property
    def needs(self) -> DrafterNeeds:
        return DrafterNeeds(draft_model=True)

    def create_drafter(self, context: DrafterContext) -> Drafter[None]:  # mypy checks it here
        draft = context.models.draft
        if draft is None:
            raise InvalidConfig("GreedyDraftLMDrafterFactory needs models.draft; load a draft LM")
        return GreedyDraftLMDrafter(context.new_kv_runner(draft), context.target_tokens)


GREEDY_DRAFT_LM: SpecAlgorithm[None] = replace(
    STANDALONE, name="GREEDY_DRAFT_LM", drafter=GreedyDraftLMDrafterFactory()
)
