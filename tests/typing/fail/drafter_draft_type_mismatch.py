# expect: return-value Drafter[EagleDraftInput]
# member: admit
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
    StepOutcome,
)

from specstrat.strategies import (
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    OffsetVerifyPolicy,
    GreedyAcceptance,
    SlotFutureMapFactory,
)


class DsparkOnlyDrafter:
    def admit(self, admission: DraftAdmission[DsparkDraftInput]) -> RelayPayload:
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None: ...

    def propose(self, step: DraftStep) -> DraftTree:
        return DraftTree.chain(step.bonus_tokens[:, None])

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        return RelayPayload()


class DsparkOnlyDrafterFactory:
    @property
    def needs(self) -> DrafterNeeds:
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> Drafter[EagleDraftInput]:
        return DsparkOnlyDrafter()

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return RelayPayload()


ALGO: SpecAlgorithm[EagleDraftInput] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OffsetVerifyPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=EagleDisaggDraftBuilder(),
    drafter=DsparkOnlyDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
