"""Calling a strategy hook: any exception it raises becomes a StrategyError naming the hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from specstrat.contracts import hook_error
from specstrat.errors import ModelShapeError, StrategyError

__all__ = ["call_hook"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def call_hook(
    algorithm: str, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
) -> _R:
    """``fn(*args, **kwargs)``; an ``Exception`` from it is re-raised as a StrategyError that
    names ``algorithm.hook`` with the original chained (KeyboardInterrupt and other
    ``BaseException``s pass through unchanged). A ModelShapeError passes through too: a draft
    model whose outputs disagree with its shape is the model's fault, not the drafter's that
    ran it."""
    try:
        return fn(*args, **kwargs)
    except (StrategyError, ModelShapeError):
        raise
    except Exception as exc:
        raise hook_error(algorithm, hook, f"raised {type(exc).__name__}: {exc}") from exc
