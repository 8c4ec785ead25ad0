"""The command line's output paths: checked before any work starts, written atomically.

A run that ends by writing a file must not lose its measurements to a path that could never
be written, so ``bench``, ``demo`` and ``train`` check each output flag here before they load a
model, and write through :func:`write_atomic` (a temporary file in the same directory, then
``os.replace``), so a reader never sees half a file. ``-`` for a file flag means stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from specstrat.errors import InvalidConfig

__all__ = ["STDOUT", "check_dir", "check_file", "check_json", "write_atomic", "write_json"]

#: The file flag value that means standard output.
STDOUT = "-"


def _writable_home(flag: str, text: str, home: Path) -> None:
    """``home`` (the directory the output goes in) exists, is a directory and is writable;
    otherwise an :class:`InvalidConfig` naming ``flag``, ``text`` and what to do."""
    found = next((p for p in (home, *home.parents) if p.exists()), Path("."))
    if not found.is_dir():
        raise InvalidConfig(
            f"{flag} {text!r} is under {str(found)!r}, a plain file, not a directory; pass a "
            "path in a directory"
        )
    if found != home:
        raise InvalidConfig(
            f"{flag} {text!r}: its directory {str(home)!r} does not exist; create it "
            f"(mkdir -p {home}) or pass a path in an existing directory"
        )
    if not os.access(home, os.W_OK):
        raise InvalidConfig(
            f"{flag} {text!r}: directory {str(home)!r} is not writable; pass a path in a "
            "directory you can write to"
        )


def check_file(flag: str, text: str) -> Path:
    """The output file ``text`` of ``flag``, checked writable before any work: not a
    directory, in an existing writable directory, not a read-only file."""
    out = Path(text).expanduser()
    if out.is_dir():
        raise InvalidConfig(f"{flag} {text!r} is a directory; pass a file path, e.g. {out}.json")
    _writable_home(flag, text, out.parent)
    if out.exists() and not os.access(out, os.W_OK):
        raise InvalidConfig(f"{flag} {text!r} exists and is read-only; pass another path")
    return out


def check_json(flag: str, text: str) -> Path | None:
    """A JSON output flag's ``text``: ``-`` gives ``None`` (stdout), else :func:`check_file`."""
    return None if text == STDOUT else check_file(flag, text)


def check_dir(flag: str, text: str) -> Path:
    """The output directory ``text`` of ``flag``, checked before any work: a directory (or
    missing, then created under the nearest existing directory, which must be writable)."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise InvalidConfig(f"{flag} {text!r} is a plain file; pass a directory path")
    found = next(p for p in (out, *out.parents, Path(".")) if p.exists())
    if not found.is_dir():
        raise InvalidConfig(
            f"{flag} {text!r} is under {str(found)!r}, a plain file, not a directory; pass a "
            "path in a directory"
        )
    if not os.access(found, os.W_OK):
        raise InvalidConfig(
            f"{flag} {text!r}: {str(found)!r} is not writable; pass a directory you can write to"
        )
    return out


def write_atomic(flag: str, path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in its directory and
    ``os.replace``; a failure leaves no temporary file and names ``flag``."""
    try:
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InvalidConfig(f"{flag} {str(path)!r}: cannot write it ({exc.strerror})") from exc
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, path)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise InvalidConfig(f"{flag} {str(path)!r}: cannot write it ({exc.strerror})") from exc


def write_json(flag: str, path: Path | None, document: Any) -> None:
    """``document`` as indented JSON: to ``path`` atomically, or to stdout when ``path`` is
    ``None`` (``-``)."""
    text = json.dumps(document, indent=2) + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(flag, path, text)
