"""Calling a strategy hook: :class:`~specstrat._hooks.HookCall`, the one wrapper (a core
module, so the algorithm type uses it too), under the runtime's import path."""

from specstrat._hooks import HookCall as HookCall
from specstrat._hooks import call_hook as call_hook
from specstrat._hooks import call_start_hook as call_start_hook

__all__ = ["HookCall", "call_hook", "call_start_hook"]
