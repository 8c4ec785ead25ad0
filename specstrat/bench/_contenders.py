"""The engine and transformers contenders of :func:`~specstrat.bench.run_bench`: a fresh engine
built (untimed) before each run, requests all at once or arriving at a Poisson rate, the
extra untimed sync run that splits an overlap cell's step into its stages, and the line that
counts what will run."""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Sequence

from specstrat.bench.hf_baseline import GenerateRecord, generate_run
from specstrat.bench.rows import HF_ASSISTED, HF_LOOKUP, Cell, Record
from specstrat.models import LoadedModels
from specstrat.runtime import Engine, EngineConfig, Request, RunStats
from specstrat.timing import Contender


def contender(
    cell: Cell, models: LoadedModels, context_len: int, *, overlap: bool, rate: float | None
) -> Contender:
    """A timing-core contender for ``cell``; each call records into ``cell.records``."""
    if cell.spec is None:
        lookup = cell.draft_tokens - 1 if cell.algorithm == HF_LOOKUP else 0
        assisted = cell.draft_tokens - 1 if cell.algorithm == HF_ASSISTED else 0

        def generate() -> dict[str, list[int]]:
            rec = GenerateRecord()
            out = generate_run(
                models,
                cell.requests,
                batch_size=cell.batch_size,
                lookup=lookup,
                record=rec,
                assisted=assisted,
            )
            cell.records.append(Record(out, None, rec.arrivals, rec.first, rec.last, rec.forwards))
            return out

        return Contender(cell.name, generate)
    algo = cell.spec
    settings = engine_config(cell, context_len, overlap)
    state: dict[str, Engine] = {}

    def prepare() -> None:
        state["engine"] = Engine(algo, models, settings)

    def run() -> dict[str, list[int]]:
        engine = state.pop("engine")
        out, arrivals = run_engine(engine, cell.requests, rate)
        s = engine.stats
        cell.records.append(Record(out, s, arrivals, s.first_token_at, s.last_token_at))
        return out

    return Contender(cell.name, run, prepare)


def engine_config(cell: Cell, context_len: int, overlap: bool) -> EngineConfig:
    """The engine settings of ``cell``: its width and batch size, graph buckets up to it."""
    return EngineConfig(
        num_draft_tokens=max(cell.draft_tokens, 1),
        max_running_requests=cell.batch_size,
        context_len=context_len,
        overlap=overlap,
        graph_buckets=tuple(sorted({1, 2, 4, 8, 16, cell.batch_size})),
    )


def run_engine(
    engine: Engine, requests: Sequence[Request], rate: float | None
) -> tuple[dict[str, list[int]], dict[str, float]]:
    """Run ``requests``, all at once or arriving at ``rate`` per second (Poisson, seed 0);
    the outputs and each request's arrival time."""
    start = time.perf_counter()
    if rate is None:
        return engine.run(list(requests)), {r.rid: start for r in requests}
    gen = random.Random(0)
    at, offsets = 0.0, []
    for _ in requests:
        at += gen.expovariate(rate)
        offsets.append(at)
    pending = deque(zip(offsets, requests, strict=True))
    arrivals: dict[str, float] = {}

    def source(idle: bool) -> bool:
        now = time.perf_counter() - start
        if idle and pending and pending[0][0] > now:  # nothing runs: wait for the next one
            time.sleep(pending[0][0] - now)
            now = pending[0][0]
        while pending and pending[0][0] <= now:
            offset, request = pending.popleft()
            arrivals[request.rid] = start + offset
            engine.submit(request)
        return bool(pending)

    return engine.run(source=source), arrivals


def sync_split(cell: Cell, models: LoadedModels, context_len: int) -> RunStats:
    """One untimed sync run of ``cell``, for its stage split."""
    assert cell.spec is not None  # only engine cells are split
    engine = Engine(cell.spec, models, engine_config(cell, context_len, False))
    engine.run(list(cell.requests))
    return engine.stats


def plan(cells: Sequence[Cell], *, warmup: int, repeats: int, overlap: bool) -> str:
    """What will run, counted from ``cells``: every run; the contenders (algorithms, baselines
    included) and the categories, batch sizes and draft widths they cover; the cells (one per
    contender and setting, counted by contender), the rounds, and the untimed sync runs that
    split an overlap cell's step."""
    per_contender = Counter(c.algorithm for c in cells)
    covered = ", ".join(
        _count(len(values), *words)
        for values, words in (
            ({c.category for c in cells}, ("category", "categories")),
            ({c.batch_size for c in cells}, ("batch size", "batch sizes")),
            ({c.draft_tokens for c in cells if c.draft_tokens}, ("draft width", "draft widths")),
        )
    )
    splits = sum(c.spec is not None for c in cells) if overlap else 0
    cells_by = ", ".join(f"{name} {n}" for name, n in per_contender.items())
    line = (
        f"{len(cells) * (warmup + repeats) + splits} runs: "
        f"{_count(len(per_contender), 'contender', 'contenders')} over {covered} = "
        f"{_count(len(cells), 'cell', 'cells')} ({cells_by}) x "
        f"({warmup} warm-up + {_count(repeats, 'counted round', 'counted rounds')})"
    )
    if splits:
        line += f" + {_count(splits, 'untimed sync run', 'untimed sync runs')} (stage split)"
    return line


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
