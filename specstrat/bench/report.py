"""A bench result as text: one line per row, and Spec-Bench's table (categories as rows,
algorithms as columns, speedup and tau (τ) in each cell, an overall row) per batch size and
draft width. A row that is not lossless is marked ``*``, a noisy one ``~``
(:mod:`specstrat.bench.plausibility`), each named under the table with why."""

from __future__ import annotations

from collections.abc import Sequence

from specstrat.bench.run import OVERALL, BenchResult, BenchRow

__all__ = ["render", "rows_table", "spec_bench_tables"]


def _q(q: dict[str, float | None]) -> str:
    med, p90 = q.get("median"), q.get("p90")
    return "-" if med is None or p90 is None else f"{med:.1f}/{p90:.1f}"


def _rates(values: Sequence[float | None]) -> str:
    return " ".join("-" if v is None else f"{v:.2f}" for v in values) or "-"


def _mark(row: BenchRow) -> str:
    return ("" if row.lossless else "*") + ("~" if row.noisy else "")


def rows_table(rows: Sequence[BenchRow]) -> str:
    """Every row on one line: speed, the share of this machine's limit it reached (the
    roofline: the whole run's, then its decode steps' alone), speedup (min-max over rounds),
    tau (τ), verified tokens per step, TTFT and TPOT (median/p90 ms), lossless, acceptance
    (conditional) by position; the labels are ``docs/glossary.md``'s."""
    head = (
        f"{'algorithm':<18} {'category':<15} {'bs':>3} {'D':>2} {'tok/s':>8} {'of limit':>9} "
        f"{'speedup (range)':>19} {'tau':>5} {'verif/step':>10} {'TTFT ms':>13} "
        f"{'TPOT ms':>11}  {'lossless':<8} acceptance (conditional)"
    )
    lines = [head]
    for r in rows:
        lo, hi = r.speedup_range
        speed = f"{r.speedup:.2f}x{'~' if r.noisy else ''} ({lo:.2f}-{hi:.2f})"
        width = "-" if r.verified_per_step is None else f"{r.verified_per_step:.2f}"
        limit = "/".join(
            "-" if f is None else f"{f:.0%}"
            for f in (r.roofline_fraction, r.decode_roofline_fraction)
        )
        lines.append(
            f"{r.algorithm + _mark(r):<18} {r.category:<15} {r.batch_size:>3} {r.draft_tokens:>2} "
            f"{r.tokens_per_s:>8.1f} {limit:>9} {speed:>19} {r.tau:>5.2f} {width:>10} "
            f"{_q(r.ttft_ms):>13} {_q(r.tpot_ms):>11}  {'yes' if r.lossless else 'NO':<8} "
            f"{_rates(r.acceptance_conditional)}"
        )
    return "\n".join(lines)


def spec_bench_tables(result: BenchResult) -> list[str]:
    """Per (batch size, draft width) of the algorithms, Spec-Bench's table: ``speedup / tau``."""
    rows = [r for r in result.rows if r.algorithm != "NONE"]
    widths = sorted({(r.batch_size, r.draft_tokens) for r in rows if r.draft_tokens})
    out = []
    for bs, d in widths:
        # Contenders without drafts (transformers' plain generate) appear in every table.
        picked = [r for r in rows if r.batch_size == bs and r.draft_tokens in (0, d)]
        names = list(dict.fromkeys(r.algorithm for r in picked))
        cell = {(r.category, r.algorithm): r for r in picked}
        col = max(16, *(len(n) + 1 for n in names))
        lines = [f"batch size {bs}, D={d}: speedup over target-only / tau"]
        lines.append(f"{'category':<15}" + "".join(f"{n:>{col}}" for n in names))
        for cat in [*result.categories, OVERALL]:
            if not any((cat, n) in cell for n in names):
                continue
            parts = []
            for n in names:
                r = cell.get((cat, n))
                text = "-" if r is None else f"{r.speedup:.2f}x / {r.tau:.2f}{_mark(r)}"
                parts.append(f"{text:>{col}}")
            lines.append(f"{cat:<15}" + "".join(parts))
        out.append("\n".join(lines))
    return out


def render(result: BenchResult) -> str:
    """The whole report: notes, the rows, Spec-Bench's tables, what is not lossless."""
    parts = ["\n".join(f"# {n}" for n in result.notes), rows_table(result.rows)]
    if len(result.categories) > 1:
        parts += spec_bench_tables(result)
    bad = [r for r in result.rows if not r.lossless]
    if bad:
        lines = [f"  {r.algorithm} {r.category} bs{r.batch_size}: {r.lossless_check}" for r in bad]
        parts.append("* not lossless (its speed is not comparable with target-only's):")
        parts[-1] += "\n" + "\n".join(lines)
    noisy = [r for r in result.rows if r.noisy]
    if noisy:
        lines = [
            f"  {r.algorithm} {r.category} bs{r.batch_size} D{r.draft_tokens}: {r.noisy_reason}"
            for r in noisy
        ]
        parts.append("~ noisy (rerun on a quieter machine, or with more --repeats):")
        parts[-1] += "\n" + "\n".join(lines)
    return "\n\n".join(parts)
