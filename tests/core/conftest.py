"""Fixtures for plugin tests: importable plugin modules and a fake set of installed entry points."""

import sys
import textwrap
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from specstrat import BUILTINS, ENTRY_POINT_GROUP, Registry
from specstrat import registry as registry_module


@pytest.fixture
def plugin_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], None]]:
    """Writes a plugin module ``(name, source)`` that imports from a temporary directory."""
    written: list[str] = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def installed_plugins(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Registry]:
    """Installs entry points ``name="module:attr"`` behind a fresh default registry, returned."""

    def install(**values: str) -> Registry:
        found = [EntryPoint(name=k, value=v, group=ENTRY_POINT_GROUP) for k, v in values.items()]
        monkeypatch.setattr(
            registry_module,
            "entry_points",
            lambda group: found if group == ENTRY_POINT_GROUP else [],
        )
        registry = Registry(BUILTINS)
        monkeypatch.setattr(registry_module, "_DEFAULT", registry)
        return registry

    return install
