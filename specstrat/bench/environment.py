"""Where a bench ran: package versions, torch threads, the git commit, date and load average."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["environment"]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The commit of the specstrat checkout that runs (None outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent.parent
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def environment() -> dict[str, Any]:
    """The machine and software a bench ran on, for its JSON."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "specstrat": _version("specstrat"),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "device": "cpu",
        "git_commit": _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average": list(load) if load is not None else None,
    }
