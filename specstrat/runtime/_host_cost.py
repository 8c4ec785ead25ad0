"""Timing an engine's own work inside its decode steps, from outside the engine.

:func:`timed_decode_steps` patches, for the duration of a ``with`` block, the decode step, the
scheduler's plan and absorb, the metadata kernels the runtime calls and the worker's forward,
so that every engine run in the block reports them to a :class:`StepTimer`. The runtime owns
the list of what it patches, so a measurement tool (``specstrat.bench.overhead``) names none
of the runtime's internals. Strategies are timed by wrapping them, not here.
:func:`profiled_decode_steps` opens ``torch.profiler`` scopes around the same parts
(``specstrat bench --profile``), and :func:`forward_seconds` times one forward of ``t`` tokens
after a prompt (``verify_cost``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from specstrat.models import CausalLM
from specstrat.runtime import _attention, _graph_runner, _scheduler, _step, _verify, _worker
from specstrat.runtime._forward import ForwardMode

__all__ = [
    "ATTENTION_SCOPE",
    "DECODE_STEP_SCOPE",
    "FORWARD_SCOPE",
    "StepTimer",
    "forward_seconds",
    "profiled_decode_steps",
    "timed_decode_steps",
]

#: The metadata and relay kernels the runtime calls, by the module that calls them.
_KERNELS: tuple[tuple[object, str], ...] = (
    (_worker, "build_verify_metadata"),
    (_worker, "build_ragged_verify_metadata"),
    (_verify, "build_tree_verify_metadata"),
    (_graph_runner, "build_verify_metadata_into"),
    (_graph_runner, "build_ragged_verify_metadata_into"),
    (_graph_runner, "build_tree_verify_metadata_into"),
)


class StepTimer(Protocol):
    """What :func:`timed_decode_steps` reports to.

    The engine sets ``decoding`` to True while a decode step (or the scheduler's plan or
    absorb) runs and back to False after it, adds each decode step's wall time to
    ``seconds["total_us"]``, and calls the functions it patches through ``timed``: the plan and
    absorb as part ``"total_us"``, the metadata kernels as ``"metadata_us"``, the worker's
    forward (model and attention) as ``"model_us"``. ``timed`` must return a function that
    calls ``fn`` with the same arguments and returns its result.
    """

    decoding: bool
    seconds: dict[str, float]

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, reporting its wall time to ``part``."""
        ...


@contextmanager
def timed_decode_steps(timer: StepTimer) -> Iterator[None]:
    """Inside the block, every engine's decode steps report to ``timer`` (see
    :class:`StepTimer`); everything patched is restored on exit, also after an exception.
    One block at a time per process: the patches are process-wide."""
    step, sched, worker = _step.StepRunner, _scheduler.Scheduler, _worker.ModelWorker
    originals: list[tuple[object, str, Any]] = [
        (step, "decode", step.decode),
        (sched, "plan", sched.plan),
        (sched, "absorb", sched.absorb),
        (worker, "execute", worker.execute),
        *((module, name, getattr(module, name)) for module, name in _KERNELS),
    ]
    decode, plan, absorb = step.decode, sched.plan, sched.absorb

    def decoding(*args: Any, **kwargs: Any) -> Any:
        timer.decoding = True
        start = time.perf_counter()
        try:
            return decode(*args, **kwargs)
        finally:
            timer.seconds["total_us"] += time.perf_counter() - start
            timer.decoding = False

    def around(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            timer.decoding = True
            try:
                return timer.timed("total_us", fn)(*args, **kwargs)
            finally:
                timer.decoding = False

        return run

    setattr(step, "decode", decoding)  # noqa: B010
    setattr(sched, "plan", around(plan))  # noqa: B010
    setattr(sched, "absorb", around(absorb))  # noqa: B010
    for module, name in _KERNELS:
        setattr(module, name, timer.timed("metadata_us", getattr(module, name)))
    setattr(worker, "execute", timer.timed("model_us", worker.execute))  # noqa: B010
    try:
        yield
    finally:
        for owner, name, real in originals:
            setattr(owner, name, real)


#: The ``torch.profiler`` scopes :func:`profiled_decode_steps` opens: a decode step, the
#: worker's forward inside it, and the attention backend inside that.
DECODE_STEP_SCOPE = "specstrat.decode_step"
FORWARD_SCOPE = "specstrat.forward"
ATTENTION_SCOPE = "specstrat.attention_backend"


def _scoped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


@contextmanager
def profiled_decode_steps() -> Iterator[None]:
    """Inside the block, every engine's decode steps, the worker's forwards and the attention
    backend's calls run inside ``torch.profiler`` scopes (:data:`DECODE_STEP_SCOPE`,
    :data:`FORWARD_SCOPE`, :data:`ATTENTION_SCOPE`), so a profile can attribute each op to
    them; everything patched is restored on exit, also after an exception."""
    patched = [
        (_step.StepRunner, "decode", DECODE_STEP_SCOPE),
        (_worker.ModelWorker, "execute", FORWARD_SCOPE),
        (_attention.PagedAttention, "__call__", ATTENTION_SCOPE),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for (owner, name, scope), (_, _, real) in zip(patched, originals, strict=True):
        setattr(owner, name, _scoped(scope, real))
    try:
        yield
    finally:
        for owner, name, real in originals:
            setattr(owner, name, real)


def forward_seconds(model: CausalLM, prompt: Sequence[int], widest: int) -> Callable[[int], float]:
    """``run(t)``: the seconds of one forward of ``t`` tokens (DECODE for 1, TARGET_VERIFY
    for more, ``t <= widest``) after ``prompt``, through a model worker of its own (the paged
    attention the engine runs), rewound after each so every call sees the same prefix."""
    room = len(prompt) + widest + 1
    worker = _worker.ModelWorker(
        model, max_running_requests=1, context_len=room, max_total_tokens=room
    )
    slot = worker.alloc_request()
    with torch.inference_mode():
        worker.forward(ForwardMode.EXTEND, [slot], [list(prompt)])
    filler = [int(t) for t in prompt[:1]] * widest

    def run(tokens: int) -> float:
        mode = ForwardMode.DECODE if tokens == 1 else ForwardMode.TARGET_VERIFY
        with torch.inference_mode():
            start = time.perf_counter()
            worker.forward(mode, [slot], [filler[:tokens]])
            elapsed = time.perf_counter() - start
        worker.rewind(slot, len(prompt))
        return elapsed

    return run
