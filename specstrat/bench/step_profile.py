"""Where a decode step's time goes on a real model: ``specstrat bench --profile``.

:func:`profile_steps` runs an algorithm's requests twice on the model. The first run times the
engine's decode steps by part, the way :mod:`specstrat.bench.overhead` does on a zero-cost
model: the drafter (``propose``, ``commit``), the acceptance rule, the metadata kernels and the
relay, the worker's forward, and the scheduler (the rest of the step). The second run repeats
the same work under ``torch.profiler`` and splits the forward's time by what ran inside it:

- ``matmul_us``: matrix products (``mm``, ``addmm``, ``bmm``, ``mv``, oneDNN's packed linear),
  the weights' share of the work;
- ``kv_write_us``, ``kv_gather_us``, ``sdpa_us``, ``attention_other_us``: inside the engine's
  attention backend, the new keys and values written to the cache, the page-table gather of
  the keys and values read, the attention kernel itself, and the rest (masks, reshapes,
  Python);
- ``adapter_us``: the adapter's per-layer attention function (its argument checks and the
  context variable), less the backend it calls; nil under
  :class:`~specstrat.hf.fast_llama.FastLlamaForward`, which calls the backend itself;
- ``model_other_us``: the rest of the forward (norms, RoPE, activations, embedding and
  transformers' module calls and Python).

The profiled run's split is fitted to the first run's forward time, so the parts add up to the
unprofiled step: the kernels (matmuls, KV write and gather, SDPA) are kept as profiled, and the
Python-heavy parts, where the profiler's own cost per op lands, are scaled to what remains.
Times are microseconds per decode step, a verify step being a decode step with drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.bench.overhead import Clock, per_step, timed_algorithm
from specstrat.bench.run import BenchConfig, _shaped, encoded_workload, resolved_algorithms
from specstrat.errors import InvalidConfig
from specstrat.models import LoadedModels
from specstrat.runtime import (
    ATTENTION_SCOPE,
    DECODE_STEP_SCOPE,
    FORWARD_SCOPE,
    Engine,
    EngineConfig,
    Request,
    profiled_decode_steps,
    timed_decode_steps,
)

__all__ = [
    "FORWARD_PARTS",
    "STEP_PARTS",
    "StepProfile",
    "profile_bench",
    "profile_steps",
    "profile_table",
]

#: The step's parts, timed without the profiler; ``total_us`` is their sum.
STEP_PARTS = ("scheduler_us", "drafter_us", "acceptance_us", "metadata_us", "model_us", "total_us")
#: The forward's parts (``model_us`` split), from the profiled run.
FORWARD_PARTS = (
    "matmul_us",
    "kv_write_us",
    "kv_gather_us",
    "sdpa_us",
    "attention_other_us",
    "adapter_us",
    "model_other_us",
)
_KERNEL_PARTS = ("matmul_us", "kv_write_us", "kv_gather_us", "sdpa_us")
_MATMULS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv"}
    | {"mkldnn::_linear_pointwise"}  # the packed form of the fast forward's matmul plan
)
_ADAPTER_SCOPE, _DRAFTER_SCOPE = "specstrat.adapter_attention", "specstrat.drafter_us"


@dataclass(frozen=True, slots=True)
class StepProfile:
    """One algorithm's decode steps: ``steps`` counted, ``tokens_per_step`` (tokens each
    request gained a step, τ mixed with plain steps), and microseconds per step by part
    (:data:`STEP_PARTS`, then :data:`FORWARD_PARTS`, which add up to ``model_us``)."""

    algorithm: str
    batch_size: int
    draft_tokens: int
    steps: int
    tokens_per_step: float
    parts: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready values, microseconds rounded to 0.1."""
        return {
            "algorithm": self.algorithm,
            "batch_size": self.batch_size,
            "draft_tokens": self.draft_tokens,
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "parts_us": {k: round(v, 1) for k, v in self.parts.items()},
        }


def _scoped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


class _AdapterScope:
    """For the profiled run only: the Hugging Face adapter's attention function runs inside a
    named profiler scope (registered again as itself on exit); nothing without transformers."""

    def __enter__(self) -> None:
        self.adapter: Callable[..., Any] | None = None
        try:
            from transformers import AttentionInterface

            from specstrat.hf.adapter import ATTENTION_NAME, paged_attention
        except ImportError:
            return
        self.adapter = paged_attention
        AttentionInterface.register(ATTENTION_NAME, _scoped(_ADAPTER_SCOPE, paged_attention))

    def __exit__(self, *exc: object) -> None:
        if self.adapter is not None:
            from transformers import AttentionInterface

            from specstrat.hf.adapter import ATTENTION_NAME

            AttentionInterface.register(ATTENTION_NAME, self.adapter)


def _scopes(event: Any) -> set[str]:
    """The names of every event ``event`` ran inside (its ancestors)."""
    names = set()
    parent = event.cpu_parent
    while parent is not None:
        names.add(parent.name)
        parent = parent.cpu_parent
    return names


def _forward_split(events: Sequence[Any], steps: int) -> tuple[float, dict[str, float]]:
    """The target's forward time per decode step (``steps`` of them) and its split by part,
    microseconds, from a profiled run's events: prefill forwards (outside any decode step) and
    a drafter's own forwards (inside its scope) are left out."""
    out = dict.fromkeys(FORWARD_PARTS, 0.0)
    scoped = ((e, _scopes(e)) for e in events)
    stepped = [(e, s) for e, s in scoped if DECODE_STEP_SCOPE in s and _DRAFTER_SCOPE not in s]
    total = sum(e.cpu_time_total for e, _ in stepped if e.name == FORWARD_SCOPE)
    backend = sum(e.cpu_time_total for e, _ in stepped if e.name == ATTENTION_SCOPE)
    adapter = sum(e.cpu_time_total for e, _ in stepped if e.name == _ADAPTER_SCOPE)
    for e, scopes in stepped:
        if e.name.startswith("specstrat.") or FORWARD_SCOPE not in scopes:
            continue
        in_backend = ATTENTION_SCOPE in scopes
        if in_backend and e.name == "aten::index_copy_":
            out["kv_write_us"] += e.self_cpu_time_total
        elif in_backend and e.name == "aten::index_select":
            out["kv_gather_us"] += e.self_cpu_time_total
        elif in_backend and "scaled_dot_product" in e.name:
            out["sdpa_us"] += e.self_cpu_time_total
        elif e.name in _MATMULS and not in_backend:
            out["matmul_us"] += e.self_cpu_time_total
    inner = out["kv_write_us"] + out["kv_gather_us"] + out["sdpa_us"]
    out["attention_other_us"] = max(backend - inner, 0.0)
    out["adapter_us"] = max(adapter - backend, 0.0) if adapter else 0.0
    out["model_other_us"] = max(total - sum(out.values()), 0.0)
    return total / steps, {k: v / steps for k, v in out.items()}


class _ScopeClock(Clock):
    """A :class:`~specstrat.bench.overhead.Clock` that times nothing: each strategy call runs
    inside a profiler scope named after its part (``specstrat.drafter_us``, ...)."""

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` inside the scope ``specstrat.<part>``."""
        return _scoped(f"specstrat.{part}", fn)


def profile_steps(
    algo: SpecAlgorithm[Any],
    models: LoadedModels,
    requests: Sequence[Request],
    *,
    batch_size: int = 1,
    draft_tokens: int = 4,
    context_len: int,
) -> StepProfile:
    """``algo``'s decode steps on ``requests`` at ``batch_size`` and ``draft_tokens``, split by
    part (see the module docstring); sync mode, one untimed warm-up run first."""
    if not requests:
        raise InvalidConfig("requests is empty; profile_steps needs at least one request")
    config = EngineConfig(
        num_draft_tokens=max(draft_tokens, 1),
        max_running_requests=batch_size,
        context_len=context_len,
        overlap=False,
    )
    Engine(algo, models, config).run(list(requests))  # warm-up: first calls, allocations
    clock = Clock()
    engine = Engine(timed_algorithm(algo, clock), models, config)
    with timed_decode_steps(clock):
        engine.run(list(requests))
    stats = engine.stats
    per = per_step(clock, stats.decode_steps)
    # The same work again under the profiler, the strategies in scopes of their own so a
    # drafter's own model forwards are not read as the target's.
    profiled = Engine(timed_algorithm(algo, _ScopeClock()), models, config)
    with (
        profiled_decode_steps(),
        _AdapterScope(),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p,
    ):
        profiled.run(list(requests))
    total, split = _forward_split(p.events(), max(profiled.stats.decode_steps, 1))
    parts = {k: per[k] for k in STEP_PARTS} | _fitted(total, split, per["model_us"])
    steps_kept = stats.verified_requests + stats.plain_steps
    gained = (stats.verified_tokens + stats.plain_steps) / steps_kept if steps_kept else 1.0
    return StepProfile(algo.name, batch_size, draft_tokens, stats.decode_steps, gained, parts)


def _fitted(total: float, split: dict[str, float], model_us: float) -> dict[str, float]:
    """The profiled forward's ``split`` (``total`` µs a step in all) fitted to the unprofiled
    forward's ``model_us``: the kernels (``_KERNEL_PARTS``) as measured, since the profiler
    adds little inside them, and the Python-heavy rest, where its per-op cost lands, scaled to
    what remains; proportionally when the kernels alone exceed it (a noisy run)."""
    kernels = sum(split[k] for k in _KERNEL_PARTS)
    rest = total - kernels
    if kernels <= model_us and rest > 0:
        factor = (model_us - kernels) / rest
        return {k: v if k in _KERNEL_PARTS else v * factor for k, v in split.items()}
    factor = model_us / total if total else 0.0
    return {k: v * factor for k, v in split.items()}


def profile_table(profiles: Sequence[StepProfile]) -> str:
    """The profiles side by side: one column per algorithm, one row per part (µs per step)."""
    names = [
        f"{p.algorithm} D={p.draft_tokens}" if p.draft_tokens else p.algorithm for p in profiles
    ]
    col = max(14, *(len(n) + 2 for n in names))
    lines = [f"{'µs per decode step':<28}" + "".join(f"{n:>{col}}" for n in names)]
    for part in (*STEP_PARTS[:-2], *FORWARD_PARTS, "model_us", "total_us"):
        indent = "  " if part in FORWARD_PARTS else ""
        label = indent + part.removesuffix("_us")
        lines.append(f"{label:<28}" + "".join(f"{p.parts[part]:>{col}.0f}" for p in profiles))
    lines.append(
        f"{'tokens per request-step':<28}"
        + "".join(f"{p.tokens_per_step:>{col}.2f}" for p in profiles)
    )
    lines.append(f"{'decode steps':<28}" + "".join(f"{p.steps:>{col}}" for p in profiles))
    return "\n".join(lines)


#: BenchConfig fields --profile cannot honour, and the flag that set each.
_SIDE_BY_SIDE_ONLY = (
    ("overlap", "--overlap"),
    ("request_rate", "--request-rate"),
    ("baseline_hf", "--baseline hf"),
    ("force_accept", "--force-accept"),
)


def profile_bench(config: BenchConfig, models: LoadedModels) -> list[StepProfile]:
    """``specstrat bench --profile``: target-only and each of ``config``'s algorithms (its
    tree, ``topk``/``num_steps``, applied) at each of its draft widths, at its first batch
    size, on its first category's requests; a flag only the side-by-side runs honour is
    refused by name before anything runs."""
    from specstrat.builtins import NONE

    unused = [
        flag for name, flag in _SIDE_BY_SIDE_ONLY if getattr(config, name) not in (None, False)
    ]
    if unused:
        raise InvalidConfig(
            f"--profile runs each contender in sync mode, every request at once, on its own "
            f"acceptance rule and against specstrat's target-only; drop {', '.join(unused)} "
            "(or --profile)"
        )
    algos = resolved_algorithms(config)
    work = encoded_workload(config, models, algos)
    requests = next(iter(work.cells.values()))
    bs, context_len = config.batch_sizes[0], work.context_len
    base = profile_steps(NONE, models, requests, batch_size=bs, context_len=context_len)
    out = [replace(base, draft_tokens=0)]
    for algo in algos:
        for d in config.draft_tokens:
            shaped = _shaped(algo, config, d)
            out.append(
                profile_steps(
                    shaped, models, requests, batch_size=bs, draft_tokens=d, context_len=context_len
                )
            )
    return out
