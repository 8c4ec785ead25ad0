# expect: call-arg positional
from specstrat import (
    Capabilities,
    FixedWidthVerifyPolicy,
    GreedyAcceptance,
    NoDraftStateDisaggDraftBuilder,
    NoDrafterFactory,
    SlotFutureMapFactory,
    SpecAlgorithm,
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
