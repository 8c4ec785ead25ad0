"""A distilled draft LM against SmolLM2: its cost per token and its greedy agreement by depth.

Cost: one decode forward of the draft and of the target (transformers' forward with a KV cache
of ``--context`` tokens, the same thread count), interleaved ``--reps`` times; the median ratio
is what a draft token costs in target decodes, beside the ratio of the weight bytes each reads
per token. Agreement: the target answers the first turn of ``--per-category`` questions of each
Spec-Bench category greedily (through specstrat's engine, capturing the prompt's rows as well),
and the draft's chained greedy agreement with those answers is measured exactly as
``specstrat.train.draft_agreement`` measures it after training: acceptance (unconditional) by
draft position, and τ for a chain of D = 2 .. ``--depth`` + 1 tokens (1 + the first D - 1
acceptances), which is what STANDALONE's engine τ is for greedy requests.

Usage: ``python bench/draft_lm.py --spec-bench PATH [--per-category 3] [--max-new-tokens 64]
[--depth 7] [--reps 40] [--context 200] [DRAFT.safetensors ...]``; no file, or ``shipped``,
names the draft LM the package ships for SmolLM2.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from specstrat.bench.workloads import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_ROWS,
    WorkloadSpec,
    load_prompts,
)
from specstrat.hf import load
from specstrat.hf.smollm2 import smollm2_path
from specstrat.train import (
    GenerationCapturer,
    draft_agreement,
    load_draft_lm,
    raw_model,
    shipped_draft,
)
from specstrat.train.capture import draft_data

CATEGORIES = (*MT_BENCH_CATEGORIES, *SPEC_BENCH_ROWS[1:])


def _bytes(model: Any) -> int:
    """Weight bytes a decode reads: every parameter but the input embedding (it reads one
    row), the LM head included when it is tied to the embedding."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    read: int = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    tied: int = head.numel() * head.element_size() if head is embed else 0
    return read + tied


def _decode_ms(model: Any, context: int, reps: int, other: Any) -> tuple[float, float]:
    """Median ms of one decode forward of ``model`` and of ``other`` after ``context`` tokens,
    interleaved."""
    from transformers import DynamicCache

    ids = torch.randint(0, 1000, (1, context))
    times: tuple[list[float], list[float]] = ([], [])
    with torch.inference_mode():
        caches = []
        for lm in (model, other):
            cache = DynamicCache(config=lm.config)
            lm(input_ids=ids, past_key_values=cache, use_cache=True)
            caches.append(cache)
        step = torch.tensor([[5]])
        for _ in range(reps):
            for k, (lm, cache) in enumerate(zip((model, other), caches, strict=True)):
                start = time.perf_counter()
                lm(input_ids=step, past_key_values=cache, use_cache=True)
                times[k].append((time.perf_counter() - start) * 1e3)
                cache.crop(-1)  # drop the token just decoded
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    """Print the cost line and one agreement table row per category and draft."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", nargs="*", metavar="DRAFT", help="draft files, or 'shipped'")
    parser.add_argument("--spec-bench", required=True, type=Path, metavar="PATH")
    parser.add_argument("--per-category", type=int, default=3, metavar="N")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    parser.add_argument("--depth", type=int, default=7, metavar="D")
    parser.add_argument("--reps", type=int, default=40, metavar="N")
    parser.add_argument("--context", type=int, default=200, metavar="N")
    args = parser.parse_args()
    names = args.drafts or ["shipped"]
    shipped = shipped_draft("smollm2")
    if "shipped" in names and shipped is None:
        raise SystemExit("the package ships no draft LM for smollm2; pass a draft file")
    paths = [str(shipped) if d == "shipped" else d for d in names]
    models = load(smollm2_path())
    drafts = [load_draft_lm(p, models.target) for p in paths]
    with raw_model(models.target) as target:
        for path, trained in zip(paths, drafts, strict=True):
            draft_ms, target_ms = _decode_ms(trained.draft.model, args.context, args.reps, target)
            ratio = _bytes(trained.draft.model) / _bytes(target)
            print(
                f"{Path(path).name}: layers {trained.layers}, decode {draft_ms:.2f} ms against "
                f"the target's {target_ms:.2f} ms = {draft_ms / target_ms:.3f}x a target decode "
                f"(weight bytes per token {ratio:.3f}x; {torch.get_num_threads()} threads)"
            )
    spec = WorkloadSpec("spec-bench", args.spec_bench, CATEGORIES)
    prompts = load_prompts(spec, args.per_category)
    texts = [p.text for p in prompts]
    start = time.monotonic()
    layers = (0, 1)  # the capture's fused features are not read by a draft LM
    capturer = GenerationCapturer(
        models.target,
        models.tokenizer,
        texts,
        layers=layers,
        max_new_tokens=args.max_new_tokens,
        prompt_rows=True,
    )
    _, sequences = capturer.capture(texts)
    print(f"generated {len(texts)} answers in {time.monotonic() - start:.0f} s")
    widths = range(2, args.depth + 2)
    for path, trained in zip(paths, drafts, strict=True):
        d2t = trained.draft.get_buffer("d2t")
        print(f"\n{Path(path).name}: τ by chain width D")
        print("| category | " + " | ".join(f"D={d}" for d in widths) + " |")
        print("|---" * (len(widths) + 1) + "|")
        for category in (*CATEGORIES, "all"):
            picked = [
                s
                for p, s in zip(prompts, sequences, strict=True)
                if category in (p.category, "all")
            ]
            data = draft_data(models.target, picked, layers=layers, d2t=d2t)
            acceptance = draft_agreement(trained.draft, data, depth=args.depth)["acceptance"]
            taus = [1 + sum(acceptance[: d - 1]) for d in widths]
            print(f"| {category} | " + " | ".join(f"{t:.2f}" for t in taus) + " |")
        data = draft_data(models.target, sequences, layers=layers, d2t=d2t)
        agreement = draft_agreement(trained.draft, data, depth=args.depth)
        rates = ", ".join(f"{a:.3f}" for a in agreement["acceptance"])
        print(f"all categories: acceptance (unconditional) {rates}")


if __name__ == "__main__":
    main()
