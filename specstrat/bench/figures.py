"""The figures of ``specstrat bench``, as formulas over what runs recorded.

- ``tau`` (τ): tokens per drafted verify step (D > 1) per request, drafts accepted plus the
  bonus token, ``sum(accepted + 1) / drafted verify steps``, counting what the
  acceptance rule accepted before any cut at ``max_new_tokens`` or a stop token (1.0 without
  speculation); ``RunStats.acceptance_length`` pooled over runs (``docs/glossary.md``).
- ``plain_step_share``: the share of kept decode request-steps that ran at D = 1 (plain
  decoding, excluded from ``tau``), pooled over runs.
- ``acceptance_by_position`` (unconditional) and ``acceptance_conditional``: acceptance by
  draft position from ``accepted_histogram`` summed over runs, by
  :func:`~specstrat.runtime.acceptance_rates` (re-exported here; the formulas are in
  ``docs/glossary.md``); ``None`` (JSON ``null``) where a position was never proposed, or
  never reached.
- ``ttft_ms``: per request, first kept token minus arrival; ``tpot_ms``: per request with two
  or more tokens, ``(last - first) / (tokens - 1)``; each summarised as median and p90 (linear
  interpolation between order statistics, numpy's default); ``None`` when no request qualifies.
- ``step_split_ms``: per decode step, draft (``drafter.propose``), verify (the target's
  forward), accept (the rule) and scheduler (the rest of the step: resolve, KV rewind, commit,
  relay), from runs in sync mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from specstrat.runtime import RunStats
from specstrat.runtime import acceptance_rates as acceptance_rates

__all__ = [
    "Histogram",
    "Quantiles",
    "acceptance_rates",
    "merge_histograms",
    "percentile",
    "plain_step_share",
    "quantiles",
    "request_latencies",
    "step_split_ms",
    "tau",
    "verified_per_step",
]

Histogram = Mapping[int, Sequence[int]]
#: ``{"median": ..., "p90": ...}``, each ``None`` when nothing was measured.
Quantiles = dict[str, float | None]


def tau(stats: Iterable[RunStats]) -> float:
    """τ: accepted drafts plus bonus per drafted verify step per request, pooled over runs (1.0
    if none)."""
    pooled = list(stats)
    steps = sum(s.verified_requests for s in pooled)
    return sum(s.verified_tokens for s in pooled) / steps if steps else 1.0


def plain_step_share(stats: Iterable[RunStats]) -> float:
    """Kept decode request-steps at D = 1 over all kept decode request-steps, pooled (0.0 if
    none)."""
    pooled = list(stats)
    plain = sum(s.plain_steps for s in pooled)
    steps = plain + sum(s.verified_requests for s in pooled)
    return plain / steps if steps else 0.0


def verified_per_step(stats: Iterable[RunStats]) -> float:
    """Target tokens verified per request per verify step, pooled (1.0 without speculation)."""
    pooled = list(stats)
    steps = sum(s.verified_requests for s in pooled)
    return sum(s.verify_forward_tokens for s in pooled) / steps if steps else 1.0


def merge_histograms(histograms: Iterable[Histogram]) -> dict[int, list[int]]:
    """The sum of several runs' accepted histograms."""
    out: dict[int, list[int]] = {}
    for hist in histograms:
        for proposed, counts in hist.items():
            row = out.setdefault(proposed, [0] * (proposed + 1))
            for accepted, n in enumerate(counts):
                row[accepted] += n
    return dict(sorted(out.items()))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between order statistics
    (numpy's default); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def quantiles(values: Sequence[float]) -> Quantiles:
    """``{"median": p50, "p90": p90}`` of ``values``."""
    return {"median": percentile(values, 50), "p90": percentile(values, 90)}


def request_latencies(
    arrivals: Mapping[str, float],
    first: Mapping[str, float],
    last: Mapping[str, float],
    tokens: Mapping[str, int],
) -> tuple[list[float], list[float]]:
    """Per request, TTFT and (for two or more tokens) TPOT in milliseconds, from its arrival
    time, first and last kept token times and kept token count (all seconds on one clock)."""
    ttft = [(first[rid] - arrivals[rid]) * 1e3 for rid in first]
    tpot = [(last[rid] - first[rid]) * 1e3 / (tokens[rid] - 1) for rid in first if tokens[rid] > 1]
    return ttft, tpot


def step_split_ms(stats: Iterable[RunStats]) -> dict[str, float] | None:
    """Milliseconds per decode step in each stage, pooled over runs; ``None`` with no step."""
    pooled = list(stats)
    steps = sum(s.decode_steps for s in pooled)
    if not steps:
        return None
    draft, verify, accept, whole = (
        sum(getattr(s, f) for s in pooled) * 1e3 / steps
        for f in ("draft_seconds", "verify_seconds", "accept_seconds", "decode_seconds")
    )
    return {
        "draft": draft,
        "verify": verify,
        "accept": accept,
        "scheduler": max(whole - draft - verify - accept, 0.0),
    }
