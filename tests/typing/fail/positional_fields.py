# expect: call-arg positional
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    OffsetVerifyPolicy,
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
)

ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    "BROKEN",
    Capabilities(),
    OffsetVerifyPolicy(),
    SlotFutureMapFactory(),
    NoDraftStateDisaggDraftBuilder(),
    NoDrafterFactory(),
    GreedyAcceptance(),
)
