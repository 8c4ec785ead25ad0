"""How specstrat is installed lets a user's own tools find it: mypy outside the repository."""

import os
import subprocess
import sys
from pathlib import Path

USER_MODULE = """\
from dataclasses import replace

import specstrat
from specstrat.builtins import NGRAM

MINE: specstrat.SpecAlgorithm[None] = replace(NGRAM, name="MINE")
"""


def test_plain_mypy_strict_finds_specstrat_outside_the_repository(tmp_path: Path) -> None:
    """``mypy --strict mymodule.py`` in a user's directory, with no PYTHONPATH, passes."""
    (tmp_path / "mymodule.py").write_text(USER_MODULE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", os.devnull, "mymodule.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found in 1 source file" in done.stdout
