"""Built-in strategies, one module per hook family."""

from specstrat.strategies.disagg import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    NoDraftStateDisaggDraftBuilder,
)
from specstrat.strategies.future_map import (
    RingFutureMap,
    RingFutureMapFactory,
    SlotFutureMap,
    SlotFutureMapFactory,
    ring_capacity,
)
from specstrat.strategies.verify import FixedWidthVerifyPolicy

__all__ = [
    "DflashDisaggDraftBuilder",
    "DflashDraftInput",
    "DsparkDisaggDraftBuilder",
    "DsparkDraftInput",
    "EagleDisaggDraftBuilder",
    "EagleDraftInput",
    "FixedWidthVerifyPolicy",
    "NoDraftStateDisaggDraftBuilder",
    "RingFutureMap",
    "RingFutureMapFactory",
    "SlotFutureMap",
    "SlotFutureMapFactory",
    "ring_capacity",
]
