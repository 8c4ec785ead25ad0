"""specstrat: compose, type-check and property-test speculative-decoding algorithms.

An algorithm is a frozen :class:`SpecAlgorithm` composed from one strategy per hook
(:mod:`specstrat.protocols`); built-in strategies live in :mod:`specstrat.strategies`, the
TARGET_VERIFY metadata kernels in :mod:`specstrat.kernels`, the test kit in
:mod:`specstrat.testing`.
"""

from typing import TYPE_CHECKING

from specstrat._deprecation import moved_names as _moved_names
from specstrat.algorithm import Capabilities, SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.builtins import BUILTINS, DFLASH, DSPARK, EAGLE, EAGLE3, NGRAM, NONE, STANDALONE
from specstrat.drafting import (
    GREEDY,
    Acceptance,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    SamplingParams,
    StepOutcome,
    TreeShape,
    VerifyInputs,
)
from specstrat.errors import (
    CapacityError,
    ConformanceError,
    DisaggError,
    EngineStateError,
    IntegrationError,
    InternalError,
    InvalidConfig,
    InvalidStrategy,
    KernelError,
    ModelLoadError,
    ModelShapeError,
    PluginLoadError,
    RegistrationError,
    RelayError,
    SpecstratError,
    StrategyError,
    UnknownAlgorithm,
)
from specstrat.models import (
    AttentionBackend,
    BlockDraftModel,
    BlockKV,
    CausalLM,
    DraftHead,
    DraftKV,
    EarlyExitModel,
    LoadedModels,
    ModelSet,
    ModelShape,
)
from specstrat.protocols import (
    AcceptanceRule,
    DisaggDraftBuilder,
    DraftAdmitter,
    Drafter,
    DrafterFactory,
    DraftProposer,
    FutureMap,
    FutureMapFactory,
    SpeculationPolicy,
    TargetVerifyPolicy,
    TreePolicy,
    WidthChooser,
)
from specstrat.registry import ENTRY_POINT_GROUP, Registry, get, names, register
from specstrat.relay import RelayPayload
from specstrat.speculation import SpeculationObservation

if TYPE_CHECKING:  # the deprecated top-level strategy names keep their static types
    from specstrat.strategies import BlockDrafterFactory as BlockDrafterFactory
    from specstrat.strategies import ChainTree as ChainTree
    from specstrat.strategies import DflashDisaggDraftBuilder as DflashDisaggDraftBuilder
    from specstrat.strategies import DflashDraftInput as DflashDraftInput
    from specstrat.strategies import DraftModelDrafterFactory as DraftModelDrafterFactory
    from specstrat.strategies import DsparkDisaggDraftBuilder as DsparkDisaggDraftBuilder
    from specstrat.strategies import DsparkDraftInput as DsparkDraftInput
    from specstrat.strategies import EagleDisaggDraftBuilder as EagleDisaggDraftBuilder
    from specstrat.strategies import EagleDraftInput as EagleDraftInput
    from specstrat.strategies import EagleHeadDrafterFactory as EagleHeadDrafterFactory
    from specstrat.strategies import EarlyExitDrafterFactory as EarlyExitDrafterFactory
    from specstrat.strategies import FixedWidthVerifyPolicy as FixedWidthVerifyPolicy
    from specstrat.strategies import GreedyAcceptance as GreedyAcceptance
    from specstrat.strategies import NgramDrafterFactory as NgramDrafterFactory
    from specstrat.strategies import NoDrafterFactory as NoDrafterFactory
    from specstrat.strategies import (
        NoDraftStateDisaggDraftBuilder as NoDraftStateDisaggDraftBuilder,
    )
    from specstrat.strategies import RejectionSamplingAcceptance as RejectionSamplingAcceptance
    from specstrat.strategies import RingFutureMapFactory as RingFutureMapFactory
    from specstrat.strategies import SlotFutureMapFactory as SlotFutureMapFactory
    from specstrat.strategies import TopkTree as TopkTree
    from specstrat.strategies import TypicalAcceptance as TypicalAcceptance

__version__ = "0.4.0"

__all__ = [
    "BlockDraftModel",
    "BlockKV",
    "BUILTINS",
    "DFLASH",
    "DSPARK",
    "EAGLE",
    "EAGLE3",
    "ENTRY_POINT_GROUP",
    "GREEDY",
    "NGRAM",
    "NONE",
    "STANDALONE",
    "Acceptance",
    "AcceptanceRule",
    "AttentionBackend",
    "CapacityError",
    "Capabilities",
    "CausalLM",
    "ConformanceError",
    "DisaggDraftBuilder",
    "DisaggError",
    "DraftAdmission",
    "DraftAdmitter",
    "DraftHead",
    "DraftKV",
    "EarlyExitModel",
    "DraftProposer",
    "DraftStep",
    "DraftTree",
    "Drafter",
    "DrafterContext",
    "DrafterFactory",
    "DrafterNeeds",
    "EngineStateError",
    "FutureMap",
    "FutureMapFactory",
    "IntegrationError",
    "InternalError",
    "InvalidConfig",
    "InvalidStrategy",
    "KernelError",
    "ModelLoadError",
    "LoadedModels",
    "ModelSet",
    "ModelShape",
    "ModelShapeError",
    "PluginLoadError",
    "PrebuiltBatch",
    "RegistrationError",
    "Registry",
    "RelayError",
    "RelayPayload",
    "SamplingParams",
    "SpecAlgorithm",
    "SpecstratError",
    "SpeculationObservation",
    "SpeculationPolicy",
    "StepOutcome",
    "StrategyError",
    "TargetVerifyPolicy",
    "TreePolicy",
    "WidthChooser",
    "TreeShape",
    "UnknownAlgorithm",
    "VerifyInputs",
    "__version__",
    "get",
    "names",
    "register",
]

# Strategies are importable from specstrat.strategies; their 0.3.0 top-level names still work.
if not TYPE_CHECKING:  # at run time only: type checkers keep flagging unknown names
    __getattr__ = _moved_names(
        __name__,
        {
            "BlockDrafterFactory": "specstrat.strategies:BlockDrafterFactory",
            "ChainTree": "specstrat.strategies:ChainTree",
            "DflashDisaggDraftBuilder": "specstrat.strategies:DflashDisaggDraftBuilder",
            "DflashDraftInput": "specstrat.strategies:DflashDraftInput",
            "DraftModelDrafterFactory": "specstrat.strategies:DraftModelDrafterFactory",
            "DsparkDisaggDraftBuilder": "specstrat.strategies:DsparkDisaggDraftBuilder",
            "DsparkDraftInput": "specstrat.strategies:DsparkDraftInput",
            "EagleDisaggDraftBuilder": "specstrat.strategies:EagleDisaggDraftBuilder",
            "EagleDraftInput": "specstrat.strategies:EagleDraftInput",
            "EagleHeadDrafterFactory": "specstrat.strategies:EagleHeadDrafterFactory",
            "EarlyExitDrafterFactory": "specstrat.strategies:EarlyExitDrafterFactory",
            "FixedWidthVerifyPolicy": "specstrat.strategies:FixedWidthVerifyPolicy",
            "GreedyAcceptance": "specstrat.strategies:GreedyAcceptance",
            "NgramDrafterFactory": "specstrat.strategies:NgramDrafterFactory",
            "NoDrafterFactory": "specstrat.strategies:NoDrafterFactory",
            "NoDraftStateDisaggDraftBuilder": "specstrat.strategies:NoDraftStateDisaggDraftBuilder",
            "RejectionSamplingAcceptance": "specstrat.strategies:RejectionSamplingAcceptance",
            "RingFutureMapFactory": "specstrat.strategies:RingFutureMapFactory",
            "SlotFutureMapFactory": "specstrat.strategies:SlotFutureMapFactory",
            "TopkTree": "specstrat.strategies:TopkTree",
            "TypicalAcceptance": "specstrat.strategies:TypicalAcceptance",
        },
    )
