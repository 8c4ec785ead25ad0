"""The embedded models' training text: the Python standard library's own source, a fixed file
list read in order with its indentation encoded (see :mod:`specstrat.runtime._models.text`)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from specstrat.runtime._models.text import encode_indentation

__all__ = ["SOURCE_FILES", "corpus"]

#: Standard-library modules every CPython 3.10+ ships; missing ones are skipped.
SOURCE_FILES = (
    "abc.py",
    "argparse.py",
    "bisect.py",
    "calendar.py",
    "collections/__init__.py",
    "contextlib.py",
    "copy.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "os.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
    "typing.py",
    "unittest/case.py",
)


def corpus() -> torch.Tensor:
    """The training bytes: the listed stdlib files, indentation encoded, concatenated in order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        encode_indentation((root / name).read_bytes())
        for name in SOURCE_FILES
        if (root / name).is_file()
    ]
    return torch.frombuffer(bytearray(b"\n".join(parts)), dtype=torch.uint8).long()
