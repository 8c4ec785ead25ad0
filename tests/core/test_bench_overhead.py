"""The host-cost measurement: decode steps only, split into parts that sum to the total, and the
JSON shape `bench/e2e.py --section overhead --json` writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import specstrat
from specstrat.bench.overhead import PARTS, measure, overhead_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["NONE", "NGRAM"])
def test_the_parts_sum_to_the_total(name: str) -> None:
    """scheduler_us is what the drafter, acceptance, metadata/relay and model leave of the
    measured step, so the parts add up to total_us; every part was measured (>= 0)."""
    cost = measure(specstrat.get(name), 2, runs=1, new_tokens=8).parts
    rest = cost["drafter_us"] + cost["acceptance_us"] + cost["metadata_us"] + cost["model_us"]
    assert cost["scheduler_us"] == pytest.approx(cost["total_us"] - rest)
    assert all(cost[p] >= 0 for p in PARTS)
    assert cost["model_us"] > 0
    assert cost["metadata_us"] > 0


def test_the_table_is_keyed_by_algorithm_then_batch_size() -> None:
    """overhead_table's shape: {algorithm: {str(bs): {part: µs}}} with every part."""
    table = overhead_table([specstrat.get("NONE")], [1, 2], runs=1)
    assert list(table) == ["NONE"]
    assert list(table["NONE"]) == ["1", "2"]
    assert list(table["NONE"]["1"]) == list(PARTS)


@pytest.mark.slow
def test_e2e_writes_the_overhead_json(tmp_path: Path) -> None:
    """`python bench/e2e.py --section overhead --json FILE` writes NONE and NGRAM at 1, 16, 64
    and 256 with every part."""
    out = tmp_path / "overhead.json"
    subprocess.run(
        [sys.executable, "bench/e2e.py", "--section", "overhead", "--json", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=1800,
    )
    table = json.loads(out.read_text())
    assert list(table) == ["NONE", "NGRAM"]
    for by_bs in table.values():
        assert list(by_bs) == ["1", "16", "64", "256"]
        assert all(list(parts) == list(PARTS) for parts in by_bs.values())


def test_the_timing_patches_are_undone_after_a_failure() -> None:
    """timed_decode_steps restores every function it patched when its block raises."""
    from specstrat.bench.overhead import Clock
    from specstrat.runtime import _step, timed_decode_steps

    decode, patched = _step.StepRunner.decode, []

    def fail_inside() -> None:
        with timed_decode_steps(Clock()):
            patched.append(_step.StepRunner.decode)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert patched[0] is not decode
    assert _step.StepRunner.decode is decode
