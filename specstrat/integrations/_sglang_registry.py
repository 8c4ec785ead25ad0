"""Putting specstrat algorithms into SGLang's registry, and taking them out again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig, RegistrationError, UnknownAlgorithm
from specstrat.integrations._sglang_adapter import (
    SGLangBinding,
    SpecstratSpecAlgo,
    ToSpecInput,
    make_spec_class,
)
from specstrat.integrations._sglang_import import SGLangModules, load_sglang

__all__ = ["SGLangPlugin", "Worker", "plugin", "register", "registered", "unregister"]

#: A worker class (``BaseSpecWorker``) or a factory ``server_args -> worker class``.
Worker = type | Callable[[Any], type]
#: Validates SGLang's ``ServerArgs`` at start-up (``handle_speculative_decoding``).
ServerArgsValidator = Callable[[Any], None]


def registered(name: str) -> Any | None:
    """The plugin algorithm SGLang's ``from_string`` finds for ``name``; ``None`` if none.

    Built-in names (and SGLang's aliases) answer ``None``: they are not plugins.
    """
    modules = load_sglang()
    try:
        found = modules.algorithm_enum.from_string(name)
    except ValueError:
        return None
    return None if isinstance(found, modules.algorithm_enum) else found


def _refuse_taken(modules: SGLangModules, name: str) -> None:
    """Refuse ``name`` if SGLang already answers it, naming what it answers with."""
    enum = modules.algorithm_enum
    try:
        found = enum.from_string(name)
    except ValueError:
        return
    upper = name.upper()
    if isinstance(found, enum):
        what = f"built-in {upper}" if found.name == upper else f"alias {upper} (of {found.name})"
        raise RegistrationError(
            f"name={name!r} clashes with SGLang's {what}; SGLang reserves its built-in names: "
            f"register the algorithm under another one, e.g. name='SPECSTRAT_{upper}'"
        )
    raise RegistrationError(
        f"name={name!r} is already registered in SGLang ({found!r}); names are "
        "case-insensitive and registered once (specstrat.integrations.sglang.unregister "
        "removes one specstrat registered)"
    )


def _worker_factory(worker: Worker) -> Callable[[Any], type]:
    """SGLang's worker factory: the worker class itself, or the user's factory."""
    if isinstance(worker, type):
        cls = worker

        def factory(server_args: Any) -> type:
            return cls

        return factory
    if callable(worker):
        return worker
    raise InvalidConfig(
        f"worker={worker!r} is neither a worker class nor a factory; pass SGLang's worker "
        "class (a BaseSpecWorker) or a function server_args -> worker class"
    )


def _checked_algorithm(algo: object) -> SpecAlgorithm[Any]:
    if not isinstance(algo, SpecAlgorithm):
        raise RegistrationError(
            f"algo={algo!r} is a {type(algo).__name__}; register a specstrat.SpecAlgorithm"
        )
    if algo.is_none():
        raise RegistrationError(
            f"{algo.name} is not speculative (plain decoding); SGLang decodes plainly when "
            "--speculative-algorithm is unset, so there is nothing to register"
        )
    return algo


def register(
    algo: SpecAlgorithm[Any],
    *,
    worker: Worker,
    name: str | None = None,
    to_spec_input: ToSpecInput | None = None,
    validate_server_args: ServerArgsValidator | None = None,
) -> Any:
    """Register ``algo`` in SGLang as ``name`` (default ``algo.name``); returns SGLang's object.

    Goes through ``SpeculativeAlgorithm.register`` with a generated ``CustomSpecAlgo``
    subclass whose hooks answer from ``algo``; ``supports_overlap`` is the algorithm's
    capability. ``worker`` is what SGLang instantiates (specstrat cannot supply it).
    ``to_spec_input`` converts the draft input of a non-built-in disagg builder to an SGLang
    ``SpecInput`` (required for one: :class:`~specstrat.errors.InvalidStrategy` otherwise).
    A name SGLang already answers (its built-ins, ``NEXTN``, an earlier registration) is a
    :class:`~specstrat.errors.RegistrationError` naming the clash.
    """
    algo = _checked_algorithm(algo)
    key = algo.name if name is None else name
    if not isinstance(key, str) or not key:
        raise InvalidConfig(f"name={key!r} must be a non-empty str such as 'SPECSTRAT_EAGLE'")
    factory = _worker_factory(worker)
    binding = SGLangBinding(algo, to_spec_input)
    modules = load_sglang()
    _refuse_taken(modules, key)
    try:
        modules.algorithm_enum.register(
            key,
            supports_overlap=algo.capabilities.supports_overlap,
            validate_server_args=validate_server_args,
            spec_class=make_spec_class(binding, modules),
        )(factory)
    except (ValueError, TypeError) as exc:
        raise RegistrationError(
            f"SGLang refused name={key!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return modules.algorithm_enum.from_string(key)


def unregister(name: str) -> None:
    """Remove what :func:`register` put into SGLang under ``name`` (tests, ``check_sglang``).

    SGLang 0.5.23 has no public way to remove a registration, so this deletes the entry from
    its registry's dict; it refuses entries specstrat did not register.
    """
    modules = load_sglang()
    found = registered(name)
    if found is None:
        raise UnknownAlgorithm(f"no plugin algorithm named {name!r} is registered in SGLang")
    if not isinstance(found, SpecstratSpecAlgo):
        raise RegistrationError(
            f"name={name!r} was registered by another plugin ({found!r}), not by specstrat; "
            "leaving it"
        )
    del modules.spec_registry._REGISTRY[found.name]


@dataclass(frozen=True, slots=True)
class SGLangPlugin:
    """A general SGLang plugin (``sglang.srt.plugins``) registering specstrat algorithms.

    SGLang's ``load_plugins()`` calls it with no argument, once per process; calling it again
    skips algorithms it already registered.
    """

    algorithms: tuple[SpecAlgorithm[Any], ...]
    worker: Worker

    def __post_init__(self) -> None:
        for algo in self.algorithms:
            _checked_algorithm(algo)
            SGLangBinding(algo)  # a user draft type needs to_spec_input: use register() for it
        _worker_factory(self.worker)

    def __call__(self) -> None:
        """Register every algorithm not yet registered by this plugin."""
        for algo in self.algorithms:
            found = registered(algo.name)
            if isinstance(found, SpecstratSpecAlgo) and found.specstrat.algorithm is algo:
                continue
            register(algo, worker=self.worker)


def plugin(*algos: SpecAlgorithm[Any], worker: Worker) -> SGLangPlugin:
    """A callable for SGLang's ``sglang.srt.plugins`` entry-point group.

    In your package (``mypkg/sglang_plugin.py``)::

        REGISTER = plugin(MY_EAGLE, worker=MyEagleWorker)

    and in its ``pyproject.toml``::

        [project.entry-points."sglang.srt.plugins"]
        my_eagle = "mypkg.sglang_plugin:REGISTER"

    Then ``--speculative-algorithm MY_EAGLE`` finds it (``SGLANG_PLUGINS=my_eagle`` restricts
    which plugins load). SGLang logs a plugin that raises and goes on without it.
    """
    return SGLangPlugin(tuple(algos), worker)
