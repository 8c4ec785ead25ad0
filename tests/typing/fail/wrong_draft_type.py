# expect: arg-type DisaggDraftBuilder[EagleDraftInput]
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    DsparkDisaggDraftBuilder,
    EagleDraftInput,
    FixedWidthVerifyPolicy,
    GreedyAcceptance,
    NoDrafterFactory,
    SlotFutureMapFactory,
)

ALGO: SpecAlgorithm[EagleDraftInput] = SpecAlgorithm(
    name="BROKEN",
    capabilities=Capabilities(),
    target_verify=FixedWidthVerifyPolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=DsparkDisaggDraftBuilder(),
    drafter=NoDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
