"""The plain scheduler: runs any composed algorithm end to end, on the embedded models or yours."""

from specstrat.runtime.admission import TransferBatch
from specstrat.runtime.engine import Engine
from specstrat.runtime.forward import ForwardBatch, ForwardMode
from specstrat.runtime.graph_runner import GraphRunner
from specstrat.runtime.models import EMBEDDED_WEIGHTS, EmbeddedModels
from specstrat.runtime.requests import EngineConfig, Request, RunStats
from specstrat.runtime.worker import ModelWorker

__all__ = [
    "EMBEDDED_WEIGHTS",
    "EmbeddedModels",
    "Engine",
    "EngineConfig",
    "ForwardBatch",
    "ForwardMode",
    "GraphRunner",
    "ModelWorker",
    "Request",
    "RunStats",
    "TransferBatch",
]
