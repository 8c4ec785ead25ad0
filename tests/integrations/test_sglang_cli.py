"""`specstrat check --sglang MODULE:ATTR` against the real SGLang."""

import pytest

from specstrat.cli import main


def test_check_sglang_passes_the_readme_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's MY_EAGLE: PASS for the version, registration, method set and every hook."""
    assert main(["check", "--sglang", "tests.typing.readme_example:MY_EAGLE"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("PASS sglang: ") for line in lines)
    assert lines[1] == "PASS sglang: registration and from_string('MY_EAGLE')"
    hooks = [line for line in lines if line.startswith("PASS sglang: hook ")]
    assert len(hooks) == 11


def test_check_sglang_fails_a_name_sglang_reserves(capsys: pytest.CaptureFixture[str]) -> None:
    """specstrat's EAGLE under its own name clashes with SGLang's built-in: FAIL, status 1."""
    assert main(["check", "--sglang", "specstrat.builtins:EAGLE"]) == 1
    out = capsys.readouterr().out
    assert (
        "FAIL sglang: registration\n    RegistrationError: "
        "name='EAGLE' clashes with SGLang's built-in EAGLE"
    ) in out
