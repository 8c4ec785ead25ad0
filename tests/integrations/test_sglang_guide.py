"""The SGLang guide (docs/guides/sglang.md) runs as written against the real SGLang."""

import importlib
import re
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib

from specstrat.cli import main
from tests.integrations.sglang_standins import StandInWorker
from tests.typing.readme_example import MY_EAGLE

SECTION = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "sglang.md").read_text()


def blocks(language: str) -> list[str]:
    """The guide's fenced code blocks in ``language``, in order."""
    return re.findall(rf"```{language}\n(.*?)```", SECTION, flags=re.DOTALL)


def test_the_two_registration_lines_register_my_eagle(enum: Any) -> None:
    """The first Python block registers MY_EAGLE, found by --speculative-algorithm's lookup."""
    code = blocks("python")[0]
    assert "register(MY_EAGLE, worker=MyEagleWorker)" in code
    exec(code, {"MY_EAGLE": MY_EAGLE, "MyEagleWorker": StandInWorker})
    assert enum.from_string("MY_EAGLE").specstrat.algorithm is MY_EAGLE


def test_the_plugin_snippet_loads_through_sglang(
    monkeypatch: pytest.MonkeyPatch, enum: Any
) -> None:
    """The plugin module and the pyproject entry point register MY_EAGLE via load_plugins()."""
    module = ModuleType("mypkg.sglang_plugin")
    module.__dict__.update(MY_EAGLE=MY_EAGLE, MyEagleWorker=StandInWorker)
    exec(blocks("python")[1], module.__dict__)
    monkeypatch.setitem(sys.modules, "mypkg", ModuleType("mypkg"))
    monkeypatch.setitem(sys.modules, "mypkg.sglang_plugin", module)
    plugins = importlib.import_module("sglang.srt.plugins")
    table = tomllib.loads(blocks("toml")[0])["project"]["entry-points"]
    group = plugins.GENERAL_PLUGINS_GROUP
    found = [EntryPoint(name, value, group) for name, value in table[group].items()]
    monkeypatch.setattr(
        plugins,
        "entry_points",
        lambda group: found if group == plugins.GENERAL_PLUGINS_GROUP else [],
    )
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    plugins.load_plugins()
    assert enum.from_string("MY_EAGLE").specstrat.algorithm is MY_EAGLE


def test_the_check_output_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """The guide's `check --sglang` transcript is the command's output, line for line."""
    transcript = re.findall(r"```\n(\$ .*?)```", SECTION, flags=re.DOTALL)[0]
    command, *expected = transcript.splitlines()
    assert command.endswith("specstrat check --sglang tests.typing.readme_example:MY_EAGLE")
    assert main(["check", "--sglang", "tests.typing.readme_example:MY_EAGLE"]) == 0
    assert capsys.readouterr().out.splitlines() == expected
