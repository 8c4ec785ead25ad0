"""SmolLM2 (or any Hugging Face model) in specstrat against transformers itself, side by side.

1. Batch size 1: transformers ``generate`` plain and with its own prompt lookup
   (``prompt_lookup_num_tokens``), specstrat NONE, NGRAM, NGRAM with ragged verify and early
   exit; every output checked against plain ``generate`` (greedy, certified ties allowed).
2. Batch size 8: transformers ``generate`` on a left-padded batch against specstrat's
   continuous batching (NONE, NGRAM).
3. One TARGET_VERIFY forward of 8 tokens over one decode forward, in specstrat (paged
   attention through the adapter) and in transformers (its own attention and KV cache).
4. Early exit: acceptance length per exit layer.
5. Per prompt of the code-editing workload: transformers' prompt lookup over its plain
   ``generate`` (the figures recorded beside ``specstrat.hf.code_workload.CODE_TASKS``).

All through :func:`specstrat.bench.interleaved` (rounds A B C A B C ..., warm-up not counted,
ratios within a round). Both sides run on ``--threads`` torch threads.

Usage: ``python bench/hf_speed.py [--model smollm2|PATH] [--requests 8] [--max-new-tokens 64]
[--rounds 3] [--threads 1] [--json FILE] [--sections 1,2,3,4,5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from specstrat import NGRAM, NONE, SpecAlgorithm
from specstrat.bench import Contender, interleaved, ratio
from specstrat.hf import (
    NGRAM_RAGGED,
    HFModels,
    compare,
    generate_reference,
    generation_config,
    load,
    plain_defaults,
)
from specstrat.hf.algorithms import early_exit_algorithm
from specstrat.hf.hf_demo import code_requests, default_context_len
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig, Request


def hf_generate(
    models: HFModels, requests: Sequence[Request], *, lookup: int = 0, batch: bool = False
) -> Callable[[], dict[str, list[int]]]:
    """transformers' greedy generate over the requests: one at a time (``lookup``: its prompt
    lookup with that many candidate tokens), or as one left-padded ``batch``; both through
    :func:`specstrat.hf.generation_config` (the model's own generation defaults off)."""
    lm = models.target
    pad = models.tokenizer.pad_token_id
    pad = pad if isinstance(pad, int) else min(models.eos_token_ids, default=0)

    def one_by_one() -> dict[str, list[int]]:
        return generate_reference(lm, requests, pad_token_id=pad, prompt_lookup_num_tokens=lookup)

    def padded() -> dict[str, list[int]]:
        width = max(len(r.prompt) for r in requests)
        ids = torch.full((len(requests), width), pad)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(requests):
            ids[i, width - len(r.prompt) :] = torch.tensor(list(r.prompt))
            mask[i, width - len(r.prompt) :] = 1
        config = generation_config(
            lm, requests[0].max_new_tokens, models.eos_token_ids, pad_token_id=pad
        )
        with lm.reference() as model, plain_defaults(model), torch.inference_mode():
            done = model.generate(ids, attention_mask=mask, generation_config=config)
        out = {}
        for i, r in enumerate(requests):
            row = [int(t) for t in done[i, width:]]
            stop = next((j + 1 for j, t in enumerate(row) if t in models.eos_token_ids), len(row))
            out[r.rid] = row[:stop]
        return out

    return padded if batch else one_by_one


def engine_run(
    models: HFModels, algo: SpecAlgorithm[Any], requests: Sequence[Request], *, bs: int, d: int
) -> tuple[Engine, Callable[[], dict[str, list[int]]]]:
    """One engine for every round (its stats add up over them); each round submits the
    requests under fresh ids (an engine refuses an id it has seen) and reports the old ones."""
    config = EngineConfig(
        num_draft_tokens=d,
        max_running_requests=bs,
        context_len=default_context_len(requests, algo, d),
    )
    engine = Engine(algo, models, config)
    rounds = iter(range(1 << 30))

    def run() -> dict[str, list[int]]:
        n = next(rounds)
        out = engine.run([replace(r, rid=f"{r.rid}~{n}") for r in requests])
        return {r.rid: out[f"{r.rid}~{n}"] for r in requests}

    return engine, run


def _checks(
    models: HFModels, requests: Sequence[Request], timings: Mapping[str, Any], reference: str
) -> dict[str, str]:
    want = timings[reference].outputs
    return {n: compare(models.target, requests, t.outputs, want).line() for n, t in timings.items()}


def section_bs1(
    models: HFModels, requests: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    d = args.draft_tokens
    engines = {
        a.name: engine_run(models, a, requests, bs=1, d=d)
        for a in (NONE, NGRAM, NGRAM_RAGGED, early_exit_algorithm(args.exit_layer))
    }
    contenders = [
        Contender("hf generate", hf_generate(models, requests)),
        Contender("hf prompt lookup", hf_generate(models, requests, lookup=d - 1)),
        *(Contender(name, run) for name, (_, run) in engines.items()),
    ]
    timings = interleaved(contenders, rounds=args.rounds, warmup=1, progress=_say)
    rows = {}
    for name, t in timings.items():
        rows[name] = {
            "tokens_per_s": t.tokens_per_s,
            "vs_hf_generate": ratio(timings, name, "hf generate").line(),
            "vs_specstrat_none": ratio(timings, name, "NONE").line(),
        }
        if name in engines:
            rows[name]["acceptance_length"] = engines[name][0].stats.acceptance_length
    return {"rows": rows, "lossless": _checks(models, requests, timings, "hf generate")}


def section_bs8(
    models: HFModels, requests: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    batch = (requests * 8)[:8] if len(requests) < 8 else requests[:8]
    batch = [replace(r, rid=f"{r.rid}@{i}") for i, r in enumerate(batch)]
    contenders = [Contender("hf generate bs8", hf_generate(models, batch, batch=True))]
    for algo in (NONE, NGRAM):
        _, run = engine_run(models, algo, batch, bs=8, d=args.draft_tokens)
        contenders.append(Contender(f"{algo.name} bs8", run))
    timings = interleaved(contenders, rounds=args.rounds, warmup=1, progress=_say)
    rows = {
        name: {
            "tokens_per_s": t.tokens_per_s,
            "vs_hf_generate_bs8": ratio(timings, name, "hf generate bs8").line(),
        }
        for name, t in timings.items()
    }
    return {"rows": rows, "lossless": _checks(models, batch, timings, "hf generate bs8")}


def section_forward(
    models: HFModels, requests: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    """An 8-token verify over a decode after the first prompt, both sides
    (:func:`specstrat.bench.verify_cost.measure_verify_cost`; ``specstrat bench`` reports every
    T from 2 to 9)."""
    from specstrat.bench.verify_cost import measure_verify_cost

    t = 8
    cost = measure_verify_cost(
        models.target, requests[0].prompt, tokens_per_req=(t,), samples=args.rounds * 5
    )
    assert cost.transformers is not None  # an HF target: both sides ran
    return {
        f"specstrat_verify{t}_over_decode": cost.specstrat[str(t)],
        f"transformers_forward{t}_over_1": cost.transformers[str(t)],
    }


def section_early_exit(
    models: HFModels, requests: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    rows = {}
    layers = models.target.shape.layers
    for k in [k for k in (4, 8, 12, 16, 20, 24) if k < layers]:
        engine, run = engine_run(
            models, early_exit_algorithm(k), requests, bs=8, d=args.draft_tokens
        )
        _say(f"early exit {k}")
        run()
        stats = engine.stats
        rows[str(k)] = {
            "acceptance_length": stats.acceptance_length,
            "acceptance_by_position": stats.acceptance_by_position,
        }
    return rows


def section_per_prompt(
    models: HFModels, requests: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    """transformers' prompt lookup over plain generate, prompt by prompt."""
    rows = {}
    for r in requests:
        contenders = [
            Contender("plain", hf_generate(models, [r])),
            Contender("lookup", hf_generate(models, [r], lookup=args.draft_tokens - 1)),
        ]
        timings = interleaved(contenders, rounds=args.rounds, warmup=1)
        rows[r.rid] = ratio(timings, "lookup", "plain").line()
        _say(f"{r.rid}: {rows[r.rid]}")
    return rows


def _say(text: str) -> None:
    print(f"  {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--draft-tokens",
        type=int,
        default=9,
        help="D (root included); transformers' prompt lookup gets D - 1 candidates",
    )
    parser.add_argument("--exit-layer", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sections", default="1,2,3,4,5")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load(smollm2_path() if args.model == "smollm2" else args.model)
    requests = code_requests(models, args.requests, args.max_new_tokens)
    sections = {
        "1": section_bs1,
        "2": section_bs8,
        "3": section_forward,
        "4": section_early_exit,
        "5": section_per_prompt,
    }
    report: dict[str, Any] = {
        "model": models.source,
        "threads": args.threads,
        "requests": args.requests,
        "max_new_tokens": args.max_new_tokens,
        "draft_tokens": args.draft_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": os.getloadavg(),
    }
    for key in args.sections.split(","):
        print(f"section {key}: {sections[key].__name__}", flush=True)
        report[sections[key].__name__] = sections[key](models, requests, args)
        print(json.dumps(report[sections[key].__name__], indent=2), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
