"""Rows to distrust: a speedup past what τ and the verify cost allow, rounds that disagree, and
a planted slow target-only caught end to end in the table, the JSON and the plots."""

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specstrat import NGRAM
from specstrat.bench._contenders import contender as engine_contender
from specstrat.bench.plausibility import speedup_ceiling, with_plausibility
from specstrat.bench.report import render
from specstrat.bench.rows import BenchRow
from specstrat.bench.run import BenchConfig, BenchResult, run_bench
from specstrat.runtime import EmbeddedModels
from specstrat.timing import Contender

COST = {str(t): 1.0 + 0.1 * (t - 1) for t in range(2, 10)}  # T=4 costs 1.3 decodes
TINY: dict[str, Any] = {"requests": 2, "max_new_tokens": 12, "warmup": 0}


@pytest.fixture(scope="module")
def result() -> BenchResult:
    """NGRAM on two code prompts, two counted rounds."""
    return run_bench(BenchConfig(algorithms=(NGRAM,), repeats=2, **TINY), EmbeddedModels.load())


@pytest.fixture(scope="module")
def ngram(result: BenchResult) -> BenchRow:
    """NGRAM's row, with figures planted by each test."""
    return result.rows[1]


def test_the_ceiling_is_tokens_gained_over_the_verify_cost(ngram: BenchRow) -> None:
    """τ 2.6 at T 4 (1.3 decodes a verify) allows at most 2x; target-only has no ceiling."""
    row = replace(ngram, tau=2.6, verified_per_step=4.0, plain_step_share=0.0)
    assert speedup_ceiling(row, COST) == pytest.approx(2.0)
    assert speedup_ceiling(replace(row, algorithm="NONE"), COST) is None
    assert speedup_ceiling(row, {}) is None


def test_plain_steps_cost_a_decode_in_the_ceiling(ngram: BenchRow) -> None:
    """Half the steps plain: (0.5 + 0.5 * 2.6) / (0.5 + 0.5 * 1.3) tokens per decode."""
    row = replace(ngram, tau=2.6, verified_per_step=4.0, plain_step_share=0.5)
    assert speedup_ceiling(row, COST) == pytest.approx(1.8 / 1.15)


def test_widths_past_the_measured_ones_take_the_widest_cost(ngram: BenchRow) -> None:
    """A 12-token verify is priced as the widest measured (T 9, 1.8 decodes)."""
    row = replace(ngram, tau=3.6, verified_per_step=12.0, plain_step_share=0.0)
    assert speedup_ceiling(row, COST) == pytest.approx(2.0)


def test_an_impossible_speedup_is_flagged_and_a_possible_one_is_not(ngram: BenchRow) -> None:
    """3.86x at τ 2.91 is flagged naming both figures; 1.9x at τ 2.6 (ceiling 2x) is not."""
    row = replace(
        ngram,
        tau=2.91,
        verified_per_step=4.0,
        speedup=3.86,
        speedup_range=[3.8, 3.9],
        rounds=3,
        plain_step_share=0.0,
    )
    flagged = with_plausibility(row, COST)
    assert flagged.noisy
    assert flagged.noisy_reason is not None
    assert "speedup 3.86x exceeds the 2.24x its tau 2.91" in flagged.noisy_reason
    fine = replace(row, tau=2.6, speedup=1.9, speedup_range=[1.85, 1.95])
    assert not with_plausibility(fine, COST).noisy


def test_rounds_that_disagree_are_flagged(ngram: BenchRow) -> None:
    """Rounds 0.9x to 1.6x around a 1.2x median are flagged even under the ceiling."""
    row = replace(ngram, tau=2.6, verified_per_step=4.0, speedup=1.2, speedup_range=[0.9, 1.6])
    flagged = with_plausibility(replace(row, rounds=3, plain_step_share=0.0), COST)
    assert flagged.noisy_reason is not None
    assert "rounds disagree: speedup 0.90x to 1.60x" in flagged.noisy_reason


def test_a_planted_slow_target_only_is_caught_end_to_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Target-only slowed by a planted sleep: NGRAM's speedup passes its ceiling, and the
    table, the JSON and the speedup plot say so."""
    real = engine_contender

    def planted(cell: Any, *args: Any, **kwargs: Any) -> Contender:
        made = real(cell, *args, **kwargs)
        if cell.algorithm != "NONE":
            return made

        def slow() -> Any:
            time.sleep(0.5)
            return made.run()

        return Contender(made.name, slow, made.prepare)

    monkeypatch.setattr("specstrat.bench.run.contender", planted)
    result = run_bench(BenchConfig(algorithms=(NGRAM,), repeats=1, **TINY), EmbeddedModels.load())
    none, ngram = result.rows
    assert not none.noisy
    assert ngram.noisy
    assert ngram.noisy_reason is not None
    assert "exceeds" in ngram.noisy_reason
    assert ngram.as_dict()["noisy"] is True
    text = render(result)
    assert "~ noisy" in text
    assert f"{ngram.speedup:.2f}x~" in text
    from specstrat.bench.plots import write_plots

    assert tmp_path / "speedup.png" in write_plots(result, tmp_path)
