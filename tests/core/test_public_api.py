"""The public surface: __all__ lists exactly the public names, and the error tree's bases."""

import ast
import importlib
from dataclasses import fields
from pathlib import Path

import pytest

import specstrat
from specstrat import errors, runtime
from specstrat.relay import RELAY_FIELDS, RelayPayload

ROOT = Path(specstrat.__file__).resolve().parent


def _public_modules() -> tuple[list[str], set[str]]:
    """Every module of the package whose dotted path has no private part, and the packages
    among them; found from the files, importing nothing."""
    names, packages = [], set()
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        parts = parts[:-1] if is_package else parts
        if any(p.startswith("_") for p in parts) or parts[-1] == "__main__":
            continue
        names.append(".".join(parts))
        if is_package:
            packages.add(".".join(parts))
    return names, packages


PUBLIC_MODULES, PACKAGES = _public_modules()


def _defined(name: str) -> set[str]:
    """The public names a module binds at its top level: its classes, functions and constants,
    and names it re-exports explicitly (``import X as X``); not the names it merely imports."""
    module = importlib.import_module(name)
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                found.update(t.id for t in names if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            found.update(a.name for a in node.names if a.asname == a.name)
    return {n for n in found if not n.startswith("_")}


def test_the_walk_finds_the_public_layout() -> None:
    """The discovered public modules include the packages and the root modules, and no
    private module."""
    for name in ("specstrat.runtime", "specstrat.testing", "specstrat.demo", "specstrat.drafting"):
        assert name in PUBLIC_MODULES
    for name in ("specstrat.runtime._step", "specstrat.runtime.worker", "specstrat.runtime.demo"):
        assert name not in PUBLIC_MODULES


def test_the_runtime_exports_exactly_its_public_line() -> None:
    """specstrat.runtime exports the engine, its inputs and outputs, what the packages above it
    need of it (the disaggregated run's loader type, the embedded workload, next-token logits,
    the decode-step timing and profiling hooks and the forward timer the bench reads, the KV
    reservation a run needs, the acceptance rates by position its statistics and the bench's
    rows share), and nothing internal."""
    assert sorted(runtime.__all__) == sorted(
        [
            "Engine",
            "EngineConfig",
            "Request",
            "RunStats",
            "TransferBatch",
            "EmbeddedModels",
            "EMBEDDED_WEIGHTS",
            "ForwardMode",
            "run_disaggregated",
            "ModelLoader",
            "workload",
            "next_token_logits",
            "StepTimer",
            "timed_decode_steps",
            "profiled_decode_steps",
            "DECODE_STEP_SCOPE",
            "FORWARD_SCOPE",
            "ATTENTION_SCOPE",
            "forward_seconds",
            "KVReservation",
            "kv_reservation",
            "acceptance_rates",
        ]
    )


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_equals_public_names(name: str) -> None:
    """__all__ equals what the module defines (or, for a package, re-exports), no more, no
    less."""
    module = importlib.import_module(name)
    declared = set(module.__all__)
    assert all(hasattr(module, n) for n in declared)
    if name in PACKAGES:
        public = {
            n
            for n, obj in vars(module).items()
            if not n.startswith("_") and not isinstance(obj, type(importlib))
        }
        assert declared - {"__version__"} == public - {"TYPE_CHECKING"}
    else:
        assert declared == _defined(name)


@pytest.mark.parametrize(
    ("error", "base"),
    [
        (errors.InvalidConfig, ValueError),
        (errors.RelayError, errors.StrategyError),
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
