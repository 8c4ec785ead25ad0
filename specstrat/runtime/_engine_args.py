"""The checks of what a caller hands :class:`~specstrat.runtime._engine.Engine`: the algorithm,
the models and ``run()``'s arguments, each refused by name before anything changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig
from specstrat.models import CausalLM, LoadedModels
from specstrat.registry import get
from specstrat.runtime._requests import Request

__all__ = ["check_algorithm", "check_models", "check_run_arguments"]


def check_algorithm(algo: object) -> SpecAlgorithm[Any]:
    """``algo``, or the registered algorithm it names."""
    if isinstance(algo, str):
        return get(algo)
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(
            f"algo={algo!r} ({type(algo).__name__}); pass a SpecAlgorithm or a registered name "
            "such as 'EAGLE'"
        )
    return algo


def check_models(models: object) -> LoadedModels:
    """``models``, if it is a LoadedModels whose target is a CausalLM."""
    target = getattr(models, "target", None)
    if (
        not isinstance(target, CausalLM)
        or not hasattr(models, "draft")
        or not hasattr(models, "head")
    ):
        raise InvalidConfig(
            f"models={type(models).__name__}; pass EmbeddedModels.load() or "
            "specstrat.ModelSet(target=..., draft=..., head=...) whose target is a CausalLM"
        )
    return models  # type: ignore[return-value]


def check_run_arguments(requests: object, progress: object, source: object, trace: object) -> None:
    """run()'s arguments, checked before anything changes."""
    if isinstance(requests, Request) or not isinstance(requests, Sequence | tuple | list):
        raise InvalidConfig(
            f"requests={type(requests).__name__}; pass a list of Requests (e.g. [request])"
        )
    for name, value in (("progress", progress), ("source", source)):
        if value is not None and not callable(value):
            raise InvalidConfig(f"{name}={value!r} is not callable; pass a function or None")
    if trace is None:
        return
    if getattr(trace, "closed", False) or not callable(getattr(trace, "write", None)):
        raise InvalidConfig(
            f"trace={trace!r}; pass an open text stream, e.g. open('trace.jsonl', 'w')"
        )
    try:
        trace.write("")  # type: ignore[attr-defined]  # a binary stream refuses str here
    except (TypeError, ValueError, OSError) as exc:
        raise InvalidConfig(
            f"trace={trace!r} does not take text ({type(exc).__name__}: {exc}); open it in "
            "text mode ('w')"
        ) from exc
