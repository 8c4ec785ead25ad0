"""The README's SmolLM2 block, run as written (``make test-real``)."""

import re
from pathlib import Path

import pytest

from tests.core.test_readme import block, run_shell_block

pytestmark = pytest.mark.real


def test_the_smollm2_block_runs(tmp_path: Path) -> None:
    """`specstrat demo --model smollm2` runs the README's drafter, lossless against
    transformers' generate."""
    (out,) = run_shell_block(block("specstrat demo --model smollm2 "), tmp_path, timeout=600)
    assert "BIGRAM" in out
    assert re.search(r"^lossless +yes", out, flags=re.MULTILINE)
