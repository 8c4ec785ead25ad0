"""Deprecated names of 0.3.0, kept working through 0.4.x: moved modules, moved or renamed names,
renamed keyword arguments and dataclass fields. Each use warns once per call site with a
``DeprecationWarning`` naming what replaces it (the CHANGELOG's migration table lists them all).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")
_C = TypeVar("_C", bound=type)

__all__ = [
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


class RemovedIn050(DeprecationWarning):
    """A 0.3.0 name that still works through 0.4.x and goes in 0.5.0."""


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now ``new``."""
    warnings.warn(
        f"{old} is deprecated since specstrat 0.4.0 and goes in 0.5.0; use {new} ({_SEE})",
        RemovedIn050,
        stacklevel=stacklevel,
    )


def moved_module(old: str, new: str) -> None:
    """Called by a 0.3.0 module path kept as a shim over the module that replaced it."""
    warn_renamed(f"module {old}", new, stacklevel=4)


def moved_names(module: str, moves: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each old name in ``moves`` (``"pkg.mod:NAME"`` values)
    with a warning; any other missing name is an AttributeError as usual."""

    def __getattr__(name: str) -> Any:
        target = moves.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        path, _, attr = target.partition(":")
        warn_renamed(f"{module}.{name}", f"{path}.{attr}")
        return getattr(importlib.import_module(path), attr)

    return __getattr__


def renamed_keywords(
    owner: str, renames: Mapping[str, str], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """``kwargs`` with each old keyword of ``renames`` replaced by its new name, warning for each
    (the old keyword wins over a new one given beside it, as ``dataclasses.replace`` passes
    every field by its new name)."""
    for old, new in renames.items():
        if old in kwargs:
            warn_renamed(f"{owner}({old}=...)", f"{owner}({new}=...)", stacklevel=4)
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


def renamed_fields(**renames: str) -> Callable[[_C], _C]:
    """A class decorator (above ``@dataclass``): the constructor takes each old keyword of
    ``renames`` (old name -> new name) with a warning, as :func:`dataclasses.replace` does."""

    def decorate(cls: _C) -> _C:
        init = getattr(cls, "__init__")  # noqa: B009

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **renamed_keywords(cls.__name__, renames, kwargs))

        __init__.__doc__, __init__.__wrapped__ = init.__doc__, init  # type: ignore[attr-defined]
        setattr(cls, "__init__", __init__)  # noqa: B010
        return cls

    return decorate
