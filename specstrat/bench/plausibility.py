"""Which bench rows to distrust: a speedup its τ cannot explain, or rounds that disagree.

A speculative step gains ``g`` tokens a request (τ, mixed with the plain steps' 1) for the
price of one verify of ``T`` tokens, which costs ``verify_cost[T]`` decodes (the run measured
it, :mod:`specstrat.bench.verify_cost`), while a plain step costs one decode. No drafter is
free, so with ``p`` the share of plain steps the speedup over target-only cannot pass the
**ceiling** ``g / (p + (1 - p) * verify_cost[T])``. A row is flagged **noisy** when

- its median speedup passes the ceiling by more than ``tolerance`` (default 15%: the machine's
  round-to-round spread), which a loaded machine produces when target-only's runs were slowed
  and the algorithm's were not; or
- its counted rounds disagree: ``(max - min) / median`` of the per-round speedups above
  ``spread`` (default 0.3).

``T`` is the row's ``verified_per_step`` rounded (widths past the widest measured take the
widest's cost, which only raises the ceiling). Rows without a ceiling (target-only, which is
the reference, and transformers' contenders, which run another engine) are judged by their
rounds alone. The flags go in the JSON (``speedup_ceiling``, ``noisy``, ``noisy_reason``), the
table (``~`` after the speedup, the reason under the table) and the plots (hatched bars).
"""

from __future__ import annotations

from dataclasses import replace

from specstrat.bench.rows import HF_ASSISTED, HF_GENERATE, HF_LOOKUP, BenchRow

__all__ = ["SPREAD", "TOLERANCE", "speedup_ceiling", "with_plausibility"]

#: How far past its ceiling a speedup may go before it is flagged (the machine's spread).
TOLERANCE = 0.15
#: The largest ``(max - min) / median`` of a row's per-round speedups not flagged.
SPREAD = 0.3


def speedup_ceiling(row: BenchRow, verify_cost: dict[str, float]) -> float | None:
    """The most ``row``'s speedup over target-only can be with a free drafter: tokens gained a
    step over what its verify costs (``None`` for target-only and transformers' contenders,
    or without a measured cost)."""
    if row.algorithm in ("NONE", HF_GENERATE, HF_LOOKUP, HF_ASSISTED) or not verify_cost:
        return None
    plain, gained = row.plain_step_share or 0.0, row.gained_per_step
    verified = row.verified_per_step or float(max(row.draft_tokens, 1))
    widths = sorted(int(t) for t in verify_cost)
    t = round(verified)
    if t < 2:
        return gained  # a verify of one token costs a decode
    cost = verify_cost[str(min(max(t, widths[0]), widths[-1]))]
    # The plain steps cost a decode each, the drafted ones a verify.
    return gained / (plain + (1 - plain) * cost)


def with_plausibility(
    row: BenchRow,
    verify_cost: dict[str, float],
    *,
    tolerance: float = TOLERANCE,
    spread: float = SPREAD,
) -> BenchRow:
    """``row`` with ``speedup_ceiling``, ``noisy`` and ``noisy_reason`` set (see the module
    docstring); ``verify_cost``: the run's map from T (a string) to verify(T) / decode."""
    ceiling = speedup_ceiling(row, verify_cost)
    reasons = []
    if ceiling is not None and row.speedup > ceiling * (1 + tolerance):
        reasons.append(
            f"speedup {row.speedup:.2f}x exceeds the {ceiling:.2f}x its tau {row.tau:.2f} and "
            "this run's verify cost allow (target-only was likely slowed by other load)"
        )
    lo, hi = row.speedup_range
    if row.rounds > 1 and row.speedup > 0 and (hi - lo) / row.speedup > spread:
        reasons.append(
            f"its {row.rounds} rounds disagree: speedup {lo:.2f}x to {hi:.2f}x (more than "
            f"{spread:.0%} of the median apart)"
        )
    return replace(
        row,
        speedup_ceiling=ceiling,
        noisy=bool(reasons),
        noisy_reason="; ".join(reasons) or None,
    )
