"""Deprecated names of 0.3.0, kept working through 0.4.x: moved modules, moved or renamed names,
renamed keyword arguments and dataclass fields. Each use warns once per call site with a
``DeprecationWarning`` naming what replaces it (the CHANGELOG's migration table lists them all).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")
_C = TypeVar("_C", bound=type)

__all__ = [
    "INTERNAL",
    "RemovedIn050",
    "RenamedField",
    "moved_module",
    "moved_names",
    "renamed_fields",
    "renamed_keywords",
    "warn_renamed",
]

#: Where to read what replaced each old name.
_SEE = "see the migration table in CHANGELOG.md"

#: Frames a warning skips to reach the user's line: specstrat's, the import system's and
#: ``dataclasses.replace``'s.
_SKIP = (str(Path(__file__).resolve().parent) + os.sep, dataclasses.__file__, "<frozen importlib")

#: Passed as the replacement of a module or name that became internal: there is none.
INTERNAL = "<internal>"


class RemovedIn050(DeprecationWarning):
    """A 0.3.0 name that still works through 0.4.x and goes in 0.5.0."""


def _user_stacklevel() -> int:
    """The stack level of the first frame outside specstrat, the import system and
    ``dataclasses`` (the line that used the old name)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def warn_renamed(old: str, new: str) -> None:
    """Warn that ``old`` is now ``new`` (or internal, for :data:`INTERNAL`), at the user's line."""
    if new == INTERNAL:
        text = (
            f"{old} is deprecated since specstrat 0.4.0 and goes in 0.5.0: it is internal now, "
            "with no public replacement; the public names are in specstrat.runtime"
        )
    else:
        text = f"{old} is deprecated since specstrat 0.4.0 and goes in 0.5.0; use {new}"
    warnings.warn(f"{text} ({_SEE})", RemovedIn050, stacklevel=_user_stacklevel())


def moved_module(old: str, new: str, private: str | None = None) -> Callable[[str], Any]:
    """Called by a 0.3.0 module path kept as a shim over the module that replaced it; returns
    the shim's ``__getattr__``, which serves the rest of the ``private`` module's names (those
    not in its ``__all__``) the old path also had."""
    warn_renamed(f"module {old}", new)

    def __getattr__(name: str) -> Any:
        if private is not None and not name.startswith("__"):
            module = importlib.import_module(private)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__


def moved_names(module: str, moves: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name in ``moves`` (``"pkg.mod:NAME"`` values)
    with a warning; any other missing name is an AttributeError as usual."""

    def __getattr__(name: str) -> Any:
        target = moves.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        path, _, attr = target.partition(":")
        internal = any(part.startswith("_") for part in path.split("."))
        warn_renamed(f"{module}.{name}", INTERNAL if internal else f"{path}.{attr}")
        return getattr(importlib.import_module(path), attr)

    return __getattr__


def renamed_keywords(
    owner: str, renames: Mapping[str, str], kwargs: dict[str, Any], *, replacing: bool = False
) -> dict[str, Any]:
    """``kwargs`` with each old keyword of ``renames`` replaced by its new name, warning for each.
    Both names at once is a TypeError, except under ``dataclasses.replace`` (``replacing``),
    which passes every field by its new name: there the old keyword is the change asked for."""
    for old, new in renames.items():
        if old in kwargs:
            if new in kwargs and not replacing:
                raise TypeError(
                    f"{owner}() got {old}= (its 0.3.0 name) and {new}= at once; pass {new}= only"
                )
            warn_renamed(f"{owner}({old}=...)", f"{owner}({new}=...)")
            kwargs[new] = kwargs.pop(old)
    return kwargs


class RenamedField(Generic[_T]):
    """A dataclass field's 0.3.0 name, read through to its new name with a warning.

    Assigned without an annotation (``last_tokens = RenamedField[torch.Tensor]("bonus_tokens")``),
    so the dataclass does not take it for a field; type checkers see its type through
    ``__get__``. Pair it with :func:`renamed_fields` for the constructor keyword.
    """

    def __init__(self, new: str, use: str = "") -> None:
        self.new, self.use = new, use  # ``use``: what to say instead of the new (private) name
        self.old = ""
        self.owner = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.old, self.owner = name, owner.__name__

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> RenamedField[_T]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> _T | RenamedField[_T]:
        if obj is None:
            return self
        warn_renamed(f"{self.owner}.{self.old}", self.use or f"{self.owner}.{self.new}")
        value: _T = getattr(obj, self.new)
        return value

    def __set__(self, obj: object, value: _T) -> None:
        warn_renamed(f"{self.owner}.{self.old}", self.use or f"{self.owner}.{self.new}")
        setattr(obj, self.new, value)  # a frozen dataclass refuses, as for the new name


def renamed_fields(**renames: str) -> Callable[[_C], _C]:
    """A class decorator (above ``@dataclass``): the constructor takes each old keyword of
    ``renames`` (old name -> new name) with a warning, as :func:`dataclasses.replace` does."""

    def decorate(cls: _C) -> _C:
        init = getattr(cls, "__init__")  # noqa: B009

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            replacing = sys._getframe(1).f_code is _REPLACE_CODE
            kwargs = renamed_keywords(cls.__name__, renames, kwargs, replacing=replacing)
            init(self, *args, **kwargs)

        __init__.__doc__, __init__.__wrapped__ = init.__doc__, init  # type: ignore[attr-defined]
        setattr(cls, "__init__", __init__)  # noqa: B010
        return cls

    return decorate


#: ``dataclasses.replace``'s code: a renamed field's old keyword there is the change asked for.
_REPLACE_CODE = dataclasses.replace.__code__
