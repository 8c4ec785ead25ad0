"""Registry: case-insensitive names, reserved built-ins, atomic failures, entry-point plugins."""

import sys
import types
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from typing import Any

import pytest

import specstrat
from specstrat import (
    BUILTINS,
    ENTRY_POINT_GROUP,
    Capabilities,
    InvalidConfig,
    PluginLoadError,
    RegistrationError,
    Registry,
    SpecAlgorithm,
    UnknownAlgorithm,
)
from specstrat.strategies import (
    GreedyAcceptance,
    NgramDrafterFactory,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    SlotFutureMapFactory,
)


def make(name: str) -> SpecAlgorithm[None]:
    return SpecAlgorithm(
        name=name,
        capabilities=Capabilities(),
        target_verify=OffsetVerifyPolicy(),
        future_map=SlotFutureMapFactory(),
        disagg=NoDraftStateDisaggDraftBuilder(),
        drafter=NgramDrafterFactory(),
        acceptance=GreedyAcceptance(),
    )


#: An algorithm this module holds, so origin() finds it registered by this module.
ORIGIN_ALGO = make("BY_HAND")


@pytest.fixture
def plugin_module() -> Iterator[types.ModuleType]:
    """A throwaway module that entry points can name."""
    module = types.ModuleType("fake_specstrat_plugin")
    module.GOOD = make("PLUGGED")  # type: ignore[attr-defined]
    module.OTHER = make("PLUGGED_TOO")  # type: ignore[attr-defined]
    module.factory = lambda: make("FROM_FACTORY")  # type: ignore[attr-defined]
    module.NOT_ALGO = 42  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def ep(name: str, attr: str, module: str = "fake_specstrat_plugin") -> EntryPoint:
    return EntryPoint(name=name, value=f"{module}:{attr}", group=ENTRY_POINT_GROUP)


def test_builtins_are_registered_in_table_order() -> None:
    """The default registry starts with the seven built-ins."""
    assert specstrat.names()[: len(BUILTINS)] == tuple(a.name for a in BUILTINS)


def test_lookup_is_case_insensitive() -> None:
    """'eagle', 'Eagle' and 'EAGLE' are the same algorithm."""
    assert specstrat.get("eagle") is specstrat.get("Eagle") is specstrat.EAGLE


def test_register_returns_algo_and_get_finds_it() -> None:
    """A registered algorithm is found under its name in any case."""
    registry = Registry(BUILTINS)
    algo = registry.register(make("Mine"))
    assert registry.get("MINE") is algo
    assert registry.names()[-1] == "MINE"


def test_duplicate_name_refused_and_registry_unchanged() -> None:
    """Registering 'mine' after 'MINE' fails and leaves the first in place."""
    registry = Registry()
    first = registry.register(make("MINE"))
    with pytest.raises(RegistrationError, match=r"name='mine' is already registered \(as MINE\)"):
        registry.register(make("mine"))
    assert registry.names() == ("MINE",)
    assert registry.get("mine") is first


def test_reserved_names_refused_even_in_an_empty_registry() -> None:
    """No user algorithm may take a built-in's name."""
    with pytest.raises(
        RegistrationError, match=r"name='Dspark' is reserved for the built-in DSPARK"
    ):
        Registry().register(make("Dspark"))


def test_unknown_name_lists_known_names() -> None:
    """An unknown name raises UnknownAlgorithm (a KeyError) listing every known name."""
    registry = Registry(BUILTINS)
    with pytest.raises(
        UnknownAlgorithm, match=r"no algorithm named 'MEDUSA'; known: NONE, EAGLE, EAGLE3"
    ):
        registry.get("MEDUSA")
    with pytest.raises(KeyError, match=r"no algorithm named 'MEDUSA'"):
        registry.get("MEDUSA")


def test_plugins_load_instances_and_factories(plugin_module: types.ModuleType) -> None:
    """Entry points naming an algorithm or a zero-argument factory are registered."""
    registry = Registry(BUILTINS)
    loaded = registry.load_entry_points([ep("a", "GOOD"), ep("b", "factory")])
    assert loaded == ("PLUGGED", "FROM_FACTORY")
    assert registry.get("plugged") is plugin_module.GOOD


def test_plugin_import_failure_is_reported_with_name(plugin_module: types.ModuleType) -> None:
    """A plugin whose module does not import raises PluginLoadError naming it and the exception."""
    registry = Registry(BUILTINS)
    with pytest.raises(
        PluginLoadError, match=r"plugin 'broken' \(no_such_module_xyz:ALGO\).*ModuleNotFoundError"
    ) as info:
        registry.load_entry_points([ep("good", "GOOD"), ep("broken", "ALGO", "no_such_module_xyz")])
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert "PLUGGED" not in registry.names()  # all or nothing


def test_plugin_that_is_not_an_algorithm_is_reported(plugin_module: types.ModuleType) -> None:
    """An entry point naming something other than an algorithm is a PluginLoadError."""
    with pytest.raises(PluginLoadError, match=r"plugin 'num'.*RegistrationError: algo=42 is a int"):
        Registry().load_entry_points([ep("num", "NOT_ALGO")])


def test_two_plugins_with_one_name_are_refused(plugin_module: types.ModuleType) -> None:
    """Two plugins claiming one name fail together; neither is registered."""
    registry = Registry()
    with pytest.raises(PluginLoadError, match=r"plugin 'second'.*already registered"):
        registry.load_entry_points([ep("first", "GOOD"), ep("second", "GOOD")])
    assert registry.names() == ()


def test_plugin_taking_a_builtin_name_is_refused(plugin_module: types.ModuleType) -> None:
    """A plugin cannot shadow a built-in."""
    plugin_module.FAKE = make("EAGLE")  # type: ignore[attr-defined]
    with pytest.raises(PluginLoadError, match=r"reserved for the built-in EAGLE"):
        Registry(BUILTINS).load_entry_points([ep("fake", "FAKE")])


def test_ensure_plugins_retries_after_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed discovery is not remembered as done: the next lookup reports it again."""
    registry = Registry()
    calls: list[Any] = []

    def broken(found: Any = None) -> tuple[str, ...]:
        calls.append(found)
        raise PluginLoadError("plugin 'x' failed")

    monkeypatch.setattr(registry, "load_entry_points", broken)
    for _ in range(2):
        with pytest.raises(PluginLoadError, match="plugin 'x' failed"):
            registry.ensure_plugins()
    assert len(calls) == 2


# A broken plugin module: (id, source, entry-point attribute, what the message says it raised).
BROKEN_PLUGINS = [
    ("sys_exit_code", "import sys\nsys.exit(3)", "ALGO", "SystemExit: 3"),
    (
        "sys_exit_message",
        "import sys\nsys.exit('no CUDA device')",
        "ALGO",
        "SystemExit: no CUDA device",
    ),
    ("bare_system_exit", "raise SystemExit", "ALGO", "SystemExit"),
    ("generator_exit", "raise GeneratorExit('closed')", "ALGO", "GeneratorExit: closed"),
    (
        "custom_base_exception",
        "class LicenseExpired(BaseException):\n    pass\nraise LicenseExpired('seat limit')",
        "ALGO",
        "LicenseExpired: seat limit",
    ),
    ("exception", "raise RuntimeError('bad config')", "ALGO", "RuntimeError: bad config"),
    ("missing_attribute", "X = 1", "ALGO", "AttributeError: .*'ALGO'"),
    (
        "factory_exits",
        "def make():\n    raise SystemExit('factory refused')",
        "make",
        "SystemExit: factory refused",
    ),
]


@pytest.mark.parametrize(
    ("module", "source", "attr", "raised"), BROKEN_PLUGINS, ids=[row[0] for row in BROKEN_PLUGINS]
)
def test_any_plugin_exception_is_a_plugin_load_error(
    plugin_module: types.ModuleType,
    plugin_files: Callable[[str, str], None],
    module: str,
    source: str,
    attr: str,
    raised: str,
) -> None:
    """SystemExit, GeneratorExit and custom BaseExceptions are reported like Exceptions,
    atomically."""
    plugin_files(module, source)
    registry = Registry(BUILTINS)
    with pytest.raises(
        PluginLoadError,
        match=rf"^plugin 'broken' \({module}:{attr}\) in group 'specstrat.algorithms' failed to "
        rf"load: {raised}; fix or uninstall it \(no plugin was registered\)$",
    ) as info:
        registry.load_entry_points([ep("good", "GOOD"), ep("broken", attr, module)])
    assert isinstance(info.value.__cause__, BaseException)
    assert registry.names() == tuple(a.name for a in BUILTINS)  # all or nothing


def test_keyboard_interrupt_in_a_plugin_propagates(
    plugin_module: types.ModuleType, plugin_files: Callable[[str, str], None]
) -> None:
    """Ctrl-C during plugin import is not a plugin failure: it propagates and registers nothing."""
    plugin_files("interrupted_plugin", "raise KeyboardInterrupt('simulated Ctrl-C')")
    registry = Registry()
    with pytest.raises(KeyboardInterrupt, match="simulated Ctrl-C"):
        registry.load_entry_points([ep("good", "GOOD"), ep("ctrl_c", "ALGO", "interrupted_plugin")])
    assert registry.names() == ()


def test_builtin_names_work_while_a_plugin_is_broken(
    plugin_files: Callable[[str, str], None], installed_plugins: Callable[..., Registry]
) -> None:
    """specstrat.get('EAGLE') answers from the built-ins without loading the broken plugin."""
    plugin_files("exits_plugin", "raise SystemExit(3)")
    installed_plugins(broken="exits_plugin:ALGO")
    assert specstrat.get("EAGLE") is specstrat.EAGLE
    assert specstrat.get("dspark") is specstrat.DSPARK


@pytest.mark.parametrize(
    "lookup",
    [
        lambda: specstrat.get("MINE"),
        specstrat.names,
        lambda: specstrat.register(make("MINE")),
    ],
    ids=["get_other_name", "names", "register"],
)
def test_lookups_that_need_plugins_name_the_broken_one(
    plugin_files: Callable[[str, str], None],
    installed_plugins: Callable[..., Registry],
    lookup: Callable[[], object],
) -> None:
    """A non-built-in name, names() and register() raise the broken plugin's PluginLoadError."""
    plugin_files("exits_plugin", "raise SystemExit(3)")
    installed_plugins(broken="exits_plugin:ALGO")
    with pytest.raises(
        PluginLoadError, match=r"plugin 'broken' \(exits_plugin:ALGO\) .* SystemExit: 3;"
    ) as info:
        lookup()
    assert isinstance(info.value.__cause__, SystemExit)


def test_non_string_name_is_refused_before_plugins(
    plugin_files: Callable[[str, str], None], installed_plugins: Callable[..., Registry]
) -> None:
    """get(42) raises InvalidConfig naming the value, not the broken plugin's error."""
    plugin_files("exits_plugin", "raise SystemExit(3)")
    installed_plugins(broken="exits_plugin:ALGO")
    with pytest.raises(InvalidConfig, match=r"name=42 must be a str such as 'EAGLE'"):
        specstrat.get(42)  # type: ignore[arg-type]


def test_fixed_plugin_loads_on_the_next_lookup(
    plugin_module: types.ModuleType,
    plugin_files: Callable[[str, str], None],
    installed_plugins: Callable[..., Registry],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the broken plugin is fixed, the next lookup registers every plugin."""
    plugin_files("exits_plugin", "raise SystemExit(3)")
    registry = installed_plugins(good="fake_specstrat_plugin:GOOD", broken="exits_plugin:ALGO")
    with pytest.raises(PluginLoadError, match=r"plugin 'broken'"):
        specstrat.get("PLUGGED")
    plugin_files("exits_plugin", "from fake_specstrat_plugin import OTHER as ALGO")
    assert specstrat.get("PLUGGED") is plugin_module.GOOD
    assert registry.names()[-2:] == ("PLUGGED", "PLUGGED_TOO")


def test_origin_names_built_ins_plugins_and_registering_modules(
    plugin_module: types.ModuleType,
) -> None:
    """origin() says built-in, the plugin's entry point (no distribution here), or the module
    that holds an algorithm registered by hand."""
    registry = Registry(BUILTINS)
    registry.load_entry_points([ep("a", "GOOD")])
    assert registry.origin("eagle") == "built-in"
    assert registry.origin("PLUGGED") == (
        f"plugin a ({plugin_module.__name__}:GOOD) from an unknown distribution"
    )
    registry.register(ORIGIN_ALGO)
    assert registry.origin("BY_HAND") == f"registered by {__name__}"
    registry.register(make("LOOSE"))
    assert registry.origin("loose") == "registered at run time"


def test_a_failed_discovery_leaves_no_plugin_origin(plugin_module: types.ModuleType) -> None:
    """A discovery that fails records no origin: the name, registered later by hand, is not
    called a plugin."""
    registry = Registry(BUILTINS)
    with pytest.raises(PluginLoadError, match=r"plugin 'broken'"):
        registry.load_entry_points([ep("a", "GOOD"), ep("broken", "ALGO", "no_such_module_xyz")])
    registry.register(plugin_module.GOOD)
    assert registry.origin("PLUGGED") == f"registered by {plugin_module.__name__}"
