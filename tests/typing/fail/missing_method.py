# expect: arg-type target_verify
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
)


class OnlySupportsPolicy:
    def supports_target_verify_for_draft(self) -> bool:
        return False


ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OnlySupportsPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
