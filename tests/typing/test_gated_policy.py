"""The speculation-policy guide's own policy: shown verbatim in the guide, conformant, and run
by ``specstrat bench --adaptive MODULE:ATTR`` and ``specstrat check``."""

import json
from pathlib import Path

import pytest

from specstrat.cli import main
from specstrat.testing import check_speculation_policy
from tests.typing.gated_policy import GATED, GATED_NGRAM

HERE = Path(__file__).parent
GUIDE = HERE.parents[1] / "docs" / "guides" / "speculation-policy.md"


def test_the_guide_shows_the_file_verbatim() -> None:
    """docs/guides/speculation-policy.md includes gated_policy.py as it is, in at most 30 lines."""
    source = (HERE / "gated_policy.py").read_text()
    assert len(source.splitlines()) <= 30
    assert source in GUIDE.read_text()


def test_the_policy_passes_its_conformance_runner() -> None:
    """check_speculation_policy accepts the guide's policy (declaration, answers, a real run)."""
    declared = check_speculation_policy(GATED)
    assert declared[4] == (1, 4)
    assert declared[1] == (1,)


def test_bench_runs_it_by_module_and_attribute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specstrat bench --adaptive tests.typing.gated_policy:GATED`` runs NGRAM under it."""
    out = tmp_path / "bench.json"
    status = main(
        [
            "bench",
            "--algo",
            "NGRAM",
            "--adaptive",
            "tests.typing.gated_policy:GATED",
            "--requests",
            "1",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
    )
    assert status == 0, capsys.readouterr().err
    rows = {r["algorithm"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["NGRAM_GATED"]["lossless"] is True
    assert sum(rows["NGRAM_GATED"]["width_histogram"].values()) == len(
        rows["NGRAM_GATED"]["widths"]
    )


@pytest.mark.slow
def test_check_accepts_the_algorithm_it_composes(capsys: pytest.CaptureFixture[str]) -> None:
    """``specstrat check tests.typing.gated_policy:GATED_NGRAM`` passes, mypy strict included."""
    assert GATED_NGRAM.speculation is GATED
    status = main(["check", "tests.typing.gated_policy:GATED_NGRAM"])
    assert status == 0, capsys.readouterr().out
