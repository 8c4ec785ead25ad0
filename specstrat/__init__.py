"""specstrat: compose, type-check and property-test speculative-decoding algorithms.

An algorithm is a frozen :class:`SpecAlgorithm` composed from one strategy per hook
(:mod:`specstrat.protocols`); built-in strategies live in :mod:`specstrat.strategies`, the
TARGET_VERIFY metadata kernels in :mod:`specstrat.kernels`, the test kit in
:mod:`specstrat.testing`.
"""

from specstrat.algorithm import Capabilities, SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.builtins import BUILTINS, DFLASH, DSPARK, EAGLE, EAGLE3, NGRAM, NONE, STANDALONE
from specstrat.errors import (
    ConformanceError,
    DisaggError,
    EngineStateError,
    InvalidConfig,
    InvalidStrategy,
    KernelError,
    PluginLoadError,
    RegistrationError,
    RelayError,
    SpecstratError,
    StrategyError,
    UnknownAlgorithm,
)
from specstrat.protocols import (
    DisaggDraftBuilder,
    FutureMap,
    FutureMapFactory,
    TargetVerifyPolicy,
)
from specstrat.registry import ENTRY_POINT_GROUP, Registry, get, names, register
from specstrat.relay import RelayPayload
from specstrat.strategies import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    FixedWidthVerifyPolicy,
    NoDraftStateDisaggDraftBuilder,
    RingFutureMapFactory,
    SlotFutureMapFactory,
)

__version__ = "0.1.0"

__all__ = [
    "BUILTINS",
    "DFLASH",
    "DSPARK",
    "EAGLE",
    "EAGLE3",
    "ENTRY_POINT_GROUP",
    "NGRAM",
    "NONE",
    "STANDALONE",
    "Capabilities",
    "ConformanceError",
    "DflashDisaggDraftBuilder",
    "DflashDraftInput",
    "DisaggDraftBuilder",
    "DisaggError",
    "DsparkDisaggDraftBuilder",
    "DsparkDraftInput",
    "EagleDisaggDraftBuilder",
    "EagleDraftInput",
    "EngineStateError",
    "FixedWidthVerifyPolicy",
    "FutureMap",
    "FutureMapFactory",
    "InvalidConfig",
    "InvalidStrategy",
    "KernelError",
    "NoDraftStateDisaggDraftBuilder",
    "PluginLoadError",
    "PrebuiltBatch",
    "RegistrationError",
    "Registry",
    "RelayError",
    "RelayPayload",
    "RingFutureMapFactory",
    "SlotFutureMapFactory",
    "SpecAlgorithm",
    "SpecstratError",
    "StrategyError",
    "TargetVerifyPolicy",
    "UnknownAlgorithm",
    "__version__",
    "get",
    "names",
    "register",
]
