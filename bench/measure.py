"""What the bench scripts measure with: an aten op counter and median wall-clock timers."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Allocations and wrapping that launch no kernel on a GPU.
_FREE = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.lift_fresh.default,
}


class OpCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the aten ops dispatched: all of them, the kernel-launching ones, host syncs."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = 0
        self.launches = 0
        self.syncs = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        elif func not in _FREE and not func.is_view:
            self.launches += 1
        return func(*args, **(kwargs or {}))


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_median_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each call's median time in ms over ``repeats`` rounds, the calls interleaved in each."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}
