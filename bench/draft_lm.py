"""A distilled draft LM (or a block drafter) against SmolLM2: its cost per token and its greedy
agreement by depth.

Cost: one decode forward of the draft and of the target (transformers' forward with a KV cache
of ``--context`` tokens, the same thread count), interleaved ``--reps`` times; the median ratio
is what a draft token costs in target decodes, beside the ratio of the weight bytes each reads
per token. Agreement: the target answers the first turn of ``--per-category`` questions of each
Spec-Bench category greedily (through specstrat's engine, capturing the prompt's rows as well),
and the draft's chained greedy agreement with those answers is measured exactly as
``specstrat.train.draft_agreement`` measures it after training: acceptance (unconditional) by
draft position, and τ for a chain of D = 2 .. ``--depth`` + 1 tokens (1 + the first D - 1
acceptances), which is what STANDALONE's engine τ is for greedy requests.

A block drafter's file (``specstrat train --kind block``; ``shipped-block`` names the one the
package ships) is measured the same way with ``specstrat.train.block_agreement``: draft ``k`` of
a block is accepted when drafts ``1..k`` all equal the target's greedy tokens, up to its block
size (wider D print ``-``); its cost line is one forward of one row, as for a draft LM.

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
from specstrat.errors import ModelLoadError
from specstrat.hf import load
from specstrat.hf.smollm2 import smollm2_path
from specstrat.train import (
    SHIPPED_BLOCKS,
    GenerationCapturer,
    block_agreement,
    block_lm_metadata,
    draft_agreement,
    load_block_lm,
    load_draft_lm,
    raw_model,
    shipped_draft,
)
from specstrat.train.attach import shipped_file
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


def _load(path: str, target: Any) -> tuple[Any, Any]:
    """The trained file at ``path`` and the agreement that measures it (a block drafter's
    file by its format, else a draft LM's)."""
    try:
        block_lm_metadata(path)
    except ModelLoadError:
        return load_draft_lm(path, target), draft_agreement
    return load_block_lm(path, target), block_agreement


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
    shipped = {
        "shipped": shipped_draft("smollm2"),
        "shipped-block": shipped_file(SHIPPED_BLOCKS, "smollm2"),
    }
    missing = [n for n in names if n in shipped and shipped[n] is None]
    if missing:
        raise SystemExit(f"the package ships no {missing[0]} file for smollm2; pass a file")
    paths = [str(shipped[d]) if d in shipped else d for d in names]
    models = load(smollm2_path())
    loaded = [_load(p, models.target) for p in paths]
    drafts = [trained for trained, _ in loaded]
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
    for path, (trained, agreement_of) in zip(paths, loaded, strict=True):
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
            acceptance = agreement_of(trained.draft, data, depth=args.depth)["acceptance"]
            taus = [
                f"{1 + sum(acceptance[: d - 1]):.2f}" if d - 1 <= len(acceptance) else "-"
                for d in widths
            ]
            print(f"| {category} | " + " | ".join(taus) + " |")
        data = draft_data(models.target, sequences, layers=layers, d2t=d2t)
        agreement = agreement_of(trained.draft, data, depth=args.depth)
        rates = ", ".join(f"{a:.3f}" for a in agreement["acceptance"])
        print(f"all categories: acceptance (unconditional) {rates}")


if __name__ == "__main__":
    main()
