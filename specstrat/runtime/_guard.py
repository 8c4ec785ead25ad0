"""Calling a strategy hook: :class:`~specstrat.contracts.HookCall`, the one wrapper (defined
with the contracts so the algorithm type uses it too), under the runtime's import path."""

from specstrat.contracts import HookCall as HookCall
from specstrat.contracts import call_hook as call_hook
from specstrat.contracts import call_start_hook as call_start_hook

__all__ = ["HookCall", "call_hook", "call_start_hook"]
