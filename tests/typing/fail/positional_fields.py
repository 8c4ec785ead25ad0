# expect: call-arg positional
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import (
    FixedWidthVerifyPolicy,
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
)

ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    "BROKEN",
    Capabilities(),
    FixedWidthVerifyPolicy(),
    SlotFutureMapFactory(),
    NoDraftStateDisaggDraftBuilder(),
    NoDrafterFactory(),
    GreedyAcceptance(),
)
