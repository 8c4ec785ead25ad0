"""Calling a strategy's hook: the one wrapper (:class:`HookCall`) that turns what a hook raises
into a StrategyError naming ``ALGO.hook`` and the user's line (:func:`user_location`).

Two pass-through rules: during a step only errors that already name who is at fault pass
unchanged (a StrategyError; a ModelShapeError, the model's fault rather than the drafter's
that ran it); at construction and start-up any SpecstratError passes, so a factory or policy
refusing the configuration stays the configuration error it raised. A relay's own
:class:`~specstrat.errors.RelayError` names the field but not the algorithm: it is raised again
as a RelayError naming ``ALGO.hook``, its field and writer kept.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from specstrat.contracts import hook_error
from specstrat.errors import ModelShapeError, RelayError, SpecstratError, StrategyError

__all__ = ["HookCall", "call_hook", "call_start_hook", "hook_label", "user_location"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Frames that are not the user's: specstrat's own, the standard library's, installed packages'.
_INSTALLED = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))
_NOT_USERS = tuple(
    {str(Path(p).resolve()) + os.sep for p in (str(Path(__file__).resolve().parent), *_INSTALLED)}
)


def user_location(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: the innermost frame of ``exc``'s traceback in the user's code (not
    specstrat's, the standard library's or an installed package's), or ``""`` if none is."""
    found, tb = "", exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith(_NOT_USERS) and not name.startswith("<"):
            found = f" (at {name}:{tb.tb_lineno})"
        tb = tb.tb_next
    return found


class HookCall:
    """``call(algorithm, hook, fn, *args, **kwargs)`` runs ``fn``; an ``Exception`` from it
    other than ``passes`` is re-raised as a StrategyError naming ``algorithm.hook``, the
    original chained (KeyboardInterrupt and other ``BaseException``s pass unchanged)."""

    def __init__(self, passes: tuple[type[Exception], ...]) -> None:
        self.passes = passes

    def __call__(
        self, algorithm: str, hook: str, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs
    ) -> _R:
        try:
            return fn(*args, **kwargs)
        except RelayError as exc:
            if exc.algorithm is not None:
                raise
            problem = f"raised RelayError: {exc}{user_location(exc)}"
            raise RelayError(
                f"{algorithm}.{hook}: {problem}",
                field=exc.field,
                writer=exc.writer,
                algorithm=algorithm,
            ) from exc
        except self.passes:
            raise
        except Exception as exc:
            problem = f"raised {type(exc).__name__}: {exc}{user_location(exc)}"
            raise hook_error(algorithm, hook, problem) from exc


#: A step's hooks (propose, accept, commit, the relay, ...).
call_hook = HookCall((StrategyError, ModelShapeError))

#: Construction and start-up (policies, factories): a configuration refusal passes.
call_start_hook = HookCall((SpecstratError,))


def hook_label(protocol: type, field: str, impl: object, algorithm: str | None) -> str:
    """How a conformance message names a strategy: ``MY_ALGO.acceptance (FloatAcceptance)`` when
    it is checked as part of the algorithm ``MY_ALGO``, ``AcceptanceRule FloatAcceptance`` alone."""
    kind = type(impl).__name__
    return f"{algorithm}.{field} ({kind})" if algorithm else f"{protocol.__name__} {kind}"
