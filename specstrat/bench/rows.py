"""The rows of a bench result: each cell's counted runs turned into the figures of
:mod:`specstrat.bench.figures`, their lossless check against target-only, and the overall row
over every category (seconds and tokens summed per round, the speedup of the sums taken within
each round)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.bench import figures
from specstrat.runtime import Request, RunStats
from specstrat.timing import Timings, ratio

__all__ = [
    "HF_ASSISTED",
    "HF_GENERATE",
    "HF_LOOKUP",
    "OVERALL",
    "BenchRow",
    "Cell",
    "Record",
    "build_rows",
]

#: The overall row's category when a workload has more than one.
OVERALL = "overall"
#: transformers' own contenders (``--baseline hf``): plain generate, its prompt lookup and its
#: assisted generation with the run's draft LM.
HF_GENERATE, HF_LOOKUP, HF_ASSISTED = "hf-generate", "hf-prompt-lookup", "hf-assisted"


@dataclass(frozen=True, slots=True)
class BenchRow:
    """The figures of one algorithm in one cell (or over all categories, ``category ==
    "overall"``). Field names are the JSON keys (``docs/bench.md`` has the schema).
    ``width_histogram``: decode steps per D the speculation policy chose (``{"<D>": steps}``,
    counted rounds); ``widths``: the D of each decode step of the first counted round;
    ``plain_step_share``: the share of decode request-steps at D = 1, which ``tau`` excludes
    (1.0 for ``hf-generate``, ``None`` for ``hf-prompt-lookup``); the ``roofline_*`` fields and
    ``weight_bytes_per_token``: this machine's limit for the row
    (:mod:`specstrat.bench.roofline`; ``None`` until a run measured it); ``speedup_ceiling``,
    ``noisy`` and ``noisy_reason``: whether to distrust the row
    (:mod:`specstrat.bench.plausibility`)."""

    algorithm: str
    category: str
    batch_size: int
    draft_tokens: int
    requests: int
    tokens: int
    rounds: int
    seconds: dict[str, float]
    tokens_per_s: float
    speedup: float
    speedup_range: list[float]
    tau: float
    acceptance_by_position: list[float | None]
    acceptance_conditional: list[float | None]
    accepted_histogram: dict[str, list[int]]
    verified_per_step: float | None
    ttft_ms: figures.Quantiles
    tpot_ms: figures.Quantiles
    step_split_ms: dict[str, float] | None
    lossless: bool
    lossless_check: str
    ties: int
    acceptance_rule_lossless: bool
    width_histogram: dict[str, int] = field(default_factory=dict)
    widths: list[int] = field(default_factory=list)
    plain_step_share: float | None = 0.0
    weight_bytes_per_token: float | None = None
    roofline_tokens_per_s: float | None = None
    roofline_fraction: float | None = None
    decode_roofline_fraction: float | None = None
    roofline_bound: str | None = None
    speedup_ceiling: float | None = None
    noisy: bool = False
    noisy_reason: str | None = None

    @property
    def gained_per_step(self) -> float:
        """Tokens a request gains per decode step: τ on drafted steps, 1 on the plain ones
        (``plain_step_share``; none counted for transformers' prompt lookup, whose is unknown)."""
        plain = self.plain_step_share or 0.0
        return plain + (1 - plain) * self.tau

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values (keys exactly the field names)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=False, slots=True)
class Record:
    """What one run left: outputs, statistics (engine runs) and token times."""

    outputs: dict[str, list[int]]
    stats: RunStats | None
    arrivals: dict[str, float]
    first: dict[str, float]
    last: dict[str, float]
    forwards: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=False, slots=True)
class Cell:
    """One contender in one cell, and the runs it recorded (warm-ups included, dropped later)."""

    name: str
    algorithm: str
    category: str
    batch_size: int
    draft_tokens: int
    requests: list[Request]
    rule_lossless: bool
    baseline: str  # the contender name of this cell's target-only
    spec: SpecAlgorithm[Any] | None  # what the engine runs (None: transformers' generate)
    records: list[Record] = field(default_factory=list)
    split: RunStats | None = None


def _check(
    cell: Cell,
    records: Sequence[Record],
    reference: dict[str, list[int]],
    lm: Any,
    greedy: bool,
) -> tuple[bool, str, int]:
    """Whether every counted run of ``cell`` is lossless against target-only, how that was
    established, and the certified ties."""
    if cell.algorithm == "NONE":
        return True, "target-only is the reference", 0
    if not cell.rule_lossless:
        return False, "the acceptance rule is lossy: outputs are not the target's", 0
    if not greedy:
        note = (
            "sampling: outputs differ from target-only by design; the rule is lossless in "
            "distribution by declaration (specstrat demo checks it)"
        )
        return True, note, 0
    ties, bad = 0, []
    for index, record in enumerate(records):
        if lm is not None:
            from specstrat.hf.reference import compare

            check = compare(lm, cell.requests, record.outputs, reference)
            ties = max(ties, check.ties)
            bad += [f"round {index + 1}: {m}" for m in check.mismatches]
        else:
            bad += [
                f"round {index + 1}: {rid} differs"
                for rid, want in reference.items()
                if record.outputs.get(rid) != want
            ]
    runs = f"{len(records)} run(s)"
    if bad:
        return False, f"DIFFERENT from target-only in {runs}: {'; '.join(bad[:3])}", ties
    tie = f", {ties} certified tie(s)" if ties else ""
    return True, f"token for token against target-only in every counted run{tie} ({runs})", ties


def build_rows(
    cells: Sequence[Cell],
    timings: dict[str, Timings],
    categories: Sequence[str],
    *,
    warmup: int,
    greedy: bool,
    split_apart: bool,
    lm: Any = None,
) -> list[BenchRow]:
    """One row per cell, plus the overall rows when there are several categories; ``warmup``:
    the records to drop from each cell; ``split_apart``: stage splits come from each cell's
    extra sync run; ``lm``: a Hugging Face target for certified ties (None: exact equality)."""
    config = _Counting(warmup, split_apart)
    by_name = {c.name: c for c in cells}
    rows = []
    for cell in cells:
        counted = cell.records[config.warmup :]
        reference = by_name[cell.baseline].records[config.warmup].outputs
        lossless, note, ties = _check(cell, counted, reference, lm, greedy)
        speed = ratio(timings, cell.name, cell.baseline)
        check = (lossless, note, ties)
        rows.append(_row(cell, [cell], timings[cell.name].seconds, speed.per_round, check, config))
    if len(categories) > 1:
        rows += _overall(cells, rows, timings, config)
    return rows


@dataclass(frozen=True, slots=True)
class _Counting:
    """Which records count (after ``warmup``) and where stage splits come from."""

    warmup: int
    overlap: bool


def _row(
    cell: Cell,
    members: Sequence[Cell],
    seconds: Sequence[float],
    per_round: Sequence[float],
    check: tuple[bool, str, int],
    config: _Counting,
    category: str | None = None,
) -> BenchRow:
    """One row from the counted records of ``members`` (one cell, or a key's every category)."""
    records = [r for m in members for r in m.records[config.warmup :]]
    stats = [r.stats for r in records if r.stats is not None]
    hist = figures.merge_histograms(s.accepted_histogram for s in stats)
    unconditional, conditional = figures.acceptance_rates(hist)
    ttft: list[float] = []
    tpot: list[float] = []
    for r in records:
        tokens = {rid: len(ids) for rid, ids in r.outputs.items()}
        a, b = figures.request_latencies(r.arrivals, r.first, r.last, tokens)
        ttft += a
        tpot += b
    tokens_per_run = sum(len(v) for m in members for v in m.records[config.warmup].outputs.values())
    if cell.spec is None:
        forwards = sum(f for r in records for f in r.forwards.values())
        made = sum(len(v) for r in records for v in r.outputs.values())
        drafted = cell.algorithm in (HF_LOOKUP, HF_ASSISTED)
        tau = made / forwards if drafted and forwards else 1.0
        width: float | None = 1.0 if cell.algorithm == HF_GENERATE else None
        plain: float | None = width  # transformers' generate decodes plainly; lookup: unknown
        split = None
    else:
        tau = figures.tau(stats)
        width = figures.verified_per_step(stats)
        plain = figures.plain_step_share(stats)
        splits = [m.split for m in members if m.split is not None] if config.overlap else stats
        split = figures.step_split_ms(splits)
    median = statistics.median(seconds)
    widths = Counter(w for s in stats for w in s.widths)
    return BenchRow(
        algorithm=cell.algorithm,
        category=category or cell.category,
        batch_size=cell.batch_size,
        draft_tokens=cell.draft_tokens,
        requests=sum(len(m.requests) for m in members),
        tokens=tokens_per_run,
        rounds=len(seconds),
        seconds={"median": median, "min": min(seconds), "max": max(seconds)},
        tokens_per_s=tokens_per_run / median if median else 0.0,
        speedup=statistics.median(per_round),
        speedup_range=[min(per_round), max(per_round)],
        tau=tau,
        acceptance_by_position=unconditional,
        acceptance_conditional=conditional,
        accepted_histogram={str(p): counts for p, counts in hist.items()},
        verified_per_step=width,
        ttft_ms=figures.quantiles(ttft),
        tpot_ms=figures.quantiles(tpot),
        step_split_ms=split,
        lossless=check[0],
        lossless_check=check[1],
        ties=check[2],
        acceptance_rule_lossless=cell.rule_lossless,
        width_histogram={str(d): n for d, n in sorted(widths.items())},
        widths=list(stats[0].widths) if stats else [],
        plain_step_share=plain,
    )


def _overall(
    cells: Sequence[Cell],
    rows: Sequence[BenchRow],
    timings: dict[str, Timings],
    config: _Counting,
) -> list[BenchRow]:
    """Per (algorithm, batch size, draft width), one row over every category: seconds and
    tokens summed per round, the speedup of those sums within each round."""
    groups: dict[tuple[str, int, int], list[int]] = {}
    for index, cell in enumerate(cells):
        groups.setdefault((cell.algorithm, cell.batch_size, cell.draft_tokens), []).append(index)
    out = []
    for indices in groups.values():
        members = [cells[i] for i in indices]
        bases = [next(c for c in cells if c.name == m.baseline) for m in members]
        seconds = _summed(timings, [m.name for m in members])
        base_seconds = _summed(timings, [b.name for b in bases])
        tokens = sum(timings[m.name].tokens for m in members)
        base_tokens = sum(timings[b.name].tokens for b in bases)
        per_round = [
            (tokens / s) / (base_tokens / b) if s and b and base_tokens else 0.0
            for s, b in zip(seconds, base_seconds, strict=True)
        ]
        parts = [rows[i] for i in indices]
        lossless = all(r.lossless for r in parts)
        note = (
            "every category lossless"
            if lossless
            else "NOT lossless in " + ", ".join(r.category for r in parts if not r.lossless)
        )
        check = (lossless, note, sum(r.ties for r in parts))
        out.append(_row(members[0], members, seconds, per_round, check, config, OVERALL))
    return out


def _summed(timings: dict[str, Timings], names: Sequence[str]) -> list[float]:
    """Per counted round, the seconds of ``names`` added up."""
    return [sum(parts) for parts in zip(*(timings[n].seconds for n in names), strict=True)]
