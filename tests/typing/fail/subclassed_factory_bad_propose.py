# expect: return-value Drafter[None]
# member: propose
"""The README's shape (a NoDrafterFactory subclass) with a drafter of its own that forgets to
wrap its tokens in a DraftTree: mypy names propose, and the base class binds nothing."""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat import DraftAdmission, Drafter, DrafterContext, DraftStep, RelayPayload, StepOutcome
from specstrat.strategies import NoDrafterFactory


class RepeatDrafter:  # not a NoDrafter: every method its own
    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None: ...

    def propose(self, step: DraftStep) -> torch.Tensor:
        return step.bonus_tokens[:, None].expand(-1, step.max_nodes).contiguous()

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        return RelayPayload()


@dataclass(frozen=True, slots=True)
class RepeatDrafterFactory(NoDrafterFactory):
    def create_drafter(self, context: DrafterContext) -> Drafter[None]:
        return RepeatDrafter()
