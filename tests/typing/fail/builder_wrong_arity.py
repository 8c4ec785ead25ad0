# expect: arg-type disagg
import torch

from specstrat import Capabilities, PrebuiltBatch, SpecAlgorithm

from specstrat.strategies import (
    OffsetVerifyPolicy,
    GreedyAcceptance,
    NoDrafterFactory,
    SlotFutureMapFactory,
)


class NoRelayBuilder:
    def build_disagg_draft_input(self, batch: PrebuiltBatch, last_tokens: torch.Tensor) -> None:
        return None


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OffsetVerifyPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoRelayBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
