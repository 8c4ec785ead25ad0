"""The README's SmolLM2 blocks, run as written (``make test-real``; training's budget cut)."""

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


def test_the_train_block_runs(tmp_path: Path) -> None:
    """The README's train block, its budget cut to half a minute (a smoke run, with a small draft
    vocabulary and short responses): it writes a head that the demo line runs losslessly."""
    text = block("specstrat train ").replace(
        "--budget 60", "--budget 0.5 --draft-vocab 2048 --max-new-tokens 16 --no-progress"
    )
    assert "--budget 0.5" in text
    train, demo = run_shell_block(text, tmp_path, timeout=600)
    assert (tmp_path / "head.safetensors").is_file()
    assert re.search(r"^held-out τ +\d", train, flags=re.MULTILINE)
    assert re.search(r"^lossless +yes", demo, flags=re.MULTILINE)
