"""``specstrat bench`` as a function: :func:`run_bench` times algorithms side by side and
returns a :class:`BenchResult` whose rows carry the figures of :mod:`specstrat.bench.figures`.

A *cell* is one (category, batch size, draft width); in each cell target-only (``NONE``) runs
beside every algorithm (and, with ``baseline_hf``, transformers' ``generate``). Every run builds
a fresh engine (untimed) and decodes the cell's requests; all arrive at once unless
``request_rate`` spaces them (Poisson arrivals, seeded). Runs go through
:func:`specstrat.timing.interleaved`: ``warmup`` uncounted rounds, then ``repeats``
rounds each running every contender once (A B C A B C ...); speedups are taken within a round,
then summarised. Every counted run's outputs are compared with the cell's target-only outputs:
greedy token for token (on Hugging Face models certified ties allowed, see
:mod:`specstrat.hf.reference`); a run that is not lossless marks its row ``lossless: false``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm
from specstrat.bench._contenders import contender, plan, sync_split
from specstrat.bench.plausibility import with_plausibility
from specstrat.bench.roofline import TargetWeights, measure_machine, with_roofline
from specstrat.bench.rows import HF_ASSISTED, HF_GENERATE, HF_LOOKUP, Cell, build_rows
from specstrat.bench.rows import OVERALL as OVERALL
from specstrat.bench.rows import BenchRow as BenchRow
from specstrat.bench.verify_cost import measure_verify_cost
from specstrat.bench.workloads import (
    ByteEncoder,
    ChatEncoder,
    PromptEncoder,
    WorkloadSpec,
    encode_all,
    load_prompts,
    parse_workload,
)
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.models import LoadedModels
from specstrat.registry import get
from specstrat.runtime import Request, kv_reservation
from specstrat.strategies.forced_acceptance import ForcedAcceptance
from specstrat.strategies.tree import TopkTree
from specstrat.timing import interleaved

__all__ = [
    "OVERALL",
    "TAU_FORMULA",
    "BenchConfig",
    "BenchResult",
    "BenchRow",
    "EncodedWorkload",
    "encoded_workload",
    "resolved_algorithms",
    "run_bench",
]

TAU_FORMULA = (
    "tau = (drafts accepted + 1 bonus token) per drafted verify step (D > 1) per request, as "
    "the acceptance rule accepted them, before any cut at max_new_tokens or a stop token; "
    "plain D = 1 steps are excluded and reported as plain_step_share"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """What to measure. ``algorithms``: SpecAlgorithms or registered names (target-only always
    runs, as ``NONE``); ``workload``: a spec for :func:`~specstrat.bench.workloads.parse_workload`;
    ``requests``: per category; ``batch_sizes`` / ``draft_tokens``: one value or a sweep;
    ``topk`` / ``num_steps``: a draft tree for every algorithm (``None`` for both: each
    algorithm's own); ``force_accept``: a rate for
    :class:`~specstrat.strategies.ForcedAcceptance` in place of each algorithm's rule, with stop
    tokens off; ``baseline_hf``: add transformers' ``generate`` (Hugging Face models only)."""

    algorithms: tuple[SpecAlgorithm[Any] | str, ...]
    workload: str = "code"
    requests: int = 8
    max_new_tokens: int = 64
    batch_sizes: tuple[int, ...] = (1,)
    draft_tokens: tuple[int, ...] = (4,)
    topk: int | None = None
    num_steps: int | None = None
    sampling: SamplingParams = GREEDY
    warmup: int = 1
    repeats: int = 3
    overlap: bool = False
    context_len: int | None = None
    request_rate: float | None = None
    baseline_hf: bool = False
    force_accept: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.algorithms, tuple):
            raise InvalidConfig(f"algorithms={self.algorithms!r} must be a tuple")
        for name in ("requests", "max_new_tokens", "repeats"):
            _check_int(name, getattr(self, name), 1)
        _check_int("warmup", self.warmup, 0)
        for name in ("batch_sizes", "draft_tokens"):
            values = getattr(self, name)
            if not isinstance(values, tuple) or not values:
                raise InvalidConfig(f"{name}={values!r} must be a non-empty tuple of ints >= 1")
            for v in values:
                _check_int(name, v, 1)
        for name in ("topk", "num_steps", "context_len"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        rate = self.request_rate
        if rate is not None and (isinstance(rate, bool) or not rate > 0):
            raise InvalidConfig(f"request_rate={rate!r} must be a number > 0 (requests/s)")
        if self.force_accept is not None:
            ForcedAcceptance(rate=self.force_accept)  # its own check, its own message
        if self.baseline_hf and not self.sampling.greedy:
            raise InvalidConfig(
                f"baseline_hf=True with temperature={self.sampling.temperature:g}: transformers' "
                "generate runs greedy here; drop --baseline hf or sample at temperature 0"
            )


def _check_int(name: str, value: object, low: int) -> None:
    if not is_int(value) or value < low:
        raise InvalidConfig(f"{name}={value!r} must be an int >= {low}")


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A bench run: its rows, what ran (``setup``), notes to print beside the tables
    (encoding, subsample, formula) and the machine (``environment``)."""

    rows: tuple[BenchRow, ...]
    setup: dict[str, Any]
    notes: tuple[str, ...]
    environment: dict[str, Any]
    categories: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The whole result as JSON-ready values."""
        return {
            "setup": self.setup,
            "environment": self.environment,
            "notes": list(self.notes),
            "formulas": {"tau": TAU_FORMULA},
            "rows": [r.as_dict() for r in self.rows],
        }


def run_bench(
    config: BenchConfig,
    models: LoadedModels,
    *,
    model_name: str = "embedded",
    progress: Callable[[str], None] | None = None,
    bar: Any = None,
) -> BenchResult:
    """Run ``config`` on ``models`` (the embedded models or :class:`~specstrat.hf.HFModels`).

    ``progress`` gets one line before the runs (their count) and one after the first round
    (the time the rest should take); ``bar`` (a tqdm bar, or anything with ``update(n)`` and
    ``set_description(s)``) advances once per run. Raises InvalidConfig for a workload, an
    algorithm or a baseline that cannot run on these models.
    """
    from specstrat.runtime import EmbeddedModels

    hf = not isinstance(models, EmbeddedModels)
    if config.baseline_hf and not hf:
        raise InvalidConfig(
            "baseline_hf=True needs a Hugging Face model (--model smollm2 or a path): "
            "transformers' generate does not run the embedded byte models"
        )
    algos = resolved_algorithms(config)
    names = [a.name for a in algos]
    work = encoded_workload(config, models, algos)
    spec, stops, context_len, by_category = work.spec, work.stops, work.context_len, work.cells
    categories, encoder = tuple(by_category), work.encoder
    assisted = config.baseline_hf and callable(getattr(models.draft, "assistant", None))
    cells = _cells(config, algos, by_category, assisted=assisted)
    contenders = [
        contender(c, models, context_len, overlap=config.overlap, rate=config.request_rate)
        for c in cells
    ]
    started = time.perf_counter()
    if progress is not None:
        progress(plan(cells, warmup=config.warmup, repeats=config.repeats, overlap=config.overlap))
    done = [0]

    def tick(label: str) -> None:
        if bar is not None:
            bar.set_description(label)
            if done[0]:
                bar.update(1)
        done[0] += 1
        if done[0] == len(contenders) + 1 and progress is not None:
            per_round = time.perf_counter() - started
            left = per_round * (config.warmup + config.repeats - 1)
            progress(f"estimate: about {left:.0f} s more ({per_round:.1f} s per round)")

    timings = interleaved(contenders, rounds=config.repeats, warmup=config.warmup, progress=tick)
    if bar is not None:
        bar.update(1)
    if config.overlap:  # the stage split is measured in sync mode: one extra untimed run
        for cell in cells:
            if cell.spec is not None:
                cell.split = sync_split(cell, models, context_len)
    rows = build_rows(
        cells,
        timings,
        categories,
        warmup=config.warmup,
        greedy=config.sampling.greedy,
        split_apart=config.overlap,
        lm=models.target if hf else None,
    )
    machine, weights = measure_machine(), TargetWeights.of(models.target)
    cost = measure_verify_cost(models.target, next(iter(by_category.values()))[0].prompt)
    rows = [
        with_plausibility(with_roofline(r, machine, weights, config.requests), cost.specstrat)
        for r in rows
    ]
    notes = [TAU_FORMULA]
    if encoder.note:
        notes.append(encoder.note)
    notes.append(
        f"workload {spec.text()}: {config.requests} request(s) per category, "
        f"{config.max_new_tokens} new tokens, {config.warmup} warm-up + {config.repeats} "
        f"counted round(s)" + (", stop tokens off" if not stops else "")
    )
    if config.force_accept is not None:
        notes.append(
            f"forced acceptance {config.force_accept:g}: every algorithm's rule replaced by "
            "ForcedAcceptance (lossy by design; measures the system, not the drafter)"
        )
    setup = {
        "algorithms": names,
        "model": model_name,
        "workload": spec.text(),
        "categories": list(categories),
        "requests_per_category": config.requests,
        "max_new_tokens": config.max_new_tokens,
        "batch_sizes": list(config.batch_sizes),
        "draft_tokens": list(config.draft_tokens),
        "topk": config.topk,
        "num_steps": config.num_steps,
        "temperature": config.sampling.temperature,
        "top_p": config.sampling.top_p,
        "top_k": config.sampling.top_k,
        "seed": config.sampling.seed,
        "warmup": config.warmup,
        "repeats": config.repeats,
        "overlap": config.overlap,
        "context_len": context_len,
        "request_rate": config.request_rate,
        "baseline": "hf" if config.baseline_hf else None,
        "force_accept": config.force_accept,
        "stop_tokens": stops,
        "compile": _compiled_counts(models),
    }
    from specstrat.bench.environment import environment

    env = {**environment(), **machine.as_dict(), **cost.as_dict()}
    return BenchResult(tuple(rows), setup, tuple(notes), env, categories)


@dataclass(frozen=True, slots=True)
class EncodedWorkload:
    """A bench config's workload as requests: the parsed ``spec``, its ``encoder``, the
    requests by category (``cells``, in the workload's order), whether stop tokens are on, and
    the ``context_len`` every contender runs at."""

    spec: WorkloadSpec
    encoder: PromptEncoder
    cells: dict[str, list[Request]]
    stops: bool
    context_len: int


def encoded_workload(
    config: BenchConfig, models: LoadedModels, algos: Sequence[SpecAlgorithm[Any]]
) -> EncodedWorkload:
    """``config``'s prompts encoded for ``models`` (the chat template on a Hugging Face model,
    bytes on the embedded ones), sized for the widest of ``algos`` at ``config``'s widths."""
    from specstrat.runtime import EmbeddedModels

    hf = not isinstance(models, EmbeddedModels)
    spec = parse_workload(config.workload)
    prompts = load_prompts(spec, config.requests)
    # What the widest contender reserves past prompt and output (target-only reserves less).
    margin = max(
        (
            kv_reservation(_shaped(a, config, d), d).margin
            for a in algos
            for d in config.draft_tokens
        ),
        default=0,
    )
    encoder: PromptEncoder = (
        ChatEncoder(models) if hf else ByteEncoder(config.context_len or 512, margin)
    )
    stops = config.force_accept is None
    requests = encode_all(encoder, prompts, config.max_new_tokens, config.sampling, stops=stops)
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    context_len = config.context_len or (512 if not hf else longest + margin)
    cells: dict[str, list[Request]] = {}
    for prompt, request in zip(prompts, requests, strict=True):
        cells.setdefault(prompt.category, []).append(request)
    return EncodedWorkload(spec, encoder, cells, stops, context_len)


def resolved_algorithms(config: BenchConfig) -> list[SpecAlgorithm[Any]]:
    """``config``'s algorithms, names looked up in the registry; refuses NONE (it always runs)
    and an algorithm named twice."""
    algos = [_algorithm(a) for a in config.algorithms]
    names = [a.name for a in algos]
    if "NONE" in [n.upper() for n in names] or len(set(names)) != len(names):
        raise InvalidConfig(
            f"algorithms={names}: pass distinct algorithms; target-only (NONE) always runs"
        )
    return algos


def _algorithm(algo: SpecAlgorithm[Any] | str) -> SpecAlgorithm[Any]:
    if isinstance(algo, SpecAlgorithm):
        return algo
    if isinstance(algo, str):
        return get(algo)
    raise InvalidConfig(f"algorithm={algo!r}; pass a SpecAlgorithm or a registered name")


def _shaped(algo: SpecAlgorithm[Any], config: BenchConfig, d: int) -> SpecAlgorithm[Any]:
    """``algo`` with the configured tree and forced acceptance, for draft width ``d``."""
    if config.topk is not None or config.num_steps is not None:
        own = algo.tree if isinstance(algo.tree, TopkTree) else None
        topk = config.topk or (own.topk if own else 1)
        steps = config.num_steps or (own.num_steps if own else d - 1)
        algo = replace(algo, tree=TopkTree(topk=topk, num_steps=steps))
    if config.force_accept is not None:
        algo = replace(algo, acceptance=ForcedAcceptance(rate=config.force_accept))
    return algo


def _cells(
    config: BenchConfig,
    algos: Sequence[SpecAlgorithm[Any]],
    by_category: dict[str, list[Request]],
    *,
    assisted: bool = False,
) -> list[Cell]:
    """Every contender of every cell: per (category, batch size) NONE and, with the HF
    baseline, ``generate``; per draft width each algorithm (and prompt lookup at batch size 1,
    and with ``assisted`` transformers' assisted generation with the draft LM when an algorithm
    drafts with one)."""
    if assisted:
        from specstrat.train import reads_draft_lm

        assisted = any(reads_draft_lm(a) for a in algos)
    cells: list[Cell] = []
    none = get("NONE")
    for cat, reqs in by_category.items():
        for bs in config.batch_sizes:
            base = f"NONE|{cat}|bs{bs}"
            cells.append(Cell(base, "NONE", cat, bs, 0, reqs, True, base, none))
            if config.baseline_hf:
                name = f"{HF_GENERATE}|{cat}|bs{bs}"
                cells.append(Cell(name, HF_GENERATE, cat, bs, 0, reqs, True, base, None))
            for d in config.draft_tokens:
                if config.baseline_hf and bs == 1 and d > 1:
                    name = f"{HF_LOOKUP}|{cat}|bs1|D{d}"
                    cells.append(Cell(name, HF_LOOKUP, cat, 1, d, reqs, True, base, None))
                if assisted and bs == 1 and d > 1:
                    name = f"{HF_ASSISTED}|{cat}|bs1|D{d}"
                    cells.append(Cell(name, HF_ASSISTED, cat, 1, d, reqs, True, base, None))
                for algo in algos:
                    shaped = _shaped(algo, config, d)
                    name = f"{algo.name}|{cat}|bs{bs}|D{d}"
                    cells.append(
                        Cell(name, algo.name, cat, bs, d, reqs, shaped.lossless, base, shaped)
                    )
    return cells


def _compiled_counts(models: LoadedModels) -> list[int] | None:
    """The token counts the target's forward is compiled for (``--compile``), else ``None``."""
    compiled = getattr(models.target, "compiled", None)
    return None if compiled is None else list(compiled.counts)
