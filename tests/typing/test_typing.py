"""mypy --strict accepts the built-ins and the README example, and rejects each wrong strategy."""

import re
from pathlib import Path

import pytest
from mypy import api

HERE = Path(__file__).parent
FAIL_FILES = sorted((HERE / "fail").glob("*.py"))
EXPECT = re.compile(r"# expect: (?P<code>[a-z-]+) (?P<text>.+)")
ERROR = re.compile(r"^(?P<file>[^:]+):\d+: error: (?P<message>.*)  \[(?P<code>[a-z-]+)\]$")


@pytest.fixture(scope="module")
def fail_report() -> dict[str, list[tuple[str, str]]]:
    """One mypy --strict run over every deliberately wrong file: errors by file name."""
    stdout, _, _ = api.run(["--strict", "--no-incremental", *map(str, FAIL_FILES)])
    errors: dict[str, list[tuple[str, str]]] = {}
    for line in stdout.splitlines():
        match = ERROR.match(line)
        if match:
            errors.setdefault(Path(match["file"]).name, []).append(
                (match["code"], match["message"])
            )
    return errors


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


def test_builtins_and_readme_example_pass_strict() -> None:
    """The positive typing files (built-ins, README, a policy, training) pass mypy --strict."""
    files = [HERE / "pass_builtins.py", HERE / "readme_example.py", HERE / "readme_drafter.py"]
    files.append(HERE / "gated_policy.py")  # the speculation-policy guide's own policy
    files.append(HERE / "pass_train.py")  # the training API
    stdout, stderr, status = api.run(["--strict", *map(str, files)])
    assert status == 0, stdout + stderr
