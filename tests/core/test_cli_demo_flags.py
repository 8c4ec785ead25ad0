"""The demo's workload flags on the embedded models (--prompt, --max-new-tokens,
--context-len, --batch-size) and what its summary records (every sampling parameter, the
target tokens verified per step), every earlier JSON key kept."""

import json
import re
from pathlib import Path

import pytest

from specstrat.cli import main
from specstrat.demo import _rounds_agree
from specstrat.timing import Timings

#: The JSON keys the demo's summary had before these flags; none may go.
OLD_KEYS = {
    "algorithm",
    "overlap",
    "disagg",
    "num_draft_tokens",
    "requests",
    "num_requests",
    "tokens",
    "acceptance_length",
    "spec_tokens_per_s",
    "target_tokens_per_s",
    "speed_ratio",
    "lossless",
    "acceptance_by_position",
    "acceptance_rule_lossless",
    "temperature",
    "lossless_check",
    "topk",
    "num_steps",
    "draft_worker_verify_forwards",
    "draft_worker_tokens_per_req",
    "top_p",
    "top_k",
    "seed",
    "model",
    "ties",
}


def _demo_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["demo", "--no-overlap", "--json", *argv]) == 0
    summary: dict[str, object] = json.loads(capsys.readouterr().out)
    return summary


def test_a_prompt_of_ones_own_with_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    """--prompt makes one request per text; --max-new-tokens, --context-len and --batch-size
    reach the engine and the summary."""
    summary = _demo_json(
        capsys,
        "--algo",
        "NGRAM",
        "--prompt",
        "def add(a, b):\n",
        "--prompt",
        "import os\n",
        "--max-new-tokens",
        "9",
        "--context-len",
        "128",
        "--batch-size",
        "2",
    )
    assert summary["num_requests"] == 2
    requests = summary["requests"]
    assert isinstance(requests, list)
    assert [r["rid"] for r in requests] == ["prompt-0", "prompt-1"]
    assert bytes(requests[0]["prompt_ids"]) == b"def add(a, b):\n"
    assert all(len(r["output_ids"]) == 9 for r in requests)
    assert (summary["max_running_requests"], summary["context_len"]) == (2, 128)
    assert set(summary) >= OLD_KEYS


def test_the_summary_records_sampling_and_verify_width(capsys: pytest.CaptureFixture[str]) -> None:
    """Every sampling parameter and the target tokens verified per step are in the JSON and the
    table."""
    argv = ["--algo", "EAGLE", "--requests", "2", "--max-new-tokens", "6", "--seed", "5"]
    summary = _demo_json(capsys, *argv)
    assert (summary["temperature"], summary["top_p"], summary["top_k"], summary["seed"]) == (
        0.0,
        1.0,
        0,
        5,
    )
    assert summary["verified_per_step"] == 4.0  # EAGLE verifies T = D = 4 per request
    assert main(["demo", "--no-overlap", *argv]) == 0
    table = capsys.readouterr().out
    assert "greedy, top_p 1, top_k 0, seed 5" in table
    assert "verified per step" in table


def test_a_prompt_that_does_not_fit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt plus budget past --context-len is one named error line, exit 2."""
    assert main(["demo", "--prompt", "x" * 200, "--context-len", "64"]) == 2
    assert "exceeds context_len=64" in capsys.readouterr().err


def test_rounds_time_each_side_several_times_and_count_one_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--rounds 2: the ratio's median within its range, tokens and the trace of one run."""
    argv = ["--algo", "NGRAM", "--requests", "2", "--max-new-tokens", "8"]
    one = _demo_json(capsys, *argv, "--rounds", "1", "--trace", str(tmp_path / "one.jsonl"))
    two = _demo_json(capsys, *argv, "--rounds", "2", "--trace", str(tmp_path / "two.jsonl"))
    assert (one["rounds"], two["rounds"]) == (1, 2)
    assert two["tokens"] == one["tokens"]
    low, mid, high = (
        float(str(two[k])) for k in ("speed_ratio_min", "speed_ratio", "speed_ratio_max")
    )
    assert low <= mid <= high
    lines = [(tmp_path / f"{n}.jsonl").read_text().count("\n") for n in ("one", "two")]
    assert lines[0] == lines[1] > 0
    assert main(["demo", "--no-overlap", *argv, "--rounds", "2"]) == 0
    assert re.search(
        r"speed ratio +[\d.]+x \([\d.]+-[\d.]+ over 2 rounds\)", capsys.readouterr().out
    )


def test_rounds_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    """--rounds 0 is refused by the parser, naming the value."""
    with pytest.raises(SystemExit, match=r"^2$"):
        main(["demo", "--rounds", "0"])
    assert "argument --rounds: 0 is not an int >= 1" in capsys.readouterr().err


def test_a_later_round_that_differs_is_caught() -> None:
    """Each side's later rounds must repeat its first round's outputs."""
    first, other = {"r": [1, 2]}, {"r": [1, 3]}
    same = Timings("a", (1.0, 1.0), 2, first, (first, dict(first)))
    differs = Timings("b", (1.0, 1.0), 2, first, (first, other))
    assert _rounds_agree({"a": same}) is True
    assert _rounds_agree({"a": same, "b": differs}) is False
