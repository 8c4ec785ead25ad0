"""Output flags are checked before any model loads, `--json -` puts only the document on stdout,
the JSON and the table survive a plotting failure, and files are written atomically."""

import json
import os
import re
from pathlib import Path
from typing import NoReturn

import pytest

import specstrat.bench.command
import specstrat.bench.plots
from specstrat._outputs import check_dir, check_file, check_json, write_atomic
from specstrat.cli import main
from specstrat.errors import InvalidConfig
from tests.hf import tiny

BENCH = ["bench", "--algo", "NGRAM", "--requests", "1", "--max-new-tokens", "4"]
BENCH += ["--repeats", "1", "--warmup", "0"]


def _unreachable(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("the models were loaded before the output flags were checked")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--json", "plain.txt/out.json"], r"--json '.*plain\.txt/out\.json' is under '.*plain"),
        (["--json", "missing/out.json"], r"--json .*its directory '.*missing' does not exist"),
        (["--json", "."], r"--json '\.' is a directory; pass a file path"),
        (["--plot", "plain.txt"], r"--plot '.*plain\.txt' is a plain file; pass a directory"),
        (["--plot", "plain.txt/plots"], r"--plot '.*plain\.txt/plots' is under '.*plain\.txt'"),
    ],
)
def test_a_bad_output_path_is_refused_before_any_model_loads(
    flags: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bench` refuses an unwritable --json or --plot by name before it loads a model."""
    (tmp_path / "plain.txt").write_text("a file")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(specstrat.bench.command, "_bench_models", _unreachable)
    assert main([*BENCH, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("specstrat bench: InvalidConfig: --")
    assert re.search(message, captured.err), captured.err


def test_json_dash_writes_only_the_document_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench --json -` prints the whole JSON document and nothing else on stdout; the table
    and the progress go to stderr, and no file named - is written."""
    monkeypatch.chdir(tmp_path)
    assert main([*BENCH, "--json", "-"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert [r["algorithm"] for r in document["rows"]] == ["NONE", "NGRAM"]
    assert "speedup (range)" in captured.err
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "DSPARK", "hf"])
def test_json_dash_parses_for_every_algorithm_and_model(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --json -` stdout is one JSON document for every seed algorithm on the embedded
    models and for a Hugging Face model directory (prompt lookup beside transformers')."""
    argv = [*BENCH[:2], algo, *BENCH[3:], "--json", "-"]
    if algo == "hf":
        model = tiny.save("llama", tmp_path / "tiny")
        argv = [*BENCH, "--model", str(model), "--baseline", "hf", "--json", "-"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rows"][-1]["algorithm"] == ("NGRAM" if algo == "hf" else algo)


def test_a_plotting_failure_keeps_the_table_and_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When drawing the plots fails, the table is already printed and the JSON already
    written, with no plots listed."""

    def broken(*args: object) -> NoReturn:
        raise InvalidConfig("--plot: the disk filled up")

    monkeypatch.setattr(specstrat.bench.plots, "write_plots", broken)
    out = tmp_path / "out.json"
    argv = [*BENCH, "--json", str(out), "--plot", str(tmp_path / "plots")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "speedup (range)" in captured.out
    assert "the disk filled up" in captured.err
    document = json.loads(out.read_text())
    assert document["plots"] == []
    assert len(document["rows"]) == 2


def test_check_json_takes_dash_as_stdout_and_checks_a_file(tmp_path: Path) -> None:
    """`-` means stdout; a file path is checked and returned."""
    assert check_json("--json", "-") is None
    assert check_json("--json", str(tmp_path / "a.json")) == tmp_path / "a.json"


def test_a_read_only_output_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An existing read-only file and a read-only directory are refused by name (write
    access as os.access reports it, so the test holds for root too)."""
    (tmp_path / "ro.json").write_text("{}")
    (tmp_path / "locked").mkdir()
    read_only = {tmp_path / "ro.json", tmp_path / "locked"}
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) not in read_only)
    with pytest.raises(InvalidConfig, match=r"--json '.*ro\.json' exists and is read-only"):
        check_file("--json", str(tmp_path / "ro.json"))
    with pytest.raises(InvalidConfig, match=r"--plot '.*locked/p': '.*locked' is not writable"):
        check_dir("--plot", str(tmp_path / "locked" / "p"))


def test_check_dir_accepts_a_missing_directory_under_an_existing_one(tmp_path: Path) -> None:
    """A plot directory that does not exist yet is accepted (it is created when plotting)."""
    assert check_dir("--plot", str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """An atomic write replaces the old text whole; a failed write leaves no temporary file
    and names the flag."""
    path = tmp_path / "out.json"
    path.write_text("old")
    write_atomic("--json", path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with pytest.raises(InvalidConfig, match=r"--json '.*sub/out\.json': cannot write it"):
        write_atomic("--json", tmp_path / "sub" / "out.json", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_demo_refuses_a_bad_trace_path_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --trace` under a plain file is refused by name before the models load."""
    (tmp_path / "plain.txt").write_text("a file")
    trace = tmp_path / "plain.txt" / "trace.jsonl"
    assert main(["demo", "--algo", "NGRAM", "--requests", "1", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"^specstrat demo: InvalidConfig: --trace '.*trace\.jsonl' is under", err)
