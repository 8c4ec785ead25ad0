"""The bench's formulas on scripted figures whose answers are known: tau, acceptance by
position (unconditional and conditional, unobserved positions None), percentiles, TTFT/TPOT,
the stage split."""

import numpy as np
import pytest

from specstrat.bench import figures
from specstrat.runtime import RunStats

#: Scripted verify steps: 5 proposed nothing; 6 proposed 2 (1 accepted 0, 2 accepted 1, 3
#: accepted 2); 5 proposed 3 (1 accepted 1, 4 accepted 3).
HISTOGRAM = {0: [5], 2: [1, 2, 3], 3: [0, 1, 0, 4]}


def test_acceptance_by_position_and_conditional_on_a_scripted_histogram() -> None:
    """P_i, A_i and R_i worked by hand: position 1 10/11 both ways; position 2 7/11 and 7/10;
    position 3 (proposed only by the 3-draft steps) 4/5 and 4/4."""
    unconditional, conditional = figures.acceptance_rates(HISTOGRAM)
    assert unconditional == pytest.approx([10 / 11, 7 / 11, 4 / 5])
    assert conditional == pytest.approx([10 / 11, 7 / 10, 1.0])


def test_positions_never_reached_or_proposed_are_none() -> None:
    """A position no step reached (all rejected before it) is None in the conditional list; one
    never proposed (a zero row) is None in both, never a rejection (0.0)."""
    unconditional, conditional = figures.acceptance_rates({3: [4, 0, 0, 0]})
    assert unconditional == [0.0, 0.0, 0.0]
    assert conditional == [0.0, None, None]
    unconditional, conditional = figures.acceptance_rates({1: [1, 1], 3: [0, 0, 0, 0]})
    assert unconditional == [0.5, None, None]
    assert conditional == [0.5, None, None]
    assert figures.acceptance_rates({}) == ([], [])


def test_histograms_merge_by_proposed_count() -> None:
    """Runs' histograms add up row by row, keys sorted."""
    merged = figures.merge_histograms([{2: [1, 0, 1]}, {2: [0, 1, 1], 0: [3]}])
    assert merged == {0: [3], 2: [1, 1, 2]}


def test_tau_and_verify_width_pool_over_runs() -> None:
    """Tau is accepted drafts plus bonus over verify steps, pooled over runs; 1.0 with none."""
    a = RunStats(verified_requests=4, verified_tokens=10, verify_forward_tokens=16)
    b = RunStats(verified_requests=6, verified_tokens=20, verify_forward_tokens=12)
    assert figures.tau([a, b]) == 3.0
    assert figures.verified_per_step([a, b]) == 2.8
    assert figures.tau([RunStats()]) == figures.verified_per_step([]) == 1.0


def test_percentiles_match_numpys_linear_interpolation() -> None:
    """Median and p90 interpolate linearly between order statistics, as numpy's default."""
    values = [7.0, 1.0, 3.0, 10.0, 2.0, 9.0, 4.0, 8.0, 6.0, 5.0]
    assert figures.quantiles(values) == {"median": 5.5, "p90": pytest.approx(9.1)}
    for q in (0, 37, 50, 90, 100):
        assert figures.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert figures.quantiles([]) == {"median": None, "p90": None}


def test_ttft_and_tpot_from_scripted_token_times() -> None:
    """TTFT is first token minus arrival; TPOT is (last - first) / (tokens - 1), only for
    requests with two or more tokens."""
    arrivals = {"a": 0.0, "b": 1.0, "c": 0.0}
    first = {"a": 0.1, "b": 1.3, "c": 0.2}
    last = {"a": 0.5, "b": 1.3, "c": 1.2}
    ttft, tpot = figures.request_latencies(arrivals, first, last, {"a": 5, "b": 1, "c": 11})
    assert ttft == pytest.approx([100.0, 300.0, 200.0])
    assert tpot == pytest.approx([100.0, 100.0])


def test_step_split_per_decode_step() -> None:
    """Stage milliseconds per decode step; the scheduler is the rest of the step."""
    stats = RunStats(
        decode_steps=4,
        draft_seconds=0.004,
        verify_seconds=0.012,
        accept_seconds=0.002,
        decode_seconds=0.020,
    )
    split = figures.step_split_ms([stats])
    assert split == pytest.approx({"draft": 1.0, "verify": 3.0, "accept": 0.5, "scheduler": 0.5})
    assert figures.step_split_ms([RunStats()]) is None
