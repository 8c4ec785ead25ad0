"""Calling a strategy hook: any exception it raises becomes a StrategyError naming the hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from specstrat.contracts import hook_error
from specstrat.errors import StrategyError

__all__ = ["call_hook"]

P = ParamSpec("P")
R = TypeVar("R")


def call_hook(
    algorithm: str, hook: str, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    """``fn(*args, **kwargs)``; an ``Exception`` from it is re-raised as a StrategyError that
    names ``algorithm.hook`` with the original chained (KeyboardInterrupt and other
    ``BaseException``s pass through unchanged)."""
    try:
        return fn(*args, **kwargs)
    except StrategyError:
        raise
    except Exception as exc:
        raise hook_error(algorithm, hook, f"raised {type(exc).__name__}: {exc}") from exc
