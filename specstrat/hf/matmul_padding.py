"""Running each matmul of a few rows the way this machine runs it fastest.

On a CPU, torch picks a kernel for ``F.linear(x, W)`` by shape, and for a few rows the pick can
be poor: on one 2-core AMD EPYC host (torch 2.13), SmolLM2's LM head took 12.4, 28.3, 41.1 and
22.9 ms for 1, 2, 3 and 4 rows, and the same product written ``(W @ x.T).T`` or, for one row,
``W @ x`` ran on other kernels that were faster at 1 to 4 rows and slower at 8. :func:`matmul_plan`
times each way of computing a matmul of the rows in :data:`PLAN_ROWS` once, over a model's
layer projections and again over its LM head, and :class:`MatmulPlan` runs every projection of
:class:`~specstrat.hf.fast_llama.FastLlamaForward` the way it chose: ``linear`` (``F.linear``),
``mm`` (``W @ x.T``) or ``mv`` (``W @ x`` for one row), on the rows it has or padded with zero
rows to a count that runs faster. Every way computes the same product; only the order of the
sums, and so the last bits of float rounding, may differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["FORMS", "PAD_GAIN", "PLAN_ROWS", "MatmulPlan", "matmul_plan"]


#: Row counts :func:`matmul_plan` times (a plan covers 1 .. the last), and how much faster
#: another way must be than ``F.linear`` to be taken.
PLAN_ROWS, PAD_GAIN = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16), 0.85

#: Plans measured in this process, by device, dtype, torch threads and weight shapes.
_MEASURED: dict[tuple[object, ...], MatmulPlan] = {}


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(w, x.t()).t()


def _mv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mv(w, x[0])[None]


#: The ways of computing ``x @ W.T`` (no bias) a plan chooses from, by name.
FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": _linear,
    "mm": _mm,
    "mv": _mv,
}


def _matmul_seconds(weights: Sequence[torch.Tensor], rows: int, form: str = "linear") -> float:
    """The time of one pass of a matmul of ``rows`` rows by each of ``weights`` in turn,
    computed the ``form`` way."""
    inputs = [torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device) for w in weights]
    with torch.inference_mode():
        start = time.perf_counter()
        for x, w in zip(inputs, weights, strict=True):
            FORMS[form](x, w)
        return time.perf_counter() - start


class MatmulPlan:
    """How :meth:`linear` computes a matmul of ``n`` rows: ``ways[n] = (form, rows)``, the
    :data:`FORMS` entry and the row count to pad to; ``F.linear`` on the rows it has where ``n``
    has no entry (the empty plan runs everything so)."""

    def __init__(self, ways: dict[int, tuple[str, int]] | None = None) -> None:
        self.ways = dict(ways or {})

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` for ``x [n, in]``, computed the way the plan says for
        ``n`` rows; contiguous ``[n, out]``."""
        n = x.shape[0]
        way = self.ways.get(n)
        if way is None:
            return F.linear(x, weight, bias)
        form, rows = way
        padded = x if rows == n else F.pad(x, (0, 0, 0, rows - n))
        out = FORMS[form](padded, weight)[:n]
        out = out if bias is None else out + bias
        return out.contiguous()


def matmul_plan(weights: Sequence[torch.Tensor], repeats: int = 3) -> MatmulPlan:
    """For ``n`` of 1 .. ``PLAN_ROWS[-1]`` rows, the fastest way (a :data:`FORMS` entry, on
    ``m >= n`` rows of :data:`PLAN_ROWS`, padded) of a matmul by each of ``weights`` in turn
    (matrices read from memory, as a forward reads them, not from cache), timed on this
    machine, each way's fastest of ``repeats`` rounds after a warm-up round, the ways
    interleaved within a round; kept only where it beats
    ``F.linear`` on ``n`` rows by :data:`PAD_GAIN` (a row count :data:`PLAN_ROWS` lacks is
    compared with the next it has). Measured once per process for the same device, dtype,
    torch threads and shapes."""
    first = weights[0]
    key = (first.device, first.dtype, torch.get_num_threads(), *(w.shape for w in weights))
    if key in _MEASURED:
        return _MEASURED[key]
    ways = [(form, rows) for rows in PLAN_ROWS for form in FORMS if form != "mv" or rows == 1]
    cost = dict.fromkeys(ways, float("inf"))
    for round_ in range(repeats + 1):  # interleaved, so a busy moment slows every way alike
        for way in ways:
            seconds = _matmul_seconds(weights, way[1], way[0])
            if round_:  # round 0 warms every way up
                cost[way] = min(cost[way], seconds)
    chosen: dict[int, tuple[str, int]] = {}
    for n in range(1, PLAN_ROWS[-1] + 1):
        plain = min(rows for rows in PLAN_ROWS if rows >= n)
        form, rows = min((way for way in cost if way[1] >= n), key=lambda way: cost[way])
        if (form, rows) != ("linear", n) and cost[form, rows] < PAD_GAIN * cost["linear", plain]:
            chosen[n] = (form, rows)
    _MEASURED[key] = plan = MatmulPlan(chosen)
    return plan
