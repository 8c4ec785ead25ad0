"""Every code block of the README is run by the suite: each is claimed by exactly one file that
holds it verbatim, or by exactly one test that runs it (here; SmolLM2's in tests/real)."""

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: The README's fenced code blocks, as (language, text).
BLOCKS: list[tuple[str, str]] = re.findall(
    r"^```(\w*)\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL
)
HERE = "tests/core/test_readme.py"
#: Another engineer's test of the plugin pattern through real entry-point discovery.
PLUGIN_TEST = "tests/core/test_plugin_entry_point.py"
REAL_TEST = "tests/real/test_readme_real.py"

#: Who runs each block, by the block's first line: ``file:PATH`` (the file is the block,
#: verbatim), ``PATH::TEST`` (that test runs the block), or a test file that holds the block's
#: text verbatim and runs it.
CLAIMS = {
    "make demo   #": f"{HERE}::test_the_make_block_names_real_targets",
    '"""A custom algorithm:': "file:tests/typing/readme_example.py",
    '"""A custom drafter:': "file:tests/typing/readme_drafter.py",
    "specstrat check ": f"{HERE}::test_the_check_block_passes",
    "specstrat demo --algo ": f"{HERE}::test_the_demo_block_runs",
    "specstrat demo --model smollm2 ": f"{REAL_TEST}::test_the_smollm2_block_runs",
    "specstrat bench ": f"{HERE}::test_the_bench_block_runs",
    "# mypkg/algos.py": PLUGIN_TEST,
    "specstrat train ": f"{REAL_TEST}::test_the_train_block_runs",
}


def block(first_line: str) -> str:
    """The one README block whose text starts with ``first_line``."""
    (text,) = [text for _, text in BLOCKS if text.startswith(first_line)]
    return text


def run_shell_block(text: str, cwd: Path, timeout: float) -> list[str]:
    """Runs each command of a shell block (``specstrat`` as this interpreter's ``-m specstrat``,
    the checkout importable, lines ending in ``\\`` continued) in ``cwd``; returns each
    command's stdout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    outputs = []
    for line in text.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "specstrat", line
        done = subprocess.run(
            [sys.executable, "-m", "specstrat", *argv[1:]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    return outputs


def test_every_block_is_claimed_exactly_once() -> None:
    """Each README block matches exactly one claim and each claim exactly one block, so a new
    block nobody runs fails here."""
    for language, text in BLOCKS:
        owners = [key for key in CLAIMS if text.startswith(key)]
        assert len(owners) == 1, f"README ```{language} block claimed by {owners}:\n{text}"
    for key in CLAIMS:
        assert sum(text.startswith(key) for _, text in BLOCKS) == 1, key


def test_file_claims_are_the_files_verbatim() -> None:
    """A block claimed by a file is that file, word for word."""
    for key, owner in CLAIMS.items():
        if owner.startswith("file:"):
            assert block(key) == (ROOT / owner.removeprefix("file:")).read_text()


def test_test_claims_name_existing_tests() -> None:
    """A block claimed by a test names a test function that exists."""
    for owner in CLAIMS.values():
        if "::" in owner:
            path, name = owner.split("::")
            tree = ast.parse((ROOT / path).read_text())
            assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, owner


def test_the_plugin_blocks_are_the_plugin_test_s() -> None:
    """The plugin module and entry-point blocks appear verbatim in the test that installs them
    through real entry-point discovery."""
    path = ROOT / PLUGIN_TEST
    if not path.exists():
        pytest.skip(f"{PLUGIN_TEST}, which runs the plugin blocks, is not in this tree yet")
    source = path.read_text()
    for key, owner in CLAIMS.items():
        if owner == PLUGIN_TEST:
            assert block(key) in source, key


def test_the_make_block_names_real_targets() -> None:
    """`make demo` and `make test` are Makefile targets (run as `make -n`: the real ones install
    the package and run this suite)."""
    for line in block("make demo   #").splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "make"
        done = subprocess.run(
            ["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_check_block_passes(tmp_path: Path) -> None:
    """`specstrat check` passes the README's drafter: conformance and mypy."""
    (out,) = run_shell_block(block("specstrat check "), tmp_path, timeout=600)
    assert "FAIL" not in out
    assert "PASS mypy --strict" in out


def test_the_demo_block_runs(tmp_path: Path) -> None:
    """`specstrat demo` runs the README's drafter on the embedded models, losslessly."""
    (out,) = run_shell_block(block("specstrat demo --algo "), tmp_path, timeout=300)
    assert "BIGRAM" in out
    assert re.search(r"^lossless +yes", out, flags=re.MULTILINE)


def test_the_bench_block_runs(tmp_path: Path) -> None:
    """`specstrat bench` measures NGRAM and the README's drafter and writes its JSON."""
    run_shell_block(block("specstrat bench "), tmp_path, timeout=300)
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["NONE", "NGRAM", "BIGRAM"]
    assert all(r["lossless"] for r in rows)


def test_the_readme_is_a_quickstart() -> None:
    """The README stays a quickstart (at most 150 lines) whose relative links all resolve,
    as they do on GitHub."""
    assert README.count("\n") <= 150
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).is_file(), target
