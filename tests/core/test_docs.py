"""The documentation pages show the code the suite runs, and the API reference covers the
public modules."""

import re
from pathlib import Path

from specstrat.runtime import Request
from specstrat.testing import check_acceptance_rule
from tests.core.test_public_api import PUBLIC_MODULES
from tests.typing.guide_acceptance import TopTwoFirstDraftAcceptance

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: What the API reference pages render (``::: module`` lines).
REFERENCED = {
    line.removeprefix("::: ").strip()
    for page in (DOCS / "reference").glob("*.md")
    for line in page.read_text().splitlines()
    if line.startswith("::: ")
}


def test_the_property_test_is_the_one_that_runs() -> None:
    """The checking guide's three-line property test is tests/kernels/test_readme_property.py's."""
    page = (DOCS / "guides" / "checking.md").read_text()
    source = (ROOT / "tests/kernels/test_readme_property.py").read_text()
    lines = [
        "@given(verify_batches(policy=ShortDraftVerifyPolicy()))",
        "def test_my_policy_metadata(batch):",
        "    check_verify_metadata(batch.build(), batch)",
    ]
    for line in lines:
        assert line in page
        assert line in source


def test_the_ragged_lookup_is_the_tested_composition() -> None:
    """The built-ins page's NGRAM_RAGGED is the composition tests/runtime/custom_algos.py runs."""
    source = (ROOT / "tests/runtime/custom_algos.py").read_text()
    start = source.index("NGRAM_RAGGED = replace(")
    block = source[start : source.index("\n)\n", start) + 3]
    assert f"```python\n{block}```" in (DOCS / "concepts" / "builtins.md").read_text()


def test_the_acceptance_guide_example_passes_the_kit() -> None:
    """The acceptance guide's rule passes check_acceptance_rule, declaring itself lossy."""
    rule = TopTwoFirstDraftAcceptance()
    assert rule.lossless is False
    check_acceptance_rule(rule)


def test_included_files_exist() -> None:
    """Every file a page includes (``--8<-- "PATH"``) exists, so no page shows a stale copy,
    and every line that starts like an include is one (a mangled marker renders as text)."""
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        for line in re.findall(r"^--8.*$", text, flags=re.MULTILINE):
            assert re.fullmatch(r'--8<-- "[^"]+"', line), f"{page}: malformed include {line!r}"
        for path in re.findall(r'^--8<-- "([^"]+)"$', text, flags=re.MULTILINE):
            assert (ROOT / path).is_file(), f"{page}: {path}"


def test_the_reference_covers_every_public_module() -> None:
    """Each public module has a reference entry, and each entry is a public module."""
    assert set(PUBLIC_MODULES) == REFERENCED


def test_the_own_model_snippet_builds_an_engine() -> None:
    """The models guide's engine line runs as written, on tests/runtime/user_model.py."""
    page = (DOCS / "guides" / "models.md").read_text()
    (code,) = [
        b for b in re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL) if "BigramLM(" in b
    ]
    scope: dict[str, object] = {}
    exec(code, scope)
    assert scope["engine"].run([Request("r0", (1, 2, 3), 4)])["r0"]  # type: ignore[attr-defined]


def test_the_builtins_table_matches_each_builtins_capabilities() -> None:
    """Each row of the built-ins page's table has the algorithm's own answers in its verify on
    draft worker, topk, hidden, draft KV and ragged columns, and every built-in has a row."""
    from specstrat.builtins import BUILTINS

    page = (DOCS / "concepts" / "builtins.md").read_text()
    rows = {
        cells[0]: cells
        for line in page.splitlines()
        if line.startswith("| ") and not line.startswith("| name")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {a.name for a in BUILTINS}
    for algo in BUILTINS:
        caps = algo.capabilities
        want = [
            algo.supports_target_verify_for_draft(),
            caps.need_topk,
            caps.carries_draft_hidden_states,
            caps.has_draft_kv,
            caps.supports_ragged_verify,
        ]
        cells = rows[algo.name]
        got = [cells[1], cells[6], cells[7], cells[8], cells[9]]
        assert got == ["yes" if w else "no" for w in want], algo.name
