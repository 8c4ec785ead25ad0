"""The check every fault-injection test of a trained drafter ends with."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import EngineStateError, StrategyError
from specstrat.hf import HFModels, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, Request


def assert_fault_leaks_nothing(
    algo: SpecAlgorithm[Any],
    models: HFModels,
    requests: Sequence[Request],
    config: EngineConfig,
    fault: str,
    *,
    broken_models: HFModels | None = None,
    injected: contextlib.AbstractContextManager[Any] | None = None,
) -> None:
    """A run on ``broken_models`` (default ``models``), inside ``injected`` when given, ends
    naming ``fault`` with every slot and KV index freed; the broken engine refuses another run,
    and a fresh engine on ``models`` is greedy-lossless."""
    with injected if injected is not None else contextlib.nullcontext():
        broken = Engine(algo, broken_models or models, config)
        before = (broken.free_slots, broken.free_kv_tokens)
        with pytest.raises((StrategyError, RuntimeError), match=fault):
            broken.run(list(requests))
    assert (broken.free_slots, broken.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"this engine was closed after a failed run"):
        broken.run(list(requests))
    outputs = Engine(algo, models, config).run(list(requests))
    check = compare(models.target, requests, outputs, generate_reference(models.target, requests))
    assert check.lossless, check.line()
