# expect: arg-type DisaggDraftBuilder[EagleDraftInput]
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    DsparkDisaggDraftBuilder,
    EagleDraftInput,
    OffsetVerifyPolicy,
    GreedyAcceptance,
    NoDrafterFactory,
    SlotFutureMapFactory,
)

ALGO: SpecAlgorithm[EagleDraftInput] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=OffsetVerifyPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=DsparkDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
