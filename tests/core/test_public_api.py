"""The public surface: __all__ lists exactly the public names, and the error tree's bases."""

import importlib
import pkgutil
from dataclasses import fields

import pytest

import specstrat
from specstrat import errors
from specstrat.relay import RELAY_FIELDS, RelayPayload


def _public_modules() -> tuple[list[str], set[str]]:
    """Every module of the package whose dotted path has no private part, and the packages."""
    names, packages = ["specstrat"], {"specstrat"}
    for info in pkgutil.walk_packages(specstrat.__path__, "specstrat."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
        if info.ispkg:
            packages.add(info.name)
    return names, packages


PUBLIC_MODULES, PACKAGES = _public_modules()


def test_the_walk_finds_the_runtime_layout() -> None:
    """The discovered public modules include the rebuilt runtime's parts."""
    for name in ("specstrat.runtime.step", "specstrat.runtime.disagg.wire", "specstrat.contracts"):
        assert name in PUBLIC_MODULES


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_equals_public_names(name: str) -> None:
    """__all__ lists what the module defines (or, for a package, re-exports), and nothing else."""
    module = importlib.import_module(name)
    declared = set(module.__all__)
    assert all(hasattr(module, n) for n in declared)
    if name in PACKAGES:
        public = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_") and not isinstance(obj, type(importlib))
        }
        assert declared - {"__version__"} == public
    else:
        defined = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_") and getattr(obj, "__module__", None) == name
        }
        assert defined <= declared


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_objects_have_docstrings(name: str) -> None:
    """Every public class and function in __all__ carries a docstring."""
    module = importlib.import_module(name)
    assert module.__doc__
    for attr in module.__all__:
        obj = getattr(module, attr)
        if callable(obj) and getattr(obj, "__module__", "").startswith("specstrat"):
            assert obj.__doc__, f"{name}.{attr} has no docstring"


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (errors.InvalidConfig, ValueError),
        (errors.RelayError, errors.InvalidConfig),
        (errors.RegistrationError, errors.InvalidConfig),
        (errors.InvalidStrategy, TypeError),
        (errors.UnknownAlgorithm, KeyError),
        (errors.PluginLoadError, ImportError),
        (errors.KernelError, RuntimeError),
        (errors.DisaggError, RuntimeError),
        (errors.ConformanceError, AssertionError),
        (errors.StrategyError, RuntimeError),
        (errors.EngineStateError, RuntimeError),
        (errors.ModelShapeError, RuntimeError),
        (errors.CapacityError, RuntimeError),
        (errors.InternalError, RuntimeError),
    ],
)
def test_error_tree(error: type, base: type) -> None:
    """Each error is a SpecstratError and also the builtin exception plain code catches."""
    assert issubclass(error, errors.SpecstratError)
    assert issubclass(error, base)


@pytest.mark.parametrize(
    "error", [errors.CapacityError, errors.InternalError, errors.ModelShapeError]
)
def test_mid_run_errors_are_not_invalid_config(error: type) -> None:
    """What goes wrong mid-run is not blamed on a value the caller passed."""
    assert not issubclass(error, errors.InvalidConfig)


def test_the_error_tree_in_the_docstring_names_every_error() -> None:
    """errors.py's docstring draws every class it exports."""
    assert errors.__doc__ is not None
    for name in errors.__all__:
        assert name in errors.__doc__, name


def test_unknown_algorithm_message_is_not_repr_quoted() -> None:
    """str(UnknownAlgorithm) shows the message as written (KeyError would quote it)."""
    assert str(errors.UnknownAlgorithm("no algorithm named 'X'")) == "no algorithm named 'X'"


def test_relay_fields_follow_the_payload_dataclass() -> None:
    """RELAY_FIELDS lists RelayPayload's fields in order, so the kernel and the map agree."""
    assert [f.name for f in fields(RelayPayload)] == list(RELAY_FIELDS)


def test_version_is_exposed() -> None:
    """specstrat.__version__ is a version string."""
    assert specstrat.__version__.count(".") == 2
