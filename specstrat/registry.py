"""Algorithm registry: case-insensitive names, built-ins reserved, entry-point plugins.

``specstrat.register``/``get``/``names`` act on the default registry, which holds the built-ins
and, on first lookup, every plugin in the ``specstrat.algorithms`` entry-point group. A plugin's
entry point names a :class:`~specstrat.algorithm.SpecAlgorithm` (or a zero-argument callable
returning one). A plugin that fails to load, with any exception but ``KeyboardInterrupt``
(``SystemExit`` included), is reported as :class:`~specstrat.errors.PluginLoadError` with its name
and the exception, and no plugin of that discovery is registered; it is never swallowed. Built-in
names never involve plugins (no plugin may take them), so ``get('EAGLE')`` works while a plugin is
broken; other names and ``names()`` report the broken plugin. :class:`Registry` instances are
independent, for tests and embedding engines.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from specstrat.algorithm import SpecAlgorithm
from specstrat.builtins import BUILTINS
from specstrat.errors import InvalidConfig, PluginLoadError, RegistrationError, UnknownAlgorithm

__all__ = [
    "ENTRY_POINT_GROUP",
    "RESERVED_NAMES",
    "Registry",
    "default_registry",
    "holding_module",
    "get",
    "names",
    "register",
]

#: The entry-point group plugins register algorithms under.
ENTRY_POINT_GROUP = "specstrat.algorithms"
#: Names no user algorithm may take: the built-ins'.
RESERVED_NAMES: frozenset[str] = frozenset(algo.name.upper() for algo in BUILTINS)

_AlgoT = TypeVar("_AlgoT", bound=SpecAlgorithm[Any])


class Registry:
    """Algorithms by case-insensitive name; a failed registration leaves it unchanged."""

    def __init__(self, builtins: Iterable[SpecAlgorithm[Any]] = ()) -> None:
        self._algorithms: dict[str, SpecAlgorithm[Any]] = {}
        self._plugins_loaded = False
        self._loading = False
        self._loaded_points: set[str] = set()
        self._origins: dict[str, str] = {}  # by key; a name absent is one register() added
        for algo in builtins:
            self._add(algo, reserved_ok=True)
            self._origins[algo.name.upper()] = "built-in"

    def _add(self, algo: SpecAlgorithm[Any], *, reserved_ok: bool) -> None:
        self._admit(algo, reserved_ok=reserved_ok, pending=())
        self._algorithms[algo.name.upper()] = algo

    def _admit(
        self, algo: object, *, reserved_ok: bool, pending: Iterable[str]
    ) -> SpecAlgorithm[Any]:
        """Check that ``algo`` may be registered (changes nothing)."""
        if not isinstance(algo, SpecAlgorithm):
            raise RegistrationError(
                f"algo={algo!r} is a {type(algo).__name__}; register a specstrat.SpecAlgorithm"
            )
        key = algo.name.upper()
        if key in RESERVED_NAMES and not reserved_ok:
            raise RegistrationError(
                f"name={algo.name!r} is reserved for the built-in {key}; pick another name "
                "(names are case-insensitive)"
            )
        if key in self._algorithms or key in pending:
            raise RegistrationError(
                f"name={algo.name!r} is already registered (as {key}); names are "
                "case-insensitive and registered once"
            )
        return algo

    def register(self, algo: _AlgoT) -> _AlgoT:
        """Add ``algo`` under its name; returns it, so it can be used as an expression."""
        self._add(algo, reserved_ok=False)
        return algo

    def get(self, name: str) -> SpecAlgorithm[Any]:
        """The algorithm registered as ``name`` (any case); unknown names list the known ones."""
        if not isinstance(name, str):
            raise InvalidConfig(f"name={name!r} must be a str such as 'EAGLE'")
        found = self._algorithms.get(name.upper())
        if found is None:
            raise UnknownAlgorithm(
                f"no algorithm named {name!r}; known: {', '.join(self._algorithms)}"
            )
        return found

    def names(self) -> tuple[str, ...]:
        """Registered names (upper case), in registration order."""
        return tuple(self._algorithms)

    def origin(self, name: str) -> str:
        """Where the algorithm registered as ``name`` came from: ``built-in``, ``plugin NAME
        (MODULE:ATTR) from DISTRIBUTION VERSION``, or ``registered by MODULE`` (the first loaded
        module holding it; ``registered at run time`` when none does)."""
        algo = self.get(name)
        found = self._origins.get(algo.name.upper())
        if found is not None:
            return found
        module = holding_module(algo)
        return f"registered by {module.__name__}" if module else "registered at run time"

    def load_entry_points(self, found: Iterable[EntryPoint] | None = None) -> tuple[str, ...]:
        """Register every plugin in ``found`` (default: the installed ``specstrat.algorithms``).

        All or nothing: every plugin is loaded and checked before any is registered, so a broken
        one raises :class:`~specstrat.errors.PluginLoadError` and leaves the registry unchanged,
        including what the plugins' own modules registered while they were imported. A plugin
        whose module registers its algorithm itself (``X = specstrat.register(...)``, the
        README's pattern) counts once. A plugin whose module is being imported right now (it
        called ``register``, which loads the plugins first) is left for a later lookup, as its
        own ``register`` call adds it. Any exception a plugin raises counts, ``SystemExit`` and
        other ``BaseException`` subclasses included; only ``KeyboardInterrupt`` propagates as it is.
        Returns the names registered from entry points by this call.
        """
        candidates = list(entry_points(group=ENTRY_POINT_GROUP) if found is None else found)
        before, origins = dict(self._algorithms), dict(self._origins)
        loaded: list[SpecAlgorithm[Any]] = []
        done: list[str] = []
        self._loading = True
        try:
            for ep in candidates:
                if ep.value in self._loaded_points or _importing(ep.module):
                    continue
                algo = self._load_one(ep, loaded)
                if algo is not None:
                    loaded.append(algo)
                done.append(ep.value)
        except BaseException:
            self._algorithms, self._origins = before, origins
            raise
        finally:
            self._loading = False
        for algo in loaded:
            self._algorithms[algo.name.upper()] = algo
        self._loaded_points.update(done)
        return tuple(algo.name.upper() for algo in loaded)

    def _load_one(
        self, ep: EntryPoint, loaded: list[SpecAlgorithm[Any]]
    ) -> SpecAlgorithm[Any] | None:
        """The algorithm ``ep`` names, checked; None when its module registered it itself."""
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, SpecAlgorithm):
                obj = obj()
            if isinstance(obj, SpecAlgorithm):  # kept only if the whole discovery registers
                self._origins[obj.name.upper()] = _plugin_origin(ep)
            if isinstance(obj, SpecAlgorithm) and self._algorithms.get(obj.name.upper()) is obj:
                return None
            return self._admit(obj, reserved_ok=False, pending=[a.name.upper() for a in loaded])
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a plugin's sys.exit() must not end the caller
            raise PluginLoadError(
                f"plugin {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r} failed to "
                f"load: {_describe(exc)}; fix or uninstall it (no plugin was registered)"
            ) from exc

    def ensure_plugins(self) -> None:
        """Load installed plugins once (again on the next call if loading failed or was deferred).

        A call made while plugins are loading (a plugin module calling ``register``) does
        nothing, so a plugin module may register itself.
        """
        if self._plugins_loaded or self._loading:
            return
        self.load_entry_points()
        self._plugins_loaded = not any(
            _importing(ep.module) for ep in entry_points(group=ENTRY_POINT_GROUP)
        )


def holding_module(algo: SpecAlgorithm[Any]) -> types.ModuleType | None:
    """The first loaded module other than the top-level ``specstrat`` whose attribute is
    ``algo`` (where a user's algorithm was defined or imported), or None."""
    modules = [m for m in list(sys.modules.values()) if m is not None]
    return next(
        (
            m
            for m in modules
            if m.__name__ != "specstrat" and any(v is algo for v in list(vars(m).values()))
        ),
        None,
    )


def _plugin_origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    source = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"plugin {ep.name} ({ep.value}) from {source}"


def _importing(module: str) -> bool:
    """Whether ``module`` is being imported right now (its body has not finished running)."""
    found = sys.modules.get(module)
    spec = getattr(found, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _describe(exc: BaseException) -> str:
    """``SystemExit: 3``; the bare type name when the exception has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_DEFAULT = Registry(BUILTINS)


def default_registry() -> Registry:
    """The process-wide registry behind :func:`register`, :func:`get` and :func:`names`."""
    return _DEFAULT


def register(algo: _AlgoT) -> _AlgoT:
    """Register ``algo`` in the default registry (installed plugins are loaded first)."""
    _DEFAULT.ensure_plugins()
    return _DEFAULT.register(algo)


def get(name: str) -> SpecAlgorithm[Any]:
    """Look ``name`` up, case-insensitively, in the default registry.

    A built-in name is answered without loading plugins (none may take it), so it works while an
    installed plugin is broken; any other name raises that plugin's
    :class:`~specstrat.errors.PluginLoadError`.
    """
    if isinstance(name, str) and name.upper() not in RESERVED_NAMES:
        _DEFAULT.ensure_plugins()
    return _DEFAULT.get(name)


def names() -> tuple[str, ...]:
    """Every name in the default registry, built-ins first (a broken plugin raises)."""
    _DEFAULT.ensure_plugins()
    return _DEFAULT.names()
