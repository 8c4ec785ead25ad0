"""End-to-end figures of the plain scheduler on the embedded models, measured side by side.

1. tokens/s with speculation vs target-only (NGRAM with uniform and ragged verify, STANDALONE,
   EAGLE, the block drafters DFLASH and DSPARK; ratio; acceptance length; tokens per request
   each verify runs through the target), through :mod:`specstrat.timing`: one warm-up
   round, then ``--repeats`` interleaved rounds, ratios taken within each round (median and
   range); ``specstrat bench`` measures your own algorithms the same way;
2. the engine's host cost per decode step with a zero-cost model at bs 1/16/64/256, for NONE
   and NGRAM, split into scheduler, drafter, acceptance, metadata/relay and model
   (:mod:`specstrat.bench.overhead`; ``--section overhead --json FILE`` runs only this one and
   writes ``{"NONE": {"1": {"scheduler_us": ..., ...}, ...}, "NGRAM": {...}}``);
3. overlap vs synchronous wall time, and wall time against the time spent inside model forwards
   (target, draft LM and EAGLE head);
4. one speculative step against one plain decode step, split into draft (drafter.propose),
   verify forward, acceptance and the rest (scheduler: resolve, KV rewind, commit, relay);
5. chain vs top-k tree at equal verify budgets (4, 8, 16): acceptance length and tokens/s vs
   target-only, for EAGLE and STANDALONE (``--section trees`` runs only this one).

Usage: ``python bench/e2e.py [--repeats N] [--requests N] [--section all|trees|overhead]
[--json FILE]``. One intra-op thread (tiny tensors).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import specstrat
from specstrat.bench import Contender, interleaved, ratio
from specstrat.bench.overhead import PARTS, SIZES, overhead_table
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._models.model import EagleHead
from specstrat.runtime._worker import ModelWorker
from specstrat.strategies import TopkTree


def timed_run(
    algo: Any, models: EmbeddedModels, requests: list[Request], **config: Any
) -> tuple[float, Engine]:
    engine = Engine(algo, models, EngineConfig(context_len=512, **config))
    start = time.perf_counter()
    engine.run(requests)
    return time.perf_counter() - start, engine


def speed(models: EmbeddedModels, requests: list[Request], repeats: int) -> None:
    # Prompt lookup with ragged verify: a composition (SGLang's NGRAM row has no ragged verify).
    ngram = specstrat.NGRAM
    ragged = replace(
        ngram,
        name="NGRAM_RAGGED",
        capabilities=replace(ngram.capabilities, supports_ragged_verify=True),
    )
    runs: dict[str, tuple[Any, dict[str, Any]]] = {
        "NONE": (specstrat.NONE, {}),
        "NGRAM ragged": (ragged, {}),
        "NGRAM": (ngram, {}),
        "STANDALONE": (specstrat.STANDALONE, {}),
        "EAGLE": (specstrat.EAGLE, {}),
        "DFLASH": (specstrat.DFLASH, {}),
        "DSPARK": (specstrat.DSPARK, {}),
    }
    accept: dict[str, float] = {}
    width: dict[str, float] = {}
    engines: dict[str, Engine] = {}

    def contender(label: str, algo: Any, config: dict[str, Any]) -> Contender:
        def prepare() -> None:
            engines[label] = Engine(algo, models, EngineConfig(context_len=512, **config))

        def run() -> dict[str, list[int]]:
            engine = engines[label]
            out = engine.run(requests)
            accept[label] = engine.stats.acceptance_length
            width[label] = engine.stats.verified_per_step
            return out

        return Contender(label, run, prepare)

    # The timing core: interleaved rounds after one warm-up, ratios within each round.
    contenders = [contender(label, algo, config) for label, (algo, config) in runs.items()]
    timings = interleaved(contenders, rounds=repeats, warmup=1)
    tokens = timings["NONE"].tokens
    print(f"\n1. speculation vs target-only: {len(requests)} requests, {tokens} tokens, D=4, sync")
    print(
        f"{'algorithm':<14} {'tokens/s':>9} {'vs target-only':>22} {'τ':>11} {'verified/step':>14}"
    )
    for label in runs:
        speedup = ratio(timings, label, "NONE")
        lo, hi = min(speedup.per_round), max(speedup.per_round)
        print(
            f"{label:<14} {timings[label].tokens_per_s:>9.0f} "
            f"{f'{speedup.median:.2f}x ({lo:.2f}-{hi:.2f})':>22} {accept[label]:>11.2f}"
            f" {width[label]:>14.2f}"
        )
    print("verified/step: tokens per request the target runs in each TARGET_VERIFY (T = 4 full)")


def overhead(json_path: str | None = None, runs: int = 5) -> None:
    """Section 2: the engine's host cost per decode step, split by part (median of ``runs``),
    for NONE and NGRAM at batch sizes 1, 16, 64 and 256; ``json_path`` gets the table."""
    table = overhead_table([specstrat.get("NONE"), specstrat.get("NGRAM")], SIZES, runs=runs)
    print("\n2. host cost per decode step, zero-cost model, sync (µs/step, median of 5 runs)")
    print(f"{'algorithm':<9} {'bs':>4} " + " ".join(f"{p[:-3]:>10}" for p in PARTS))
    for name, by_bs in table.items():
        for bs, parts in by_bs.items():
            print(f"{name:<9} {bs:>4} " + " ".join(f"{parts[p]:>10.0f}" for p in PARTS))
    print("scheduler = total - drafter - acceptance - metadata/relay - model (the engine's own)")
    if json_path is not None:
        Path(json_path).write_text(json.dumps(table, indent=2) + "\n")
        print(f"wrote {json_path}")


@contextmanager
def model_time(total: list[float]) -> Iterator[None]:
    """Adds the wall time spent in model forwards to ``total[0]``: ``ModelWorker.execute``
    (target and draft LM) and ``EagleHead.forward`` (the EAGLE-style head; never inside the
    former)."""
    patched: list[tuple[type, str]] = [(ModelWorker, "execute"), (EagleHead, "forward")]
    originals: list[Callable[..., Any]] = [getattr(cls, name) for cls, name in patched]

    def timing(real: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - start

        return timed

    for (cls, name), real in zip(patched, originals, strict=True):
        setattr(cls, name, timing(real))
    try:
        yield
    finally:
        for (cls, name), real in zip(patched, originals, strict=True):
            setattr(cls, name, real)


def overlap(models: EmbeddedModels, repeats: int) -> None:
    print("\n3. overlap vs synchronous, bs 64 (64 requests, all admitted at once)")
    requests = workload(64, seed=7)
    print(
        f"{'algorithm':<10} {'sync s':>7} {'overlap s':>10} "
        f"{'overlap/sync':>13} {'model s':>8} {'overlap/model':>14}"
    )
    for name in ("NONE", "EAGLE"):
        sync_s, over_s, forward_s = [], [], []
        config = {"max_running_requests": 64, "graph_buckets": (1, 2, 4, 8, 16, 32, 64)}
        for _ in range(repeats):  # the same engine config for both modes
            sync_s.append(timed_run(specstrat.get(name), models, requests, **config)[0])
            spent = [0.0]
            with model_time(spent):
                wall, _ = timed_run(specstrat.get(name), models, requests, overlap=True, **config)
            over_s.append(wall)
            forward_s.append(spent[0])
        s, o, f = (statistics.median(x) for x in (sync_s, over_s, forward_s))
        print(f"{name:<10} {s:>7.2f} {o:>10.2f} {o / s:>12.2f}x {f:>8.2f} {o / f:>13.2f}x")


def step_split(models: EmbeddedModels, requests: list[Request], repeats: int) -> None:
    print("\n4. one decode step, split (ms per step, medians; D=4, sync)")
    print(
        f"{'algorithm':<11} {'step':>6} {'draft':>6} {'verify':>7} {'accept':>7} {'rest':>6}"
        f" {'vs NONE step':>13} {'tokens/step/req':>16}"
    )
    rows: dict[str, list[list[float]]] = {}
    for _ in range(repeats):
        for name in ("NONE", "NGRAM", "STANDALONE", "EAGLE"):
            _, engine = timed_run(specstrat.get(name), models, requests)
            st = engine.stats
            per = [
                x / st.decode_steps * 1e3
                for x in (st.decode_seconds, st.draft_seconds, st.verify_seconds, st.accept_seconds)
            ]
            rows.setdefault(name, []).append([*per, st.acceptance_length])
    base = statistics.median(r[0] for r in rows["NONE"])
    for name, samples in rows.items():
        step, draft, verify, accept, length = (
            statistics.median(r[i] for r in samples) for i in range(5)
        )
        rest = step - draft - verify - accept
        print(
            f"{name:<11} {step:>6.2f} {draft:>6.2f} {verify:>7.2f} {accept:>7.2f} {rest:>6.2f}"
            f" {step / base:>12.2f}x {length:>16.2f}"
        )


#: Tree shapes (topk, num_steps) measured at each verify budget; topk 1 is the chain.
TREES: dict[int, tuple[tuple[int, int], ...]] = {
    4: ((1, 3), (2, 3), (3, 2)),
    8: ((1, 7), (2, 4), (2, 7), (3, 5), (4, 4)),
    16: ((1, 15), (2, 8), (3, 6), (4, 5), (4, 8)),
}


def trees(models: EmbeddedModels, requests: list[Request], repeats: int) -> None:
    print("\n5. chain vs top-k tree at equal verify budgets (sync, greedy)")
    print(
        f"{'algorithm':<11} {'budget':>6} {'topk':>5} {'steps':>6} {'τ':>11}"
        f" {'tokens/s':>9} {'vs target-only':>15}"
    )
    for name in ("EAGLE", "STANDALONE"):
        for budget, shapes in TREES.items():
            seconds: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
            base: list[float] = []
            accept: dict[tuple[int, int], float] = {}
            tokens = 0
            for _ in range(repeats):
                base.append(timed_run(specstrat.NONE, models, requests, overlap=False)[0])
                for topk, steps in shapes:
                    algo = replace(specstrat.get(name), tree=TopkTree(topk=topk, num_steps=steps))
                    wall, engine = timed_run(
                        algo, models, requests, num_draft_tokens=budget, overlap=False
                    )
                    seconds[(topk, steps)].append(wall)
                    accept[(topk, steps)] = engine.stats.acceptance_length
                    tokens = engine.stats.generated_tokens
            b = statistics.median(base)
            for (topk, steps), walls in seconds.items():
                wall = statistics.median(walls)
                print(
                    f"{name:<11} {budget:>6} {topk:>5} {steps:>6} {accept[(topk, steps)]:>11.2f}"
                    f" {tokens / wall:>9.0f} {b / wall:>14.2f}x"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--section", choices=("all", "trees", "overhead"), default="all")
    parser.add_argument("--json", metavar="FILE", help="with --section overhead: write the table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.section == "overhead":
        overhead(args.json)
        return
    models = EmbeddedModels.load()
    if args.section == "trees":
        trees(models, workload(args.requests), args.repeats)
        return
    speed(models, workload(args.requests), args.repeats)
    overhead()
    overlap(models, args.repeats)
    step_split(models, workload(args.requests), args.repeats)
    trees(models, workload(args.requests), args.repeats)


if __name__ == "__main__":
    main()
