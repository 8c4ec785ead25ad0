"""What a ``MODULE:ATTR`` flag imported when it is not the kind the flag wants, said so the
user can fix it: a class where an instance is wanted, a function, a module, or another kind."""

from __future__ import annotations

import functools
import inspect
import types

__all__ = ["not_a"]


def _a(noun: str) -> str:
    """``noun`` with its indefinite article."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _of_kind(found: type, kind: type | None) -> bool:
    """Whether instances of the class ``found`` could be a ``kind`` (unknown: yes)."""
    if kind is None:
        return True
    try:
        return issubclass(found, kind)
    except TypeError:  # a Protocol with properties: the class must have every member
        from typing_extensions import get_protocol_members

        return all(hasattr(found, name) for name in get_protocol_members(kind))


def not_a(flag: str, spec: str, found: object, wanted: str, kind: type | None = None) -> str:
    """The refusal of ``flag spec`` (``MODULE:ATTR``; ``flag`` empty for a positional
    argument) that imported ``found``, not a ``wanted`` (instances of ``kind``, when given): what
    was found (a class where an instance is wanted, a class of another kind, a function, a
    callable object, a module, or another kind) and a fix naming what to create."""
    module, _, attr = spec.partition(":")
    arg = f"{flag} " if flag else ""
    head = f"{arg}{spec!r} is"
    if isinstance(found, type) and not _of_kind(found, kind):
        return (
            f"{head} a class ({found.__name__}), and its instances are not {_a(wanted)} "
            f"either; pass {_a(wanted)} instance: {arg}MODULE:NAME where NAME = "
            f"{wanted.split()[0]}(...) or one built from it"
        )
    if isinstance(found, type):
        name = attr.upper() if attr.upper() != attr else f"MY_{attr}"
        return (
            f"{head} a class ({found.__name__}), not an instance of it: {_a(wanted)} instance is "
            f"wanted; create one in {module} ({name} = {found.__name__}(...)) and pass "
            f"{arg}{module}:{name}"
        )
    if isinstance(found, types.ModuleType):
        return (
            f"{head} a module ({found.__name__}), not {_a(wanted)}; name an attribute of it: "
            f"{arg}{found.__name__}:NAME"
        )
    if inspect.isroutine(found) or isinstance(found, functools.partial):
        inner = found.func if isinstance(found, functools.partial) else found
        called = str(getattr(inner, "__name__", attr))
        return (
            f"{head} a function ({called}), not {_a(wanted)}; call it in {module} "
            f"(RESULT = {attr}(...)) and pass {arg}{module}:RESULT"
        )
    if callable(found):
        return (
            f"{head} a callable {type(found).__name__} instance, not {_a(wanted)}; if calling "
            f"it returns one, call it in {module} (RESULT = {attr}(...)) and pass "
            f"{arg}{module}:RESULT"
        )
    return f"{head} {_a(type(found).__name__)}, not {_a(wanted)}"
