# expect: arg-type FirstMatch
from collections.abc import Sequence
from dataclasses import replace

import torch

from specstrat import (
    EAGLE,
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
from specstrat.strategies import DsparkDraftInput, EagleDraftInput, FirstMatch, NgramDrafterFactory


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

    def create_drafter(self, context: DrafterContext) -> Drafter[DsparkDraftInput]:
        return DsparkOnlyDrafter()

    def prefill_payload(
        self, models: LoadedModels, first_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return RelayPayload()


# A member that admits only DSPARK's draft input, in an algorithm whose builder hands EAGLE's.
ALGO: SpecAlgorithm[EagleDraftInput] = replace(
    EAGLE, drafter=FirstMatch((NgramDrafterFactory(), DsparkOnlyDrafterFactory()))
)
