"""The plots of ``specstrat bench --plot DIR`` (matplotlib, imported here only, Agg backend).

Every run writes ``acceptance_by_position.png`` (acceptance by position, conditional solid and
unconditional dashed, per algorithm and draft width, at the first batch size over all
categories, each point labelled with the verify steps that reached it) and
``speedup.png`` (speedup over target-only per category and algorithm, at the first batch size
and the widest draft: the median round, whiskers from the slowest to the fastest, noisy rows
hatched); a sweep adds
``tau_speedup_vs_batch_size.png`` and/or ``tau_speedup_vs_draft_tokens.png``; a run with an
engine contender adds ``draft_width_over_time.png`` (the D its speculation policy chose at each
decode step of the first counted round, per algorithm, at the first batch size and widest D);
``roofline.png`` draws each row's tokens/s beside this machine's limit for it
(:mod:`specstrat.bench.roofline`), at the first batch size over all categories.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specstrat.bench.run import OVERALL, BenchResult, BenchRow
from specstrat.errors import InvalidConfig

__all__ = ["write_plots"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise InvalidConfig(
            "--plot needs matplotlib: pip install 'specstrat[bench]' (or drop --plot)"
        ) from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _summary(result: BenchResult) -> str:
    """The category rows to plot: the overall one when there are several."""
    return OVERALL if len(result.categories) > 1 else result.categories[0]


def write_plots(result: BenchResult, directory: str | Path) -> list[Path]:
    """Write the PNGs into ``directory`` (created if missing); their paths."""
    plt = _pyplot()
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidConfig(f"--plot {out}: cannot create it ({exc.strerror})") from exc
    rows = [r for r in result.rows if r.algorithm != "NONE"]
    bs0 = min(r.batch_size for r in result.rows)
    paths = [
        _acceptance(plt, [r for r in rows if r.batch_size == bs0], _summary(result), out),
        _speedup(plt, rows, result.categories, bs0, out),
    ]
    limited = [r for r in result.rows if r.batch_size == bs0 and r.roofline_tokens_per_s]
    if limited:
        paths.append(_roofline(plt, limited, _summary(result), out))
    setup = result.setup
    for key, label in (("batch_sizes", "batch_size"), ("draft_tokens", "draft_tokens")):
        if len(setup[key]) > 1:
            paths.append(_sweep(plt, rows, _summary(result), label, out))
    timed = [r for r in rows if r.widths and r.batch_size == bs0]
    if timed:
        paths.append(_widths(plt, timed, out))
    return paths


def _widths(plt: Any, rows: Sequence[BenchRow], out: Path) -> Path:
    """D per decode step, one step line per algorithm (its first category's row)."""
    widest = max(r.draft_tokens for r in rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn: set[str] = set()
    for r in rows:
        if r.draft_tokens != widest or r.algorithm in drawn or r.category == OVERALL:
            continue
        drawn.add(r.algorithm)
        ax.step(range(len(r.widths)), r.widths, where="post", label=f"{r.algorithm} ({r.category})")
    ax.set_xlabel("decode step (first counted round)")
    ax.set_ylabel("D chosen (1 = plain decode)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"draft width over time (batch size {rows[0].batch_size}, D={widest})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    return _save(plt, fig, out / "draft_width_over_time.png")


def _roofline(plt: Any, rows: Sequence[BenchRow], category: str, out: Path) -> Path:
    """Per row of ``category``: measured tokens/s (bar) and the limit (a tick above it)."""
    picked = [r for r in rows if r.category == category]
    labels = [f"{r.algorithm}" + (f" D={r.draft_tokens}" if r.draft_tokens else "") for r in picked]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(picked)), 4))
    xs = list(range(len(picked)))
    ax.bar(xs, [r.tokens_per_s for r in picked], width=0.6, label="measured tokens/s")
    limits = [r.roofline_tokens_per_s or 0.0 for r in picked]
    ax.scatter(xs, limits, marker="_", s=900, color="black", label="limit (roofline)")
    for x, r in zip(xs, picked, strict=True):
        ax.annotate(
            f"{(r.roofline_fraction or 0):.0%}",
            (x, r.tokens_per_s),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_xticks(xs, labels, rotation=20)
    ax.set_ylim(0, 1.15 * max(limits))
    ax.set_ylabel("tokens/s")
    ax.set_title(
        f"tokens/s against this machine's limit ({category}, batch size {rows[0].batch_size})"
    )
    ax.legend(fontsize="small")
    return _save(plt, fig, out / "roofline.png")


def _reached(row: BenchRow) -> list[int]:
    """Per draft position, the verify steps that reached it (proposed it with every earlier
    position accepted): the sample behind its conditional acceptance."""
    hist = {int(p): counts for p, counts in row.accepted_histogram.items()}
    return [
        sum(sum(c[i - 1 :]) for p, c in hist.items() if p >= i)
        for i in range(1, len(row.acceptance_conditional) + 1)
    ]


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _acceptance(plt: Any, rows: Sequence[BenchRow], category: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r.category != category or not r.acceptance_conditional:
            continue
        xs = list(range(1, len(r.acceptance_conditional) + 1))
        label = f"{r.algorithm} D={r.draft_tokens}"
        (line,) = ax.plot(xs, r.acceptance_conditional, marker="o", label=label)
        ax.plot(xs, r.acceptance_by_position, linestyle="--", color=line.get_color())
        for x, y, n in zip(xs, r.acceptance_conditional, _reached(r), strict=True):
            if y is not None:
                ax.annotate(
                    f"n={n}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize="x-small",
                    color=line.get_color(),
                )
    ax.set_xlabel("draft position (n: verify steps that reached it)")
    ax.set_ylabel("share of verify steps")
    ax.set_ylim(0, 1.05)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"acceptance by position ({category})", fontsize="medium")
    if ax.get_legend_handles_labels()[0]:  # the line styles, named as docs/glossary.md does
        ax.plot([], [], color="gray", label="acceptance (conditional)")
        ax.plot([], [], color="gray", linestyle="--", label="acceptance (unconditional)")
        ax.legend(fontsize="small")
    return _save(plt, fig, out / "acceptance_by_position.png")


def _speedup(
    plt: Any, rows: Sequence[BenchRow], categories: Sequence[str], bs: int, out: Path
) -> Path:
    widest = max((r.draft_tokens for r in rows), default=0)
    picked = [r for r in rows if r.batch_size == bs and r.draft_tokens in (0, widest)]
    names = list(dict.fromkeys(r.algorithm for r in picked))
    cats = [*categories, OVERALL] if len(categories) > 1 else list(categories)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cats) * max(1, len(names)) / 2), 4))
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        by_cat = {r.category: r for r in picked if r.algorithm == name}
        xs = [i + k * width for i in range(len(cats))]
        got = [by_cat.get(c) for c in cats]
        heights = [0.0 if r is None else r.speedup for r in got]
        spread = [
            [0.0 if r is None else r.speedup - r.speedup_range[0] for r in got],
            [0.0 if r is None else r.speedup_range[1] - r.speedup for r in got],
        ]
        bars = ax.bar(xs, heights, width=width, label=name, yerr=spread, capsize=3)
        for bar, r in zip(bars, got, strict=True):
            if r is not None and r.noisy:
                bar.set_hatch("//")
    rounds = max((r.rounds for r in picked), default=0)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], cats, rotation=20)
    ax.set_ylabel("speedup over target-only")
    ax.set_title(
        f"speedup per category (batch size {bs}, D={widest}; bars: median of {rounds} "
        "rounds, whiskers: min-max, hatched: noisy)",
        fontsize="medium",
    )
    if names:
        ax.legend(fontsize="small")
    return _save(plt, fig, out / "speedup.png")


def _sweep(plt: Any, rows: Sequence[BenchRow], category: str, axis: str, out: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    other = "draft_tokens" if axis == "batch_size" else "batch_size"
    keys = sorted({(r.algorithm, getattr(r, other)) for r in rows if r.category == category})
    for name, fixed in keys:
        line = sorted(
            (getattr(r, axis), r.tau, r.speedup)
            for r in rows
            if r.category == category and r.algorithm == name and getattr(r, other) == fixed
        )
        if len(line) < 2:
            continue
        label = f"{name} {other}={fixed}"
        left.plot([p[0] for p in line], [p[1] for p in line], marker="o", label=label)
        right.plot([p[0] for p in line], [p[2] for p in line], marker="o", label=label)
    left.set_xlabel(axis)
    left.set_ylabel("τ (tokens per drafted step)")
    right.set_xlabel(axis)
    right.set_ylabel("speedup over target-only")
    right.axhline(1.0, color="gray", linewidth=0.8)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize="small")
    return _save(plt, fig, out / f"tau_speedup_vs_{axis}.png")
