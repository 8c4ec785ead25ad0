"""`specstrat demo --model`: a Hugging Face model directory through the CLI (tiny, no download)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specstrat.cli import main
from tests.hf import tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama with its tokenizer (chat template included)."""
    return tiny.save("llama", tmp_path_factory.mktemp("tiny-llama"))


def test_demo_model_json_is_lossless_with_ids(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --model DIR --algo NGRAM --json` is lossless against target-only and generate, and
    stdout is one JSON document carrying each request's prompt and output ids."""
    argv = ["demo", "--model", str(model_dir), "--algo", "NGRAM", "--requests", "3"]
    assert main([*argv, "--max-new-tokens", "12", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # nothing but the document on stdout
    assert summary["lossless"] is True
    assert summary["num_requests"] == 3
    assert "transformers generate: identical over 3 requests" in summary["lossless_check"]
    record = summary["requests"][0]
    assert record["rid"] == "shlex.quote#0"
    assert record["prompt_ids"]
    assert 1 <= len(record["output_ids"]) <= 12
    assert summary["model"] == str(model_dir)
    assert "target-only vs transformers generate" in captured.err
    assert "sample (shlex.quote#0)" in captured.err


def test_demo_model_table(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json the summary, the comparison with generate and a sample are printed."""
    argv = ["demo", "--model", str(model_dir), "--requests", "2", "--max-new-tokens", "6"]
    assert main([*argv, "--algo", "NONE", "--no-overlap"]) == 0
    out = capsys.readouterr().out
    assert "lossless                     yes" in out
    assert "at batch size 1, median of 3 rounds interleaved: transformers generate" in out
    assert re.search(r"speed ratio +\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d over 3 rounds\)", out)
    assert "specstrat target-only" in out


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "HuggingFaceTB/SmolLM2-135M",
            r"no such path; if it is a hub id: this machine loads local files only",
        ),
        ("/nonexistent/model", r"model='/nonexistent/model': no such file or directory"),
    ],
)
def test_demo_model_refusals(model: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A hub id or a missing path is one named line on stderr and exit status 2."""
    assert main(["demo", "--model", model, "--algo", "NGRAM"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("specstrat demo:")]
    assert len(lines) == 1
    assert re.search(message, lines[0])


def test_demo_model_disagg(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--disagg with --model prefills in a second process that loads the same model; lossless."""
    argv = ["demo", "--model", str(model_dir), "--algo", "NGRAM", "--requests", "2"]
    assert main([*argv, "--max-new-tokens", "8", "--disagg", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["disagg"], summary["lossless"]) == (True, True)


def test_demo_model_runs_the_readme_early_exit_command(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's `--algo specstrat.hf:EARLY_EXIT` resolves; on a 2-layer model it is refused
    at engine start by name (exit layer 8 is past the model), not as a missing attribute."""
    argv = ["demo", "--model", str(model_dir), "--algo", "specstrat.hf:EARLY_EXIT"]
    assert main([*argv, "--requests", "1", "--max-new-tokens", "4"]) == 2
    assert "exit_layer=8 must be below the target's 2 layers" in capsys.readouterr().err


def test_demo_model_takes_a_prompt_of_ones_own(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--prompt on a Hugging Face model is one request through the chat template (or text)."""
    argv = ["demo", "--model", str(model_dir), "--algo", "NGRAM", "--prompt", "Say hi."]
    assert main([*argv, "--max-new-tokens", "4", "--no-overlap", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["rid"] for r in summary["requests"]] == ["prompt-0"]
    assert summary["num_requests"] == 1
