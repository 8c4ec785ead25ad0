"""The plain scheduler: runs any composed algorithm end to end, on the embedded models or yours.

Everything else under ``specstrat.runtime`` is private (``_`` modules).
"""

from specstrat.runtime._admission import TransferBatch
from specstrat.runtime._disagg import run_disaggregated
from specstrat.runtime._disagg.process import ModelLoader
from specstrat.runtime._embedded_workload import workload
from specstrat.runtime._engine import Engine
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._host_cost import (
    ATTENTION_SCOPE,
    DECODE_STEP_SCOPE,
    FORWARD_SCOPE,
    StepTimer,
    forward_seconds,
    profiled_decode_steps,
    timed_decode_steps,
)
from specstrat.runtime._models import EMBEDDED_WEIGHTS, EmbeddedModels
from specstrat.runtime._next_token import next_token_logits
from specstrat.runtime._requests import EngineConfig, Request, RunStats, acceptance_rates
from specstrat.runtime._reservation import KVReservation, kv_reservation

__all__ = [
    "ATTENTION_SCOPE",
    "DECODE_STEP_SCOPE",
    "EMBEDDED_WEIGHTS",
    "EmbeddedModels",
    "Engine",
    "EngineConfig",
    "FORWARD_SCOPE",
    "ForwardMode",
    "KVReservation",
    "ModelLoader",
    "Request",
    "RunStats",
    "StepTimer",
    "TransferBatch",
    "acceptance_rates",
    "forward_seconds",
    "kv_reservation",
    "next_token_logits",
    "profiled_decode_steps",
    "run_disaggregated",
    "timed_decode_steps",
    "workload",
]
