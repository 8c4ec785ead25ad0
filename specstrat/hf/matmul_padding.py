"""Running each matmul of a few rows the way this machine runs it fastest.

On a CPU, torch picks a kernel for ``F.linear(x, W)`` by shape, and for a few rows the pick can
be poor: on one 2-core AMD EPYC host (torch 2.13), SmolLM2's LM head took 12.4, 28.3, 41.1 and
22.9 ms for 1, 2, 3 and 4 rows, and the same product written ``(W @ x.T).T`` or, for one row,
``W @ x`` ran on other kernels that were faster at 1 to 4 rows and slower at 8. :func:`matmul_plan`
times each way of computing a matmul of the rows in :data:`PLAN_ROWS` once, over a model's
layer projections and again over its LM head, and :class:`MatmulPlan` runs every projection of
:class:`~specstrat.hf.fast_llama.FastLlamaForward` the way it chose: ``linear`` (``F.linear``),
``mm`` (``W @ x.T``), ``mv`` (``W @ x`` for one row) or ``packed`` (oneDNN's linear on a copy of
the weight packed at load, :func:`pack`), on the rows it has or padded with zero rows to a count
that runs faster. Every way computes the same product; only the order of the sums, and so the
last bits of float rounding, may differ. A draft model, whose outputs only propose tokens the
target verifies, may also be planned ``narrow`` (:class:`PlannedLinears`): its weights may then
run as ``packed-bf16``, a bfloat16 copy packed the same way, half the bytes to read.

On the same host the packed form read 8 of SmolLM2's layers in 5.5 to 7.7 ms for 1 to 8 rows,
where ``F.linear`` took 9.5 to 24 ms, and the LM head in 3.6 to 5.4 ms against 11.6 to 37 ms
(``docs/bench.md``); it holds a second copy of each weight it packs.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = [
    "EXACT",
    "FORMS",
    "PACK_ROWS",
    "PAD_GAIN",
    "PLAN_ROWS",
    "ROW_LIMIT",
    "MatmulPlan",
    "PlannedLinears",
    "matmul_plan",
    "pack",
    "run_packed",
    "weight_version",
]


#: Row counts :func:`matmul_plan` times (a plan covers 1 .. the last), and how much faster
#: another way must be than ``F.linear`` to be taken.
PLAN_ROWS, PAD_GAIN = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64), 0.85

#: The most rows a form is timed on (the others: every count of :data:`PLAN_ROWS`): ``mv`` is a
#: one-row product, and ``mm`` ran no faster than ``F.linear`` from 8 rows up wherever it was
#: measured (timed to 16 all the same, as before the packed form).
ROW_LIMIT = {"mv": 1, "mm": 16}

#: Forms that run on the rows they have, never padded: a packed weight's time grows with the
#: rows, so the time at the next count of :data:`PLAN_ROWS` bounds it. A plan whose largest
#: count runs such a form runs it on any larger count too. Each runs on a copy :func:`pack`
#: made in the dtype it names here (``None``: the weight's own); a plan runs at most one.
EXACT: Mapping[str, torch.dtype | None] = MappingProxyType(
    {"packed": None, "packed-bf16": torch.bfloat16}
)

#: The row count oneDNN lays a packed weight out for (it runs any count): on the EPYC host,
#: layouts for 8, 16 and 64 rows ran within 5% of each other from 1 to 256 rows.
PACK_ROWS = 16

#: Plans measured in this process, by device, dtype, torch threads, ``narrow`` and weight shapes.
_MEASURED: dict[tuple[object, ...], MatmulPlan] = {}


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(w, x.t()).t()


def _mv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mv(w, x[0])[None]


def _packed(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")
    return out


def _packed_narrow(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with ``x`` rounded to the packed copy's dtype, back in ``x``'s."""
    out = _packed(x.to(w.dtype), w).to(x.dtype)
    return out if bias is None else out + bias


#: The ways of computing ``x @ W.T`` (no bias) a plan chooses from, by name; the forms of
#: :data:`EXACT` take the copy :func:`pack` returned, the others the weight itself.
FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": _linear,
    "mm": _mm,
    "mv": _mv,
    "packed": _packed,
    "packed-bf16": _packed_narrow,
}

#: How each :data:`EXACT` form runs on its packed copy, with the bias.
_RUN_PACKED = {"packed": _packed, "packed-bf16": _packed_narrow}


def run_packed(
    form: str, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the :data:`EXACT` ``form`` on ``packed``, :func:`pack` of ``W``
    in the form's dtype."""
    return _RUN_PACKED[form](x, packed, bias)


def pack(weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """``weight [out, in]`` copied into oneDNN's packed layout (in ``dtype``, if given), for a
    form of :data:`EXACT`; ``None`` where torch has no oneDNN or it does not pack this weight
    (not on the CPU, or a dtype it does not take)."""
    onednn: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if weight.device.type != "cpu" or not onednn:
        return None
    try:
        with torch.inference_mode():
            copy = weight.detach() if dtype is None else weight.detach().to(dtype)
            packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(copy, PACK_ROWS)
            probe = torch.ones(1, weight.shape[1], dtype=copy.dtype)
            _packed(probe, packed)  # a layout oneDNN cannot run fails here, not mid-forward
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    return packed


def _matmul_seconds(
    weights: Sequence[torch.Tensor],
    rows: int,
    form: str = "linear",
    dtypes: Sequence[torch.dtype] | None = None,
) -> float:
    """The time of one pass of a matmul of ``rows`` rows by each of ``weights`` in turn,
    computed the ``form`` way, the rows in ``dtypes`` (one per weight; default: each
    weight's), so a narrow copy's time includes casting its input and output."""
    kinds = dtypes or [w.dtype for w in weights]
    inputs = [
        torch.zeros(rows, w.shape[1], dtype=kind, device=w.device)
        for w, kind in zip(weights, kinds, strict=True)
    ]
    with torch.inference_mode():
        start = time.perf_counter()
        for x, w in zip(inputs, weights, strict=True):
            FORMS[form](x, w)
        return time.perf_counter() - start


class MatmulPlan:
    """How :meth:`linear` computes a matmul of ``n`` rows: ``ways[n] = (form, rows)``, the
    :data:`FORMS` entry and the row count to pad to; past the largest ``n`` it has, the
    ``beyond`` form (one of :data:`EXACT`) on the rows given, if any; ``F.linear`` on the rows
    it has elsewhere (the empty plan runs everything so)."""

    def __init__(
        self, ways: dict[int, tuple[str, int]] | None = None, beyond: str | None = None
    ) -> None:
        if ways is not None and not isinstance(ways, dict):
            raise InvalidConfig(f"ways={ways!r}: pass a dict of row count -> (form, rows)")
        self.ways = dict(ways or {})
        for n, way in self.ways.items():
            plain = isinstance(way, tuple) and len(way) == 2 and isinstance(way[0], str)
            if not is_int(n) or n < 1 or not plain or way[0] not in FORMS:
                raise InvalidConfig(
                    f"ways[{n!r}]={way!r}: a plan maps a row count >= 1 to (form, rows), the "
                    f"form one of {sorted(FORMS)}"
                )
            if not is_int(way[1]) or way[1] < n or (way[0] in EXACT and way[1] != n):
                raise InvalidConfig(
                    f"ways[{n}]={way!r}: pad {n} rows to {n} or more ({sorted(EXACT)} run on "
                    "the rows they have)"
                )
            if way[0] == "mv" and way[1] != 1:
                raise InvalidConfig(
                    f"ways[{n}]={way!r}: mv is a one-row product; run {n} rows as "
                    f"('mm', {way[1]}) or ('linear', {way[1]})"
                )
        if beyond is not None and (not isinstance(beyond, str) or beyond not in EXACT):
            raise InvalidConfig(
                f"beyond={beyond!r}: only a form that runs any row count, one of "
                f"{sorted(EXACT)}, or None"
            )
        self.beyond = beyond
        self._last = max(self.ways, default=0)
        forms = {form for form, _ in self.ways.values()}
        self._forms = frozenset(forms if beyond is None else forms | {beyond})
        packed = sorted(self._forms & EXACT.keys())
        if len(packed) > 1:
            raise InvalidConfig(
                f"ways={self.ways!r}, beyond={beyond!r}: a plan runs one of "
                f"{sorted(EXACT)} at most (a weight holds one packed copy); keep one of them"
            )
        self._packed_form = packed[0] if packed else None

    def way(self, n: int) -> tuple[str, int] | None:
        """``(form, rows)``: how :meth:`linear` runs ``n`` rows; ``None``: ``F.linear``."""
        way = self.ways.get(n)
        if way is None and self.beyond is not None and n > self._last:
            way = (self.beyond, n)
        return way

    def packed_form(self) -> str | None:
        """The :data:`EXACT` form this plan runs, if any: what a weight's packed copy is for
        (:func:`pack` it in ``EXACT[form]``)."""
        return self._packed_form

    def forms(self) -> frozenset[str]:
        """The forms this plan runs some row count with."""
        return self._forms

    def summary(self) -> str:
        """The plan in a line: runs of row counts with their form (and padded rows), then
        what runs past them, e.g. ``1-2: mm on 2; 3-64: packed; past 64: packed``."""
        parts: list[tuple[int, int, str]] = []  # first and last row count, the way
        for n in sorted(self.ways):
            form, rows = self.ways[n]
            label = form if rows == n else f"{form} on {rows}"
            # a run goes on where the way is the same, or where it was padded to this count
            if parts and parts[-1][1] == n - 1 and parts[-1][2] in (label, f"{form} on {n}"):
                parts[-1] = (parts[-1][0], n, parts[-1][2])
            else:
                parts.append((n, n, label))
        lines = [f"{a}-{b}: {t}" if a != b else f"{a}: {t}" for a, b, t in parts]
        if self.beyond is not None:
            lines.append(f"past {self._last}: {self.beyond}")
        return "; ".join(lines) or "F.linear throughout"

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        packed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` for ``x [n, in]``, computed the way the plan says for
        ``n`` rows (an :data:`EXACT` form on ``packed``, :func:`pack` of ``weight`` in the
        form's dtype; without it, ``F.linear``); contiguous ``[n, out]``."""
        n = x.shape[0]
        way = self.way(n)
        if way is None:
            return F.linear(x, weight, bias)
        form, rows = way
        if form in EXACT:
            if packed is None:
                return F.linear(x, weight, bias)
            return run_packed(form, x, packed, bias)
        padded = x if rows == n else F.pad(x, (0, 0, 0, rows - n))
        out = FORMS[form](padded, weight)[:n]
        out = out if bias is None else out + bias
        return out.contiguous()


def matmul_plan(
    weights: Sequence[torch.Tensor], repeats: int = 3, *, narrow: bool = False
) -> MatmulPlan:
    """For ``n`` of 1 .. ``PLAN_ROWS[-1]`` rows, the fastest way (a :data:`FORMS` entry, on
    ``m >= n`` rows of :data:`PLAN_ROWS`, padded) of a matmul by each of ``weights`` in turn
    (matrices read from memory, as a forward reads them, not from cache), timed on this
    machine, each way's fastest of ``repeats`` rounds after a warm-up round, the ways
    interleaved within a round; kept only where it beats
    ``F.linear`` on ``n`` rows by :data:`PAD_GAIN` (a row count :data:`PLAN_ROWS` lacks is
    compared with the next it has; an :data:`EXACT` form runs on ``n`` rows, and runs past the
    last count if it won there). An :data:`EXACT` form is timed where :func:`pack` packs every
    weight, on copies dropped afterwards; one in another dtype than the weights' (``narrow``
    forms, such as ``packed-bf16``) only where ``narrow``, for a draft model. Where two exact
    forms were timed, the plan keeps the one whose time relative to ``F.linear``'s, summed over
    :data:`PLAN_ROWS`, is least (a weight holds one packed copy). Measured once per process
    for the same device, dtype, torch threads, ``narrow`` and shapes."""
    if not isinstance(narrow, bool):
        raise InvalidConfig(f"narrow={narrow!r}: pass True (a draft model) or False")
    first = weights[0]
    key = (first.device, first.dtype, torch.get_num_threads(), narrow, *(w.shape for w in weights))
    if key in _MEASURED:
        return _MEASURED[key]
    operands = {form: list(weights) for form in ("linear", "mm", "mv")}
    dtypes = [w.dtype for w in weights]
    for form, dtype in EXACT.items():
        if dtype is None or (narrow and dtype != first.dtype):
            packs = [pack(w, dtype) for w in weights]
            if all(p is not None for p in packs):
                operands[form] = [p for p in packs if p is not None]
    ways = [
        (form, rows)
        for rows in PLAN_ROWS
        for form in operands
        if rows <= ROW_LIMIT.get(form, PLAN_ROWS[-1])
    ]
    cost = dict.fromkeys(ways, float("inf"))
    for round_ in range(repeats + 1):  # interleaved, so a busy moment slows every way alike
        for form, rows in ways:
            seconds = _matmul_seconds(operands[form], rows, form, dtypes)
            if round_:  # round 0 warms every way up
                cost[form, rows] = min(cost[form, rows], seconds)
    timed = [form for form in operands if form in EXACT]
    del operands
    if len(timed) > 1:  # each row count weighs alike: a draft head runs 1 to 4 rows, not 64
        keep = min(
            timed,
            key=lambda form: sum(cost[form, rows] / cost["linear", rows] for rows in PLAN_ROWS),
        )
        cost = {way: c for way, c in cost.items() if way[0] not in EXACT or way[0] == keep}
    chosen: dict[int, tuple[str, int]] = {}
    for n in range(1, PLAN_ROWS[-1] + 1):
        plain = min(rows for rows in PLAN_ROWS if rows >= n)
        form, rows = min((way for way in cost if way[1] >= n), key=lambda way: cost[way])
        if (form, rows) != ("linear", n) and cost[form, rows] < PAD_GAIN * cost["linear", plain]:
            chosen[n] = (form, n if form in EXACT else rows)
    last = chosen.get(PLAN_ROWS[-1], ("linear", 0))[0]
    _MEASURED[key] = plan = MatmulPlan(chosen, last if last in EXACT else None)
    return plan


class PlannedLinears:
    """``nn.Linear`` modules run the way a plan timed on their own weights chose:
    ``planned(module, x)`` is ``module(x)`` for ``x [..., in]``, computed by
    :meth:`MatmulPlan.linear` for its rows (on a packed copy of the weight where the plan runs
    an :data:`EXACT` form). With ``narrow`` (for a draft model, whose outputs only propose
    tokens), the plan may run the weights as bfloat16 copies, ``packed-bf16``, where this
    machine runs those faster; the outputs then carry bfloat16's rounding (about three
    significant digits). A weight that keeps no version counter (made in inference mode) is
    never packed: where the plan runs a packed form, it runs ``F.linear`` instead. A weight
    replaced, or written in place through itself, since it was packed is packed anew at its
    next call; a write through ``weight.data`` bypasses the version counter this reads and is
    not seen (build a new ``PlannedLinears`` after one). A call that records gradients, a
    subclass of ``nn.Linear`` and a module with a forward hook run the module itself."""

    def __init__(self, modules: Sequence[nn.Linear], *, narrow: bool = False) -> None:
        if not modules:
            raise InvalidConfig("modules=[]: pass the nn.Linear modules to plan")
        self.plan = matmul_plan([m.weight.detach() for m in modules], narrow=narrow)
        self._packs: weakref.WeakKeyDictionary[nn.Linear, tuple[object, int, torch.Tensor]] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``module(x)``, planned."""
        weight, bias = module.weight, module.bias
        trains = any(t is not None and t.requires_grad for t in (weight, bias, x))
        hooked = module._forward_hooks or module._forward_pre_hooks
        if type(module) is not nn.Linear or hooked or (torch.is_grad_enabled() and trains):
            out: torch.Tensor = module(x)
            return out
        packed = None
        version = weight_version(weight)
        form = self.plan.packed_form()
        if form is not None and version is not None:
            held = self._packs.get(module)
            if held is None or held[0] is not weight or held[1] != version:
                fresh = pack(weight, EXACT[form])
                if fresh is None:
                    self._packs.pop(module, None)
                    held = None
                else:
                    held = self._packs[module] = (weight, version, fresh)
            packed = None if held is None else held[2]
        flat = x.reshape(-1, x.shape[-1])
        out = self.plan.linear(flat, weight.detach(), bias, packed)
        return out.view(*x.shape[:-1], out.shape[-1])


def weight_version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, or ``None`` where it keeps none (an inference tensor, or a
    parameter made in inference mode)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None
