"""``specstrat check``'s messages: the user's traceback on request, where MODULE is imported
from, what a module holds when ATTR is misspelt, and no lossless note after a failed rule."""

import re
from pathlib import Path

import pytest

from specstrat.cli import main

RAISING = """
from dataclasses import dataclass, replace

from specstrat import NGRAM, DrafterContext, DraftStep, DraftTree
from specstrat.strategies import NoDrafter, NoDrafterFactory


class Boom(NoDrafter):
    def propose(self, step: DraftStep) -> DraftTree:
        raise ValueError("my drafter blew up")


@dataclass(frozen=True, slots=True)
class BoomFactory(NoDrafterFactory):
    def create_drafter(self, context: DrafterContext) -> Boom:
        return Boom()


BOOM = replace(NGRAM, name="BOOM", drafter=BoomFactory())
"""

FLOAT_RULE = """
from dataclasses import replace

from specstrat import NGRAM, Acceptance, VerifyInputs
from specstrat.strategies import GreedyAcceptance


class FloatAcceptance(GreedyAcceptance):
    def accept(self, inputs: VerifyInputs) -> Acceptance:
        answer = super().accept(inputs)
        return replace(answer, accept_lengths=answer.accept_lengths.float())


FLOATY = replace(NGRAM, name="FLOATY", acceptance=FloatAcceptance())
"""


@pytest.mark.parametrize("traceback", [False, True])
def test_check_traceback_prints_the_users_frame(
    traceback: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A failing hook's FAIL line ends with the user's file:line; --traceback adds the chain."""
    (tmp_path / "raiser.py").write_text(RAISING)
    monkeypatch.chdir(tmp_path)
    args = ["check", "--no-mypy", "raiser:BOOM"]
    assert main([*args, "--traceback"] if traceback else args) == 1
    out, err = capsys.readouterr()
    assert re.search(
        r"BOOM\.drafter\.propose: raised ValueError: my drafter blew up \(at .*raiser\.py:10\)",
        out,
    )
    assert ('File "' in err and 'raiser.py", line 10, in propose' in err) == traceback


def test_a_module_not_found_says_where_modules_are_imported_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MODULE not found names the current directory and how to make the module importable."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        SystemExit,
        match=r"importing 'nowhere_q' failed: ModuleNotFoundError: No module named 'nowhere_q' "
        r"\(MODULE is imported from the current directory, .*, and sys\.path: run from the "
        r"directory that holds it or add that directory to PYTHONPATH\)",
    ):
        main(["check", "nowhere_q:ALGO"])


def test_a_misspelt_attribute_lists_the_modules_algorithms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATTR missing from MODULE lists the SpecAlgorithms MODULE does hold."""
    (tmp_path / "raiser.py").write_text(RAISING)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        SystemExit,
        match=r"specstrat demo: module 'raiser' has no attribute 'BOMM'; its SpecAlgorithms: "
        r"NGRAM, BOOM$",
    ):
        main(["demo", "--algo", "raiser:BOMM"])


def test_no_lossless_note_after_a_failed_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule that fails conformance gets no 'is lossless' note under its FAIL line."""
    (tmp_path / "floaty.py").write_text(FLOAT_RULE)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--no-mypy", "floaty:FLOATY"]) == 1
    out = capsys.readouterr().out
    assert "FAIL conformance: acceptance" in out
    assert "FLOATY.acceptance (FloatAcceptance) broke" in out
    assert "NOTE acceptance rule" not in out
