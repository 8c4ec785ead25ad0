"""A custom drafter: follow the request's own bigrams (what came after each token last time)."""

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from specstrat import NGRAM, Drafter, DrafterContext, DraftStep, DraftTree, SpecAlgorithm
from specstrat.strategies import NoDrafter, NoDrafterFactory


class BigramDrafter(NoDrafter):  # admit/commit/release: nothing to keep
    def __init__(self, tokens: Callable[[int], Sequence[int]]) -> None:
        self.tokens = tokens  # the engine's slot table: committed tokens per slot

    def propose(self, step: DraftStep) -> DraftTree:
        rows = []
        for slot, last in zip(step.slots, step.bonus_tokens.tolist(), strict=True):
            history = [*self.tokens(slot), last]
            after = dict(itertools.pairwise(history))  # the latest follower of each token wins
            row = [after.get(last, last)]
            while len(row) < step.max_nodes:
                row.append(after.get(row[-1], row[-1]))
            rows.append(row[: step.max_nodes])
        tokens = torch.tensor(rows, dtype=torch.int64, device=step.bonus_tokens.device)
        return DraftTree.chain(tokens.view(len(rows), step.max_nodes))  # parents j - 1, all real


@dataclass(frozen=True, slots=True)
class BigramDrafterFactory(NoDrafterFactory):  # needs nothing; nothing crosses disaggregation
    def create_drafter(self, context: DrafterContext) -> Drafter[None]:  # mypy checks it here
        return BigramDrafter(context.target_tokens)


BIGRAM: SpecAlgorithm[None] = replace(NGRAM, name="BIGRAM", drafter=BigramDrafterFactory())
