"""The GGUF conversion cache: what it holds, and ``specstrat cache [--clear]``.

:func:`specstrat.hf.load` keeps each converted ``.gguf`` file under ``cache_dir()/models``
(named by the file's stem and a key of its content) and remembers content hashes under
``cache_dir()/index``; nothing else of the directory is specstrat's.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from specstrat.hf.loader import cache_dir

__all__ = ["CachedModel", "cache_command", "cached_models", "clear_cache"]


@dataclass(frozen=True, slots=True)
class CachedModel:
    """One converted model: its directory and its size in bytes."""

    path: Path
    size: int


def cached_models() -> tuple[CachedModel, ...]:
    """The converted models in the cache, by name (none when the cache does not exist)."""
    models = cache_dir() / "models"
    if not models.is_dir():
        return ()
    return tuple(
        CachedModel(entry, sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()))
        for entry in sorted(models.iterdir())
        if entry.is_dir() and not entry.name.startswith(".")
    )


def clear_cache() -> int:
    """Remove the converted models and the content index (what :func:`cached_models` lists and
    any interrupted conversion); the bytes freed."""
    freed = sum(m.size for m in cached_models())
    for part in ("models", "index"):
        shutil.rmtree(cache_dir() / part, ignore_errors=True)
    return freed


def cache_command(*, clear: bool) -> int:
    """``specstrat cache``: each converted model and its size; ``--clear`` removes them."""
    if clear:
        print(f"removed {clear_cache() / 1e6:.0f} MB of converted models from {cache_dir()}")
        return 0
    models = cached_models()
    total = sum(m.size for m in models) / 1e6
    print(f"{cache_dir()}: {len(models)} converted model(s), {total:.0f} MB")
    for model in models:
        print(f"  {model.size / 1e6:8.0f} MB  {model.path.name}")
    return 0
