# expect: return-value Drafter[None]
# member: commit
from collections.abc import Sequence

import torch

from specstrat import (
    Capabilities,
    DraftAdmission,
    Drafter,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    LoadedModels,
    RelayPayload,
    SpecAlgorithm,
)

from specstrat.strategies import (
    OffsetVerifyPolicy,
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    SlotFutureMapFactory,
)


class ForgetfulDrafter:  # never learns what the target accepted: no commit
    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None: ...

    def propose(self, step: DraftStep) -> DraftTree:
        return DraftTree.chain(step.bonus_tokens[:, None])


class ForgetfulDrafterFactory:
    @property
    def needs(self) -> DrafterNeeds:
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> Drafter[None]:
        return ForgetfulDrafter()

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return RelayPayload()


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OffsetVerifyPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=ForgetfulDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
