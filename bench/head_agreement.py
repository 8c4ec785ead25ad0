"""Draft heads' held-out agreement with SmolLM2 on Spec-Bench, per category, offline.

The target answers the first turn of ``--per-category`` questions of each Spec-Bench category
greedily (through specstrat's engine, capturing the fused layers' hidden states over the prompt
and the response as it generates), and each head's chained top-1 agreement with those answers
is measured as ``specstrat.train.evaluate`` measures it after training: τ and acceptance
(unconditional) by draft position, the glossary's held-out agreement. A head that attends over
the context reads the prompt's rows; one that does not reads the response's rows only. The
figures match what the engine measures for an EAGLE chain at the same depth (one run, no
timing), so heads are compared in minutes rather than in a bench run each. Last, the share of
the target's greedy response tokens inside each head's draft vocabulary, by category: a
token outside it is never drafted, so the share bounds the first position's acceptance.

Usage: ``python bench/head_agreement.py --spec-bench PATH [--per-category 4]
[--max-new-tokens 64] [--depth 5] HEAD.safetensors [HEAD ...]``; ``shipped`` names the head
the package ships for SmolLM2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specstrat.bench.workloads import (
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_ROWS,
    WorkloadSpec,
    load_prompts,
)
from specstrat.hf import load
from specstrat.hf.smollm2 import smollm2_path
from specstrat.train import GenerationCapturer, evaluate, load_head, shipped_head
from specstrat.train.capture import draft_data

#: Every category of Spec-Bench's question.jsonl (MT-bench's eight apart), in the file's order.
CATEGORIES = (*MT_BENCH_CATEGORIES, *SPEC_BENCH_ROWS[1:])


def main() -> None:
    """Print one table row per category and head, and the mix over all categories."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", metavar="HEAD", help="head files, or 'shipped'")
    parser.add_argument("--spec-bench", required=True, type=Path, metavar="PATH")
    parser.add_argument("--per-category", type=int, default=4, metavar="N")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    parser.add_argument("--depth", type=int, default=5, metavar="D")
    args = parser.parse_args()
    paths = [str(shipped_head("smollm2")) if h == "shipped" else h for h in args.heads]
    models = load(smollm2_path())
    heads = [load_head(p, models.target) for p in paths]
    layers = heads[0].layers
    if any(h.layers != layers for h in heads):
        raise SystemExit("the heads fuse different layers; compare heads of one layer choice")
    spec = WorkloadSpec("spec-bench", args.spec_bench, CATEGORIES)
    prompts = load_prompts(spec, args.per_category)
    texts = [p.text for p in prompts]
    start = time.monotonic()
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
    names = [Path(p).name for p in paths]
    print("| category | " + " | ".join(f"{n} τ" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    groups = {
        category: [
            s for p, s in zip(prompts, sequences, strict=True) if category in (p.category, "all")
        ]
        for category in (*CATEGORIES, "all")
    }
    for category, picked in groups.items():
        cells = []
        for head in heads:
            data = draft_data(models.target, picked, layers=layers, d2t=head.d2t)
            agreement = evaluate(head.head, data, depth=args.depth)
            cells.append(f"{agreement['tau']:.2f}")
        print(f"| {category} | " + " | ".join(cells) + " |")
    for name, head in zip(names, heads, strict=True):
        data = draft_data(models.target, sequences, layers=layers, d2t=head.d2t)
        agreement = evaluate(head.head, data, depth=args.depth)
        rates = ", ".join(f"{a:.3f}" for a in agreement["acceptance"])
        print(f"{name}: all categories τ {agreement['tau']:.2f}, acceptance {rates}")
    print("share of the target's greedy response tokens inside each head's draft vocabulary:")
    for category, picked in groups.items():
        if not picked:
            continue
        greedy = torch.cat([s.greedy[s.context :] for s in picked])  # the response, no row past it
        shares = [float(torch.isin(greedy, h.d2t).float().mean()) for h in heads]
        print(
            f"  {category}: "
            + ", ".join(f"{n} {x:.3f}" for n, x in zip(names, shares, strict=True))
        )


if __name__ == "__main__":
    main()
