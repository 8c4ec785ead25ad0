"""Rejection sampling figures: launches and host syncs per accept/resample step, and acceptance
length under sampling.

1. Launches and syncs of one accept/resample step for a batch of chains (D=4, vocab 256): the
   fused kernel (counted on ``meta`` tensors with the launch recorded: any host read would
   raise), the torch twin (vectorised eager), and a per-request eager loop that decides each
   draft with ``.item()`` (how a first implementation reads).
2. τ (tokens per drafted step) of EAGLE and NGRAM at temperature 0, 0.7 and 1.0 (16 requests, D=4,
   rejection sampling), with the target-only run's tokens/s beside each.

Usage: ``python bench/sampling.py``.
"""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

import torch
from measure import OpCounter

import specstrat
import specstrat.kernels.rejection_sampling as ks
from specstrat import SamplingParams
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload

N, V = 3, 256


def inputs(bs: int, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(bs)
    p = torch.softmax(torch.randn(bs, N + 1, V, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(bs, N, V, generator=gen, dtype=torch.float64), -1)
    batch = {
        "p": p,
        "q": q,
        "tokens": torch.randint(0, V, (bs, N), generator=gen),
        "lengths": torch.full((bs,), N),
        "seeds": torch.arange(bs),
        "positions": torch.arange(bs),
    }
    return {k: v.to(device) for k, v in batch.items()}


def loop_baseline(x: dict[str, torch.Tensor]) -> list[int]:
    """Per request, per draft: a host decision with .item() (the eager first implementation)."""
    bonus = []
    for row in range(x["tokens"].shape[0]):
        j = 0
        while j < int(x["lengths"][row].item()):
            token = int(x["tokens"][row, j].item())
            u = float(torch.rand(()).item())
            if u * float(x["q"][row, j, token].item()) >= float(x["p"][row, j, token].item()):
                break
            j += 1
        probs = x["p"][row, j]
        bonus.append(int(torch.multinomial(probs, 1).item()))
    return bonus


def counts(bs: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    launched: list[object] = []
    meta = inputs(bs, "meta")
    with (
        patch.object(ks, "launch", lambda kernel, grid, *a, **kw: launched.append(grid)),
        patch.object(ks, "resolve_backend", lambda backend, *tensors: "triton"),
        OpCounter() as fused,
    ):
        ks.rejection_sample(**meta, backend="triton")
    cpu = inputs(bs, "cpu")
    with OpCounter() as twin:
        ks.rejection_sample_ref(**cpu)
    with OpCounter() as loop:
        loop_baseline(cpu)
    return (
        (fused.launches + len(launched), fused.syncs),
        (twin.launches, twin.syncs),
        (loop.launches, loop.syncs),
    )


def main() -> None:
    torch.set_num_threads(1)
    print(f"1. one accept/resample step, D={N + 1} (3 drafts), vocab {V}")
    print(
        f"{'bs':>5} | {'fused launches syncs':>21} "
        f"| {'twin launches syncs':>20} | {'loop launches syncs':>20}"
    )
    for bs in (1, 16, 64, 256):
        (fl, fs), (tl_, ts), (ll, ls) = counts(bs)
        print(f"{bs:>5} | {fl:>14} {fs:>6} | {tl_:>13} {ts:>6} | {ll:>13} {ls:>6}")
    models = EmbeddedModels.load()
    print("\n2. τ (tokens per drafted step) under sampling (16 requests, D=4, sync)")
    print(f"{'temperature':>11} | {'EAGLE':>6} | {'NGRAM':>6}")
    for temperature in (0.0, 0.7, 1.0):
        requests = workload(16, sampling=SamplingParams(temperature=temperature, seed=1))
        row = []
        for algo in (specstrat.EAGLE, specstrat.NGRAM):
            engine = Engine(algo, models, EngineConfig(context_len=512))
            engine.run([replace(r) for r in requests])
            row.append(engine.stats.acceptance_length)
        print(f"{temperature:>11} | {row[0]:>6.2f} | {row[1]:>6.2f}")


if __name__ == "__main__":
    main()
