"""The embedded models: small, shipped, deterministic to train, and the target writes code."""

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specstrat
from specstrat.runtime import EMBEDDED_WEIGHTS, EmbeddedModels, Engine, EngineConfig, Request
from specstrat.runtime._models.corpus import corpus
from specstrat.runtime._models.text import decode_indentation, encode_indentation
from specstrat.runtime._models.train import main


def test_weights_ship_inside_the_package_under_5_mb() -> None:
    """All three models together stay under 5 MB and live inside specstrat/."""
    assert EMBEDDED_WEIGHTS.is_file()
    assert EMBEDDED_WEIGHTS.stat().st_size < 5 * 1024 * 1024
    assert "specstrat" in EMBEDDED_WEIGHTS.parts


def test_target_greedy_output_looks_like_python(models: EmbeddedModels) -> None:
    """Greedy text from a Python prompt is varied printable code, not a loop of one byte."""
    prompt = b"def read_config(path):\n\x01"  # \x01: one indentation level (see train.py)
    out = Engine(specstrat.NONE, models, EngineConfig(context_len=512)).run(
        [Request("q", tuple(prompt), 160)]
    )["q"]
    text = bytes(out)
    longest_run = max(len(list(group)) for _, group in itertools.groupby(text))
    assert len(set(text)) >= 15, text
    assert sum(32 <= b < 127 or b == 10 for b in text) / len(text) > 0.95, text
    assert longest_run < 40, text
    words = re.findall(rb"[A-Za-z_]{4,}", text)
    training = bytes(corpus().tolist())
    assert len(words) >= 8, text
    assert sum(word in training for word in words) / len(words) > 0.9, text  # its own vocabulary
    assert decode_indentation(prompt + text).startswith("def read_config(path):\n    ")


def test_indentation_round_trips() -> None:
    """The models' indentation bytes decode back to the original 4-space indentation."""
    source = b"class A:\n    def f(self):\n        return 1\n\n  odd = 2\n"
    assert decode_indentation(encode_indentation(source)) == source.decode()
    assert encode_indentation(source) == b"class A:\n\x01def f(self):\n\x02return 1\n\n  odd = 2\n"


def test_training_is_deterministic(tmp_path: Path) -> None:
    """Two short training runs with the same settings write identical weights."""
    paths = [tmp_path / "a.pt", tmp_path / "b.pt"]
    for path in paths:  # a subprocess each: training sets torch's global thread/determinism flags
        cmd = [
            sys.executable,
            "-m",
            "specstrat.runtime._models.train",
            "--steps",
            "2",
            "--out",
            str(path),
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    a, b = (torch.load(p, weights_only=True) for p in paths)
    for model in ("target", "draft", "eagle"):
        for name, tensor in a[model]["state"].items():
            assert torch.equal(tensor, b[model]["state"][name]), f"{model}.{name}"


def test_training_refuses_zero_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """``--steps 0`` is refused before any training, naming the value."""
    with pytest.raises(SystemExit, match=r"^2$"):  # argparse's usage-error status
        main(["--steps", "0", "--out", "/nonexistent/never-written.pt"])
    assert "--steps must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^2$"):
        main(["--block-head", "--block-steps", "0", "--out", "/nonexistent/never-written.pt"])
    assert "--block-steps must be at least 1, got 0" in capsys.readouterr().err
