"""The one test for "an int, not a bool" that every value check in specstrat uses."""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["is_int"]


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` and not a ``bool`` (``True`` is an int to Python, never a
    count or an index to specstrat)."""
    return isinstance(value, int) and not isinstance(value, bool)
