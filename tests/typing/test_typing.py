"""mypy --strict accepts the built-ins and the README example, and rejects each wrong strategy,
naming the Protocol member that does not fit where the example is annotated with the Protocol."""

import re
from pathlib import Path

import pytest
from mypy import api

HERE = Path(__file__).parent
FAIL_FILES = sorted((HERE / "fail").glob("*.py"))
EXPECT = re.compile(r"# expect: (?P<code>[a-z-]+) (?P<text>.+)")
#: A second header line: the Protocol member mypy must name (a case shaped like a guide's).
MEMBER = re.compile(r"# member: (?P<member>\w+)$")
ERROR = re.compile(r"^(?P<file>[^:]+):\d+: error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$")
NOTE = re.compile(r"^(?P<file>[^:]+):\d+: note: (?P<note>.*)$")
#: The cases shaped like the guides' examples (a factory's create_drafter annotated with
#: Drafter, a policy's create_chooser with WidthChooser): each must name its member.
GUIDE_SHAPED = {
    "acceptance_wrong_return",
    "drafter_draft_type_mismatch",
    "drafter_missing_method",
    "drafter_wrong_arity",
    "policy_float_width",
    "policy_missing_declaration",
    "subclassed_factory_bad_propose",
}


@pytest.fixture(scope="module")
def mypy_lines() -> list[str]:
    """One mypy --strict run over every deliberately wrong file: its output lines."""
    stdout, _, _ = api.run(["--strict", "--no-incremental", *map(str, FAIL_FILES)])
    return stdout.splitlines()


@pytest.fixture(scope="module")
def fail_report(mypy_lines: list[str]) -> dict[str, list[tuple[str, str]]]:
    """The errors of the mypy run, as (code, message) by file name."""
    errors: dict[str, list[tuple[str, str]]] = {}
    for line in mypy_lines:
        match = ERROR.match(line)
        if match:
            errors.setdefault(Path(match["file"]).name, []).append(
                (match["code"], match["message"])
            )
    return errors


@pytest.fixture(scope="module")
def fail_notes(mypy_lines: list[str]) -> dict[str, list[str]]:
    """The notes of the mypy run (what each error explains), stripped, by file name."""
    notes: dict[str, list[str]] = {}
    for line in mypy_lines:
        match = NOTE.match(line)
        if match:
            notes.setdefault(Path(match["file"]).name, []).append(match["note"].strip())
    return notes


def test_there_are_at_least_sixteen_wrong_examples() -> None:
    """The typing kit holds at least 16 deliberately wrong strategies/algorithms."""
    assert len(FAIL_FILES) >= 16


@pytest.mark.parametrize("path", FAIL_FILES, ids=lambda p: p.stem)
def test_mypy_rejects_with_expected_code(
    path: Path, fail_report: dict[str, list[tuple[str, str]]]
) -> None:
    """mypy reports exactly one error in the file, with the code and text its header names."""
    expect = EXPECT.match(path.read_text().splitlines()[0])
    assert expect, f"{path.name} lacks a '# expect: CODE TEXT' header"
    found = fail_report.get(path.name, [])
    assert [code for code, _ in found] == [expect["code"]], found
    assert expect["text"] in found[0][1]


def test_the_guide_shaped_cases_declare_their_member() -> None:
    """Each case shaped like a guide's example names, in its header, the member mypy must name."""
    named = {p.stem for p in FAIL_FILES if MEMBER.match(p.read_text().splitlines()[1])}
    assert not GUIDE_SHAPED - named, GUIDE_SHAPED - named


@pytest.mark.parametrize(
    "path", [p for p in FAIL_FILES if p.stem in GUIDE_SHAPED], ids=lambda p: p.stem
)
def test_mypy_names_the_member_that_does_not_fit(
    path: Path, fail_notes: dict[str, list[str]]
) -> None:
    """mypy's explanation of the one error names the Protocol member the header declares: as
    the missing member, or as the conflicting method's signature (not the factory's
    ``create_drafter`` or the policy's ``create_chooser`` that returned it)."""
    match = MEMBER.match(path.read_text().splitlines()[1])
    assert match, f"{path.name} lacks a '# member: NAME' second header line"
    member, notes = match["member"], fail_notes.get(path.name, [])
    assert member in notes or any(n.startswith(f"def {member}(") for n in notes), notes


def test_builtins_and_readme_example_pass_strict() -> None:
    """The positive typing files (built-ins, README, a policy, training) pass mypy --strict."""
    files = [HERE / "pass_builtins.py", HERE / "readme_example.py", HERE / "readme_drafter.py"]
    files.append(HERE / "gated_policy.py")  # the speculation-policy guide's own policy
    files.append(HERE / "pass_train.py")  # the training API
    files.append(HERE / "first_match.py")  # drafters in order
    stdout, stderr, status = api.run(["--strict", *map(str, files)])
    assert status == 0, stdout + stderr
