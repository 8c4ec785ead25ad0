"""One vocabulary for τ and acceptance by position: every label ``specstrat demo``,
``specstrat bench`` and ``specstrat train`` print or plot for them, and every JSON key that holds
them, is a name docs/glossary.md gives that term; the refused labels appear in no output, doc
or source."""

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.figure
import pytest
import torch

from specstrat.bench.plots import write_plots
from specstrat.bench.report import render, rows_table, spec_bench_tables
from specstrat.bench.rows import BenchRow
from specstrat.bench.run import TAU_FORMULA, BenchResult
from specstrat.demo import DemoSummary, run_demo
from specstrat.runtime import acceptance_rates
from specstrat.train import Eagle3Config, Eagle3Head, TrainedHead
from specstrat.train.train_command import _summary

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text()

#: The glossary rows' first cells, one term each.
TERMS = {
    "tau": "**τ** (tau, acceptance length)",
    "unconditional": "**acceptance by position** (unconditional)",
    "conditional": "**acceptance by position** (conditional)",
    "held_out": "**held-out agreement** (τ and acceptance by position, offline)",
}
#: The terms the engine's figures (demo, bench) name; ``held_out`` is ``specstrat train``'s.
ENGINE = ("tau", "unconditional", "conditional")

#: A text that speaks of τ or an acceptance figure: τ or tau, the Greek alpha (U+03B1, a rate's
#: usual letter), any word from "accept" (accepted, acceptance, accept rate), and "acc" alone
#: or as a prefix (acc, acc., acc_rate).
MENTION = re.compile(r"τ|\u03b1|\btau\b|accept|\bacc(?![a-z])", re.IGNORECASE)

#: Labels refused wherever they appear: "mean acceptance length" (τ's glossary names say
#: tokens per drafted step), and "accepted by position" or "cond. acceptance" (acceptance by
#: position says which of the two it is).
REFUSED = re.compile(
    r"mean acceptance length|accepted by position(?! \((un)?conditional\))|cond\. acceptance",
    re.IGNORECASE,
)

#: A JSON key that holds τ or an acceptance figure. ``acceptance_rule_lossless`` is what the
#: acceptance rule declares, not a figure.
FIGURE_KEY = re.compile(r"tau|acceptance(?!_rule_lossless)")


def _names(first_cell: str) -> frozenset[str]:
    """The names the glossary gives one term: bold and code spans of its first two cells."""
    rows = [line for line in GLOSSARY.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"the glossary has {len(rows)} rows for {first_cell}"
    cells = rows[0].split(" | ")[:2]
    spans = re.findall(r"\*\*(.+?)\*\*|`([^`]+)`", " ".join(cells))
    return frozenset(bold or code for bold, code in spans)


NAMES = {term: _names(cell) for term, cell in TERMS.items()}
#: Every name, longest first (so "τ (tokens per drafted step)" goes before "τ").
ALL_NAMES = sorted(set().union(*NAMES.values()), key=len, reverse=True)


def _terms_named(label: str) -> set[str]:
    """The terms ``label`` is a name of."""
    return {term for term, names in NAMES.items() if label in names}


def _unnamed(text: str) -> str | None:
    """What ``text`` still says of τ or acceptance once every glossary name standing alone
    (not inside a longer word, such as ``τ/step``) is taken out (``None``: nothing, so every
    mention in it is a glossary name)."""
    for name in ALL_NAMES:
        text = re.sub(rf"(?<![\w/.-]){re.escape(name)}(?![\w/.-])", " ", text)
    found = MENTION.search(text)
    return None if found is None else found[0]


def _stray(labels: Iterable[str]) -> list[str]:
    """The labels that speak of τ or acceptance but are not exactly one term's glossary name."""
    return [label for label in labels if MENTION.search(label) and len(_terms_named(label)) != 1]


def _table_labels(table: str) -> list[str]:
    """The first column of an aligned ``label  value`` table (two spaces or more between)."""
    return [re.split(r"\s{2,}", line, maxsplit=1)[0] for line in table.splitlines()]


def _plant(table: str, label: str) -> str:
    """``table`` with one more ``label  value`` row."""
    return f"{table}\n{label}  0.50"


@pytest.fixture(scope="module")
def summary() -> DemoSummary:
    """The embedded demo, two requests, with plain D = 1 steps planted so their row shows."""
    ran, _ = run_demo(num_requests=2, progress=False)
    return replace(ran, plain_step_share=0.25, width_histogram={"1": 2, "4": 6})


def _row(algorithm: str, draft_tokens: int, histogram: dict[int, list[int]]) -> BenchRow:
    """A bench row with made-up figures (nothing runs), acceptance from ``histogram``."""
    unconditional, conditional = acceptance_rates(histogram)
    return BenchRow(
        algorithm=algorithm,
        category="code",
        batch_size=1,
        draft_tokens=draft_tokens,
        requests=2,
        tokens=24,
        rounds=2,
        seconds={"median": 1.0, "min": 0.9, "max": 1.1},
        tokens_per_s=24.0,
        speedup=1.2,
        speedup_range=[1.1, 1.3],
        tau=2.0 if histogram else 1.0,
        acceptance_by_position=unconditional,
        acceptance_conditional=conditional,
        accepted_histogram={str(p): counts for p, counts in histogram.items()},
        verified_per_step=float(max(draft_tokens, 1)),
        ttft_ms={"median": 5.0, "p90": 6.0},
        tpot_ms={"median": 1.0, "p90": 1.5},
        step_split_ms=None,
        lossless=True,
        lossless_check="token for token against target-only",
        ties=0,
        acceptance_rule_lossless=True,
        width_histogram={str(max(draft_tokens, 1)): 6},
        widths=[max(draft_tokens, 1)] * 6,
    )


@pytest.fixture(scope="module")
def bench() -> BenchResult:
    """A bench result built by hand: target-only and NGRAM at D = 3 and D = 4, one category."""
    rows = (
        _row("NONE", 0, {}),
        _row("NGRAM", 3, {2: [2, 3, 4]}),
        _row("NGRAM", 4, {3: [2, 3, 4, 1]}),
    )
    setup = {"batch_sizes": [1], "draft_tokens": [3, 4]}
    return BenchResult(rows, setup, (TAU_FORMULA,), {}, ("code",))


@pytest.fixture(scope="module")
def train_summary() -> str:
    """What ``specstrat train`` prints after a run, for a made-up head (nothing trains)."""
    config = Eagle3Config(
        hidden_size=8,
        heads=2,
        kv_heads=1,
        head_dim=4,
        intermediate_size=16,
        rope_theta=10000.0,
        rms_eps=1e-6,
        vocab_size=16,
        layers=(0, 1, 2),
        draft_vocab_size=4,
    )
    head = Eagle3Head(config, torch.arange(4), torch.zeros(16, 8))
    trained = TrainedHead(
        head=head,
        target="tiny",
        target_sha256="0" * 64,
        data_size=100,
        data_source="prompts.jsonl",
        steps=4,
        final_loss=2.5,
        tau=1.5,
        acceptance=(0.3, 0.15, 0.05, 0.0, 0.0),
    )
    return _summary(trained, Path("head.safetensors"), Path("head.ckpt"))


def test_the_glossary_names_each_term() -> None:
    """The glossary names τ, both acceptance figures and the held-out agreement, in code, JSON
    and print."""
    assert {"τ", "tau", "acceptance_length", "RunStats.acceptance_length"} <= NAMES["tau"]
    assert {"acceptance_by_position", "RunStats.acceptance_by_position"} <= NAMES["unconditional"]
    assert {"acceptance_conditional", "RunStats.acceptance_conditional"} <= NAMES["conditional"]
    assert {"TrainedHead.tau", "TrainedHead.acceptance", "held-out τ"} <= NAMES["held_out"]


def test_the_demo_table_labels_are_glossary_names(summary: DemoSummary) -> None:
    """The demo table labels τ and both acceptance figures, each by one term's glossary name."""
    table = summary.table()
    assert _stray(_table_labels(table)) == []
    figures = [label for label in _table_labels(table) if MENTION.search(label)]
    assert sorted(t for label in figures for t in _terms_named(label)) == sorted(ENGINE)
    assert [_unnamed(line) for line in table.splitlines() if _unnamed(line)] == []
    assert "plain steps (D=1)" in table
    assert REFUSED.search(table) is None


def test_the_json_keys_are_glossary_names(summary: DemoSummary, bench: BenchResult) -> None:
    """The demo's and the bench's JSON keys for τ and both acceptance figures are glossary names."""
    for keys in (summary.as_dict(), bench.rows[1].as_dict()):
        figures = [k for k in keys if FIGURE_KEY.search(k)]
        named = [_terms_named(k) for k in figures]
        assert all(len(terms) == 1 for terms in named), figures
        assert sorted(t for terms in named for t in terms) == sorted(ENGINE)
    demo, row = summary.as_dict(), bench.rows[1].as_dict()
    assert demo["acceptance_length"] == summary.acceptance_length
    for key in ("acceptance_by_position", "acceptance_conditional"):
        assert key in demo
        assert key in row
    assert len(demo["acceptance_conditional"]) == len(demo["acceptance_by_position"]) == 3


def test_the_bench_tables_use_glossary_names(bench: BenchResult) -> None:
    """The bench's table headings name τ and acceptance (conditional) by glossary names."""
    header = rows_table(bench.rows).splitlines()[0]
    headings = [header] + [line for t in spec_bench_tables(bench) for line in t.splitlines()[:2]]
    assert [_unnamed(line) for line in headings if _unnamed(line)] == []
    column = r"(?<!\S){}(?!\S)"
    assert any(re.search(column.format(re.escape(n)), header) for n in NAMES["tau"])
    assert any(header.endswith(name) for name in NAMES["conditional"] - NAMES["unconditional"])
    assert REFUSED.search(render(bench)) is None


def _texts(fig: Any) -> Iterator[str]:
    """Every title, axis label and legend entry of a matplotlib figure."""
    for ax in fig.axes:
        yield from (ax.get_title(), ax.get_xlabel(), ax.get_ylabel())
        legend = ax.get_legend()
        if legend is not None:
            yield from (t.get_text() for t in legend.get_texts())


def test_the_bench_plots_use_glossary_names(
    bench: BenchResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plot texts name τ and acceptance by glossary names, each term labelled exactly once."""
    texts: list[str] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: texts.extend(_texts(fig))
    )
    write_plots(bench, tmp_path)
    assert [(t, _unnamed(t)) for t in texts if _unnamed(t)] == []
    exact = [terms for t in texts if len(terms := _terms_named(t)) == 1]
    assert {t for terms in exact for t in terms} == set(ENGINE)


def test_the_train_summary_labels_are_held_out_names(train_summary: str) -> None:
    """``specstrat train`` labels its held-out τ and acceptance (unconditional, conditional) by
    the glossary's names for the held-out agreement, one line each."""
    labels = _table_labels(train_summary)
    assert _stray(labels) == []
    figures = [label for label in labels if MENTION.search(label)]
    assert figures == [
        "held-out τ",
        "held-out acceptance (unconditional)",
        "held-out acceptance (conditional)",
    ]
    assert all(_terms_named(label) == {"held_out"} for label in figures)
    assert [_unnamed(line) for line in train_summary.splitlines() if _unnamed(line)] == []
    assert "0.300 0.500 0.333 0.000 - (by draft position)" in train_summary  # conditional


#: Labels a new row or column might use for τ or acceptance that are no glossary name.
PLANTED = (
    "accepted",
    "accept rate",
    "acc",
    "acc_rate",
    "mean accepted drafts",
    "mean acceptance length",
    "acceptance",
    "τ/step",
    "\u03b1",
)


@pytest.mark.parametrize("label", PLANTED)
def test_a_planted_label_is_refused(
    label: str, summary: DemoSummary, train_summary: str, bench: BenchResult
) -> None:
    """A table row or column labelled other than by a glossary name fails the checks above."""
    for table in (summary.table(), train_summary):
        assert _stray(_table_labels(_plant(table, label))) == [label]
    header = rows_table(bench.rows).splitlines()[0]
    assert _unnamed(f"{header} {label}") is not None


def _pages() -> list[Path]:
    """The docs pages, the README, and the package's and bench scripts' sources."""
    return [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        *sorted((ROOT / "specstrat").rglob("*.py")),
        *sorted((ROOT / "bench").glob("*.py")),
    ]


def test_no_doc_or_source_uses_a_refused_label() -> None:
    """No doc, README or source line uses a refused label for τ or acceptance by position."""
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in _pages()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if REFUSED.search(line)
    ]
    assert found == []
