"""Prefill/decode disaggregation: the wire format, the prefill side, and the two processes."""

from specstrat.runtime._disagg.prefill import PrefillWorker
from specstrat.runtime._disagg.process import DisaggResult, backend_for, run_disaggregated
from specstrat.runtime._disagg.wire import recv_transfer, send_transfer

__all__ = [
    "DisaggResult",
    "PrefillWorker",
    "backend_for",
    "recv_transfer",
    "run_disaggregated",
    "send_transfer",
]
