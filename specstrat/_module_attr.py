"""What a ``MODULE:ATTR`` flag imported when it is not the kind the flag wants, said so the
user can fix it: a class where an instance is wanted, a function, a module, or another kind."""

from __future__ import annotations

import types

__all__ = ["not_a"]


def not_a(flag: str, spec: str, found: object, wanted: str) -> str:
    """The refusal of ``flag spec`` (``MODULE:ATTR``; ``flag`` empty for a positional
    argument) that imported ``found``, not a ``wanted``: what was found (a class where an
    instance is wanted, a function, a module, or another kind) and a fix naming what to create."""
    module, _, attr = spec.partition(":")
    arg = f"{flag} " if flag else ""
    head = f"{arg}{spec!r} is"
    if isinstance(found, type):
        name = attr.upper() if attr.upper() != attr else f"MY_{attr}"
        return (
            f"{head} a class ({found.__name__}), not an instance of it: a {wanted} instance is "
            f"wanted; create one in {module} ({name} = {found.__name__}(...)) and pass "
            f"{arg}{module}:{name}"
        )
    if isinstance(found, types.ModuleType):
        return (
            f"{head} a module ({found.__name__}), not a {wanted}; name an attribute of it: "
            f"{arg}{found.__name__}:NAME"
        )
    if callable(found):
        called = getattr(found, "__name__", type(found).__name__)
        return (
            f"{head} a function ({called}), not a {wanted}; call it in {module} "
            f"(RESULT = {called}(...)) and pass {arg}{module}:RESULT"
        )
    return f"{head} a {type(found).__name__}, not a {wanted}"
