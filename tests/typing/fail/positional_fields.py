# expect: call-arg positional
from specstrat import (
    Capabilities,
    FixedWidthVerifyPolicy,
    NoDraftStateDisaggDraftBuilder,
    SlotFutureMapFactory,
    SpecAlgorithm,
)

ALGO: SpecAlgorithm[None] = SpecAlgorithm(
    "BROKEN",
    Capabilities(),
    FixedWidthVerifyPolicy(),
    SlotFutureMapFactory(),
    NoDraftStateDisaggDraftBuilder(),
)
