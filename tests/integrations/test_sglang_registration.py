"""Registering specstrat algorithms in the real SGLang 0.5.23 registry."""

import importlib
import importlib.abc
import sys
from importlib.metadata import EntryPoint
from typing import Any

import pytest
import torch

from specstrat import (
    DSPARK,
    EAGLE,
    NONE,
    InvalidConfig,
    InvalidStrategy,
    RegistrationError,
    UnknownAlgorithm,
)
from specstrat.integrations._sglang_import import import_sglang_module
from specstrat.integrations.sglang import (
    IntegrationError,
    SpecstratSpecAlgo,
    plugin,
    register,
    registered,
    unregister,
)
from specstrat.relay import RelayPayload
from tests.integrations.sglang_standins import HAVE_SGLANG, USER_DRAFT, StandInWorker
from tests.typing.readme_example import MY_EAGLE


def test_register_then_from_string_finds_the_adapter(enum: Any) -> None:
    """register() goes through SGLang's API; from_string (any case) returns the same object."""
    spec: Any = register(MY_EAGLE, worker=StandInWorker)
    assert enum.from_string("my_eagle") is spec
    assert isinstance(
        spec, importlib.import_module("sglang.srt.speculative.spec_registry").CustomSpecAlgo
    )
    assert SpecstratSpecAlgo in type(spec).__mro__  # (isinstance would narrow Any for mypy)
    assert spec.specstrat.algorithm is MY_EAGLE
    assert spec.name == "MY_EAGLE"
    assert spec.supports_overlap is MY_EAGLE.capabilities.supports_overlap
    assert spec.factory(None) is StandInWorker
    assert registered("MY_EAGLE") is spec


def test_register_under_a_prefixed_name_and_a_worker_factory(enum: Any) -> None:
    """name= overrides the algorithm's name; a factory is called with SGLang's server_args."""
    seen: list[object] = []

    def factory(server_args: object) -> type:
        seen.append(server_args)
        return StandInWorker

    spec = register(EAGLE, worker=factory, name="specstrat_eagle")
    assert enum.from_string("SPECSTRAT_EAGLE") is spec
    assert spec.factory("args") is StandInWorker
    assert seen == ["args"]


def test_validate_server_args_reaches_sglang() -> None:
    """validate_server_args is what SGLang's handle_speculative_decoding will call."""

    def validate(server_args: object) -> None:
        return None

    spec = register(MY_EAGLE, worker=StandInWorker, validate_server_args=validate)
    assert spec.validate_server_args is validate


def reserved_names() -> list[str]:
    """SGLang's built-in names and its NEXTN alias, read from the installed package."""
    if not HAVE_SGLANG:
        return ["SGLANG_NOT_INSTALLED"]  # the autouse fixture skips it, saying why
    spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
    return [*spec_info.SpeculativeAlgorithm.__members__, "NEXTN", "eagle"]


@pytest.mark.parametrize("name", reserved_names())
def test_reserved_names_are_refused_naming_the_clash(
    name: str, sglang_registry: dict[str, Any]
) -> None:
    """Every SGLang built-in name (and NEXTN) is refused with a RegistrationError naming it."""
    with pytest.raises(
        RegistrationError,
        match=(
            rf"name='{name}' clashes with SGLang's (built-in|alias) "
            rf"{name.upper()}.*SPECSTRAT_{name.upper()}"
        ),
    ):
        register(MY_EAGLE, worker=StandInWorker, name=name)
    assert name.upper() not in sglang_registry


def test_a_name_registered_twice_is_refused() -> None:
    """A second registration under a taken name is a RegistrationError naming it."""
    register(MY_EAGLE, worker=StandInWorker)
    with pytest.raises(RegistrationError, match=r"name='my_eagle' is already registered in SGLang"):
        register(MY_EAGLE, worker=StandInWorker, name="my_eagle")


def test_plain_decoding_is_not_registered() -> None:
    """NONE is refused: SGLang decodes plainly without --speculative-algorithm."""
    with pytest.raises(RegistrationError, match=r"NONE is not speculative"):
        register(NONE, worker=StandInWorker, name="SPECSTRAT_NONE")


def test_only_spec_algorithms_register() -> None:
    """Anything but a SpecAlgorithm is refused by type."""
    with pytest.raises(RegistrationError, match=r"algo='EAGLE' is a str"):
        register("EAGLE", worker=StandInWorker)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"worker": 3}, r"worker=3 is neither a worker class nor a factory"),
        ({"worker": StandInWorker, "name": ""}, r"name='' must be a non-empty str"),
    ],
)
def test_bad_worker_or_name_is_refused(kwargs: dict[str, Any], message: str) -> None:
    """A worker that is no class or factory, or an empty name, is an InvalidConfig."""
    with pytest.raises(InvalidConfig, match=message):
        register(DSPARK, name=kwargs.pop("name", "SPECSTRAT_DSPARK"), **kwargs)


def test_a_user_draft_type_needs_to_spec_input_at_registration(
    sglang_registry: dict[str, Any],
) -> None:
    """A non-built-in disagg builder without to_spec_input is refused before SGLang sees it."""
    with pytest.raises(
        InvalidStrategy, match=r"USER_DRAFT: disagg=UserDisaggDraftBuilder .* pass to_spec_input=f"
    ):
        register(USER_DRAFT, worker=StandInWorker)
    assert "USER_DRAFT" not in sglang_registry
    with pytest.raises(InvalidStrategy, match=r"to_spec_input=3 is not callable"):
        register(USER_DRAFT, worker=StandInWorker, to_spec_input=3)  # type: ignore[arg-type]
    spec = register(USER_DRAFT, worker=StandInWorker, to_spec_input=lambda draft: draft)
    assert spec.specstrat.to_spec_input is not None


def test_unregister_removes_only_specstrat_entries(enum: Any) -> None:
    """unregister() removes an adapter; unknown names and other plugins' entries are refused."""
    register(MY_EAGLE, worker=StandInWorker)
    unregister("my_eagle")
    with pytest.raises(ValueError, match=r"Unknown speculative algorithm name: MY_EAGLE"):
        enum.from_string("MY_EAGLE")
    with pytest.raises(UnknownAlgorithm, match=r"no plugin algorithm named 'MY_EAGLE'"):
        unregister("MY_EAGLE")
    enum.register("OTHER_PLUGIN")(lambda server_args: StandInWorker)
    with pytest.raises(
        RegistrationError, match=r"name='OTHER_PLUGIN' was registered by another plugin"
    ):
        unregister("OTHER_PLUGIN")


def test_plugin_registers_through_sglangs_load_plugins(
    monkeypatch: pytest.MonkeyPatch, enum: Any
) -> None:
    """SGLang's own load_plugins() runs the plugin from the sglang.srt.plugins group."""
    plugins = importlib.import_module("sglang.srt.plugins")
    module = type(sys)("specstrat_test_sglang_plugin")
    module.REGISTER = plugin(MY_EAGLE, worker=StandInWorker)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    found = [EntryPoint("my_eagle", f"{module.__name__}:REGISTER", plugins.GENERAL_PLUGINS_GROUP)]
    monkeypatch.setattr(
        plugins,
        "entry_points",
        lambda group: found if group == plugins.GENERAL_PLUGINS_GROUP else [],
    )
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    plugins.load_plugins()
    spec = enum.from_string("MY_EAGLE")
    assert spec.specstrat.algorithm is MY_EAGLE
    module.REGISTER()  # a second call in the same process changes nothing
    assert enum.from_string("MY_EAGLE") is spec


def test_plugin_validates_its_algorithms_when_made() -> None:
    """plugin() refuses what register() would, before SGLang loads it."""
    with pytest.raises(InvalidStrategy, match=r"USER_DRAFT: disagg=UserDisaggDraftBuilder"):
        plugin(USER_DRAFT, worker=StandInWorker)
    with pytest.raises(RegistrationError, match=r"NONE is not speculative"):
        plugin(NONE, worker=StandInWorker)
    with pytest.raises(InvalidConfig, match=r"worker=None is neither"):
        plugin(MY_EAGLE, worker=None)  # type: ignore[arg-type]


def test_missing_sglang_is_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SGLang every entry point raises IntegrationError saying how to install it."""
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(
        IntegrationError, match=r"SGLang is not installed .*pip install --no-deps sglang==0\.5\.23"
    ):
        register(MY_EAGLE, worker=StandInWorker)
    assert isinstance(IntegrationError("x"), ImportError)


class MissingDependencyFinder(importlib.abc.MetaPathFinder):
    """Fails the import of one SGLang module the way a missing dependency of it would."""

    target = "sglang.srt.specstrat_test_needs_transformers"

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == self.target:
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        return None


def test_a_missing_sglang_dependency_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An SGLang module failing on a missing dependency names that dependency."""
    monkeypatch.setattr(sys, "meta_path", [MissingDependencyFinder(), *sys.meta_path])
    with pytest.raises(IntegrationError, match=r"module 'transformers' it needs is missing"):
        import_sglang_module(MissingDependencyFinder.target)


def test_the_relay_payload_types_stay_apart() -> None:
    """specstrat's RelayPayload is not SGLang's: the adapter builds SGLang's for SGLang."""
    ours = RelayPayload(bonus_tokens=torch.tensor([1]))
    theirs = importlib.import_module("sglang.srt.managers.overlap_utils").RelayPayload
    assert not isinstance(ours, theirs)


def test_a_refusal_by_sglang_itself_is_a_registration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What SGLang's register raises past specstrat's own checks comes back named."""
    spec_registry = importlib.import_module("sglang.srt.speculative.spec_registry")

    def refuse(spec_class: type) -> None:
        raise TypeError(f"{spec_class.__name__} is missing duck-typed methods")

    monkeypatch.setattr(spec_registry, "_assert_custom_spec_algo_conforms", refuse)
    with pytest.raises(
        RegistrationError,
        match=r"SGLang refused name='MY_EAGLE': TypeError: SpecstratSpecAlgo_MY_EAGLE is missing",
    ):
        register(MY_EAGLE, worker=StandInWorker)
