"""Counting the host reads of a decode step, as a GPU would pay them: each one is a sync.

A device-to-host read is ``_local_scalar_dense`` in the dispatcher (``.item()``, ``bool(t)``,
``int(t)``), as ``bench/metadata.py`` counts it, plus every ``Tensor.tolist()`` and
``Tensor.cpu()`` call, which copy the whole tensor to the host (on a CPU run they dispatch
nothing, so they are counted at the call). Only calls on the thread running
``StepRunner.decode`` count, so the overlap mode's scheduler thread adds nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specstrat.runtime._step import StepRunner

__all__ = ["StepReads", "count_step_reads"]


@dataclass(frozen=False, slots=True)
class StepReads:
    """Host reads counted over ``steps`` decode steps."""

    reads: int = 0
    steps: int = 0

    @property
    def per_step(self) -> float:
        """Mean host reads per decode step."""
        return self.reads / self.steps if self.steps else 0.0


class _ScalarReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, counts: StepReads) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.counts.reads += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_step_reads() -> Iterator[StepReads]:
    """Count the host reads of every ``StepRunner.decode`` call made inside the block."""
    counts = StepReads()
    inside = threading.local()
    real_decode = StepRunner.decode
    real_tolist, real_cpu = torch.Tensor.tolist, torch.Tensor.cpu

    def counted(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "on", False):
                counts.reads += 1
            return real(self, *args, **kwargs)

        return call

    def decode(self: StepRunner, *args: Any, **kwargs: Any) -> Any:
        inside.on = True
        try:
            with _ScalarReads(counts):
                return real_decode(self, *args, **kwargs)
        finally:
            inside.on = False
            counts.steps += 1

    StepRunner.decode = decode  # type: ignore[method-assign]
    torch.Tensor.tolist = counted(real_tolist)  # type: ignore[method-assign]
    torch.Tensor.cpu = counted(real_cpu)  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        StepRunner.decode = real_decode  # type: ignore[method-assign]
        torch.Tensor.tolist = real_tolist  # type: ignore[method-assign]
        torch.Tensor.cpu = real_cpu  # type: ignore[method-assign]
