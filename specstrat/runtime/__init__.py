"""The plain scheduler: runs any composed algorithm end to end, on the embedded models or yours.

Everything else under ``specstrat.runtime`` is private (``_`` modules); the 0.3.0 module paths
and the names ``GraphRunner``, ``ModelWorker`` and ``ForwardBatch`` still work through 0.4.x,
with a deprecation warning.
"""

from typing import TYPE_CHECKING

from specstrat._deprecation import moved_names as _moved_names
from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._disagg import run_disaggregated
from specstrat.runtime._engine import Engine
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._models import EMBEDDED_WEIGHTS, EmbeddedModels
from specstrat.runtime._requests import EngineConfig, Request, RunStats

if TYPE_CHECKING:  # the deprecated names keep their static types
    from specstrat.runtime._forward import ForwardBatch as ForwardBatch
    from specstrat.runtime._graph_runner import GraphRunner as GraphRunner
    from specstrat.runtime._worker import ModelWorker as ModelWorker

__all__ = [
    "EMBEDDED_WEIGHTS",
    "EmbeddedModels",
    "Engine",
    "EngineConfig",
    "ForwardMode",
    "Request",
    "RunStats",
    "TransferBatch",
    "run_disaggregated",
]

if not TYPE_CHECKING:  # at run time only: type checkers keep flagging unknown names
    __getattr__ = _moved_names(
        __name__,
        {
            "ForwardBatch": "specstrat.runtime._forward:ForwardBatch",
            "GraphRunner": "specstrat.runtime._graph_runner:GraphRunner",
            "ModelWorker": "specstrat.runtime._worker:ModelWorker",
        },
    )
