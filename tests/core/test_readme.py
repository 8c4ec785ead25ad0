"""The README shows the code the suite checks, word for word."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_example_is_the_type_checked_file() -> None:
    """The README's custom-algorithm example is tests/typing/readme_example.py verbatim."""
    example = (ROOT / "tests/typing/readme_example.py").read_text()
    assert f"```python\n{example}```" in README


def test_readme_property_test_is_the_one_that_runs() -> None:
    """The README's three-line property test matches tests/kernels/test_readme_property.py."""
    source = (ROOT / "tests/kernels/test_readme_property.py").read_text()
    lines = [
        "@given(verify_batches(policy=ShortDraftVerifyPolicy()))",
        "def test_my_policy_metadata(batch):",
        "    check_verify_metadata(batch.build(), batch)",
    ]
    for line in lines:
        assert line in README
        assert line in source


def test_readme_names_the_two_commands() -> None:
    """make demo and make test are the README's set-up commands."""
    assert "make demo" in README
    assert "make test" in README


def test_readme_ragged_lookup_is_the_tested_composition() -> None:
    """The README's NGRAM_RAGGED composition is the one tests/runtime/custom_algos.py runs."""
    source = (ROOT / "tests/runtime/custom_algos.py").read_text()
    start = source.index("NGRAM_RAGGED = replace(")
    block = source[start : source.index("\n)\n", start) + 3]
    assert f"```python\n{block}```" in README
