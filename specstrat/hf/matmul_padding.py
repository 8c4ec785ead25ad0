"""Padding a matmul to the row count this machine runs fastest.

On some CPUs a matmul of a few rows costs more than one of a few more (torch picks another
kernel by shape): :func:`head_padding` times the row counts once and says which to pad, and
:class:`~specstrat.hf.fast_llama.FastLlamaForward` pads its LM head's matmul by it.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

__all__ = ["PAD_GAIN", "PAD_ROWS", "head_padding"]


#: Row counts :func:`head_padding` times, and how much faster a padded matmul must be to pad.
PAD_ROWS, PAD_GAIN = 8, 0.85


def _matmul_seconds(weight: torch.Tensor, rows: int, repeats: int) -> float:
    """The median time of ``repeats`` matmuls of ``rows`` rows by ``weight``, after one."""
    x = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            start = time.perf_counter()
            F.linear(x, weight)
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def head_padding(weight: torch.Tensor, repeats: int = 3) -> dict[int, int]:
    """For ``n`` of 1 .. :data:`PAD_ROWS` rows, the row count ``m >= n`` at which a matmul by
    ``weight`` (the LM head) runs fastest, where that beats ``n`` rows by :data:`PAD_GAIN`;
    rows missing from the map are not padded. Timed on this machine, each count's median of
    ``repeats`` after a warm-up: on one 2-core AMD EPYC host, SmolLM2's LM head took 12.4, 28.3,
    41.1 and 22.9 ms for 1, 2, 3 and 4 rows (torch 2.13, two threads), so 2 and 3 rows (a
    verify of 2 or 3 tokens) ran fastest padded to 4; an Intel host showed no such step."""
    cost = {rows: _matmul_seconds(weight, rows, repeats) for rows in range(1, PAD_ROWS + 1)}
    padding: dict[int, int] = {}
    for rows in cost:
        best = min(range(rows, PAD_ROWS + 1), key=lambda m: cost[m])
        if best != rows and cost[best] < PAD_GAIN * cost[rows]:
            padding[rows] = best
    return padding
