"""Disaggregation figures: decode-side draft-input build, batched vs per-request; e2e tokens/s.

1. ``EagleDisaggDraftBuilder`` on a :class:`~specstrat.PrebuiltBatch` (fields batched once, at
   receive) against the engines' first builder, which stacks per-request tensors as it goes
   (``torch.as_tensor`` per request, then ``torch.stack``), at bs 1/64/256/1024: µs per build
   (median, interleaved), their ratio, and aten ops per build counted with a dispatch mode.
2. End-to-end tokens/s of EAGLE with prefill in a second process vs all in one process.

Usage: ``python bench/disagg.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from measure import OpCounter, median_seconds

import specstrat
from specstrat import PrebuiltBatch
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.runtime._disagg import run_disaggregated
from specstrat.strategies import EagleDisaggDraftBuilder

TOPK, HIDDEN = 4, 4096  # a production-sized hidden state


def per_request_baseline(reqs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The engines' first decode-side builder: one tensor per request per field, then stack."""
    return {
        "topk_p": torch.stack([torch.as_tensor(r["topk_p"]) for r in reqs]),
        "topk_index": torch.stack([torch.as_tensor(r["topk_index"]) for r in reqs]),
        "hidden_states": torch.stack([torch.as_tensor(r["hidden"]) for r in reqs]),
        "verified_id": torch.stack([torch.as_tensor(r["last"]) for r in reqs]),
        "seq_lens": torch.stack([torch.as_tensor(r["seq_len"]) for r in reqs]),
    }


def builders(repeats: int) -> None:
    print(f"1. decode-side draft-input build, EAGLE fields (topk {TOPK}, hidden {HIDDEN})")
    print(
        f"{'bs':>5} | {'batched µs':>10} {'per-request µs':>15} "
        f"{'ratio':>7} | {'batched ops':>11} {'per-request ops':>15}"
    )
    builder = EagleDisaggDraftBuilder()
    for bs in (1, 64, 256, 1024):
        gen = torch.Generator().manual_seed(bs)
        topk_p, hidden = torch.rand(bs, TOPK, generator=gen), torch.randn(bs, HIDDEN, generator=gen)
        topk_index = torch.randint(0, 256, (bs, TOPK), generator=gen)
        seq_lens, last = (
            torch.randint(1, 4096, (bs,), generator=gen),
            torch.randint(0, 256, (bs,), generator=gen),
        )
        batch = PrebuiltBatch(
            rids=tuple(f"r{i}" for i in range(bs)),
            slots=torch.arange(1, bs + 1),
            seq_lens=seq_lens,
            topk_p=topk_p,
            topk_index=topk_index,
            hidden_states=hidden,
        )
        # What the engines received per request: one record each, tensors per field.
        reqs = [
            {
                "topk_p": topk_p[i].clone(),
                "topk_index": topk_index[i].clone(),
                "hidden": hidden[i].clone(),
                "last": int(last[i]),
                "seq_len": int(seq_lens[i]),
            }
            for i in range(bs)
        ]

        def batched() -> object:
            return builder.build_disagg_draft_input(batch, last, None)  # noqa: B023

        def per_request() -> object:
            return per_request_baseline(reqs)  # noqa: B023

        fast = 0.0
        slow = 0.0
        for _ in range(3):  # interleaved
            fast += 1e6 * median_seconds(batched, repeats)
            slow += 1e6 * median_seconds(per_request, repeats)
        with OpCounter() as fast_ops:
            batched()
        with OpCounter() as slow_ops:
            per_request()
        print(
            f"{bs:>5} | {fast / 3:>10.1f} {slow / 3:>15.1f} "
            f"{slow / fast:>6.1f}x | {fast_ops.ops:>11} {slow_ops.ops:>15}"
        )


def end_to_end(repeats: int) -> None:
    models = EmbeddedModels.load()
    requests = workload(16, seed=5)
    config = EngineConfig(context_len=512, max_running_requests=16)
    single_s, disagg_s, decode_tps = [], [], []
    tokens = 0
    for _ in range(repeats):
        engine = Engine(specstrat.EAGLE, models, config)
        start = time.perf_counter()
        engine.run(requests)
        single_s.append(time.perf_counter() - start)
        tokens = engine.stats.generated_tokens
        start = time.perf_counter()
        result = run_disaggregated(specstrat.EAGLE, requests, config, models=models, batch_size=4)
        disagg_s.append(time.perf_counter() - start)
        decode_tps.append(result.stats.tokens_per_second)
    s, d = statistics.median(single_s), statistics.median(disagg_s)
    print(f"\n2. EAGLE end to end, 16 requests, {tokens} tokens (wall time incl. process start)")
    decode = statistics.median(decode_tps)
    print(f"single process: {tokens / s:.0f} tokens/s")
    print(
        f"disaggregated, whole call incl. spawning the prefill process: {tokens / d:.0f} tokens/s"
    )
    print(f"disaggregated, decode loop only (engine.run on the decode side): {decode:.0f} tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    builders(args.repeats)
    end_to_end(max(1, args.repeats // 10))


if __name__ == "__main__":
    main()
