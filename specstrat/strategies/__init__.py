"""Built-in strategies, one module per hook family."""

from specstrat.strategies.acceptance import (
    GreedyAcceptance,
    RejectionSamplingAcceptance,
    TypicalAcceptance,
)
from specstrat.strategies.block import (
    BlockDrafter,
    BlockDrafterFactory,
    BlockLayout,
    block_layout,
)
from specstrat.strategies.disagg import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    NoDraftStateDisaggDraftBuilder,
)
from specstrat.strategies.drafters import (
    DraftModelDrafter,
    DraftModelDrafterFactory,
    NgramDrafter,
    NgramDrafterFactory,
    NoDrafter,
    NoDrafterFactory,
)
from specstrat.strategies.eagle_context import ContextHeadDrafter
from specstrat.strategies.eagle_head import EagleHeadDrafter, EagleHeadDrafterFactory
from specstrat.strategies.early_exit import EarlyExitDrafterFactory
from specstrat.strategies.first_match import FirstMatch, FirstMatchDrafter
from specstrat.strategies.forced_acceptance import ForcedAcceptance
from specstrat.strategies.future_map import (
    RingFutureMap,
    RingFutureMapFactory,
    SlotFutureMap,
    SlotFutureMapFactory,
    ring_capacity,
)
from specstrat.strategies.speculation_policies import (
    BatchScheduleSpeculationPolicy,
    EmaLadderSpeculationPolicy,
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
)
from specstrat.strategies.tree import ChainTree, TopkTree
from specstrat.strategies.verify_policies import OffsetVerifyPolicy

__all__ = [
    "ChainTree",
    "TopkTree",
    "BlockDrafter",
    "BlockDrafterFactory",
    "BlockLayout",
    "block_layout",
    "DflashDisaggDraftBuilder",
    "DraftModelDrafter",
    "DraftModelDrafterFactory",
    "ContextHeadDrafter",
    "EagleHeadDrafter",
    "FirstMatch",
    "FirstMatchDrafter",
    "EagleHeadDrafterFactory",
    "EarlyExitDrafterFactory",
    "ForcedAcceptance",
    "GreedyAcceptance",
    "RejectionSamplingAcceptance",
    "TypicalAcceptance",
    "NgramDrafter",
    "NgramDrafterFactory",
    "NoDrafter",
    "NoDrafterFactory",
    "DflashDraftInput",
    "DsparkDisaggDraftBuilder",
    "DsparkDraftInput",
    "EagleDisaggDraftBuilder",
    "EagleDraftInput",
    "OffsetVerifyPolicy",
    "NoDraftStateDisaggDraftBuilder",
    "RingFutureMap",
    "RingFutureMapFactory",
    "SlotFutureMap",
    "SlotFutureMapFactory",
    "ring_capacity",
    "BatchScheduleSpeculationPolicy",
    "EmaLadderSpeculationPolicy",
    "FixedSpeculationPolicy",
    "GoodputSpeculationPolicy",
]
