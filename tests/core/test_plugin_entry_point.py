"""The README's plugin pattern, found through real entry-point discovery in a fresh process.

A throwaway distribution (a package plus its ``.dist-info`` with ``entry_points.txt``) is put on
``sys.path`` of a subprocess, so ``importlib.metadata`` discovers it as it would an installed one.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: The README's plugin module, word for word.
PLUGIN_MODULE = """\
# mypkg/algos.py
from dataclasses import replace

import specstrat
from specstrat.builtins import NGRAM

MY_LOOKUP = specstrat.register(replace(NGRAM, name="MY_LOOKUP"))
"""

#: The README's entry-point declaration, word for word.
PLUGIN_PYPROJECT = """\
# pyproject.toml of mypkg
[project.entry-points."specstrat.algorithms"]
my_lookup = "mypkg.algos:MY_LOOKUP"
"""


def entry_points_txt(pyproject: str) -> str:
    """What pip writes to ``entry_points.txt`` for the ``[project.entry-points.*]`` tables."""
    lines = []
    for line in pyproject.splitlines():
        if line.startswith('[project.entry-points."'):
            lines.append("[" + line.split('"')[1] + "]")
        elif " = " in line:
            name, value = line.split(" = ")
            lines.append(f"{name} = " + value.strip('"'))
    return "\n".join(lines) + "\n"


def install(root: Path, module: str = PLUGIN_MODULE, pyproject: str = PLUGIN_PYPROJECT) -> Path:
    """Lay ``mypkg`` and its distribution metadata out under ``root``, as pip would."""
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "algos.py").write_text(module)
    info = root / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points_txt(pyproject))
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with ``root`` on the path and the caller's other paths kept."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *sys.path])
    return subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    """The README's plugin, installed as a throwaway distribution."""
    return install(tmp_path)


def test_list_shows_the_plugin(plugin: Path) -> None:
    """``specstrat list`` loads the plugin, whose module registers itself, without a cycle."""
    done = run(plugin, "-m", "specstrat", "list")
    assert done.returncode == 0, done.stderr
    assert "MY_LOOKUP" in done.stdout
    assert "partially initialized" not in done.stderr
    block = done.stdout[done.stdout.index("MY_LOOKUP") :]
    assert re.search(
        r"\n  origin +plugin my_lookup \(mypkg\.algos:MY_LOOKUP\) from mypkg 0\.1", block
    )
    assert done.stdout.count("origin         built-in") == 7


def test_check_takes_the_plugins_name(plugin: Path) -> None:
    """``specstrat check MY_LOOKUP`` finds the plugin by its registered name and passes it."""
    done = run(plugin, "-m", "specstrat", "check", "--no-mypy", "my_lookup")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout


def test_get_and_later_register_work(plugin: Path) -> None:
    """``get`` finds the plugin, and a later ``register`` is not broken by it."""
    code = (
        "from dataclasses import replace\n"
        "import specstrat\n"
        "algo = specstrat.get('my_lookup')\n"
        "print(algo.name)\n"
        "specstrat.register(replace(algo, name='ANOTHER'))\n"
        "print(specstrat.names().count('MY_LOOKUP'), 'ANOTHER' in specstrat.names())\n"
    )
    done = run(plugin, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["MY_LOOKUP", "1", "True"]


def test_importing_the_plugin_module_first_works(plugin: Path) -> None:
    """Importing the plugin module directly registers it once; discovery then agrees."""
    code = (
        "import mypkg.algos\n"
        "import specstrat\n"
        "print(specstrat.get('MY_LOOKUP') is mypkg.algos.MY_LOOKUP, "
        "specstrat.names().count('MY_LOOKUP'))\n"
    )
    done = run(plugin, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1"]


def test_demo_runs_the_plugin(plugin: Path) -> None:
    """``specstrat demo --algo MY_LOOKUP`` runs the plugin on the embedded models, lossless."""
    done = run(plugin, "-m", "specstrat", "demo", "--algo", "MY_LOOKUP", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert "MY_LOOKUP" in done.stdout


def test_a_broken_plugin_rolls_back_the_others(tmp_path: Path) -> None:
    """A second plugin that fails leaves no registration of the first behind, and says so."""
    install(tmp_path)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    info = tmp_path / "mypkg-0.1.dist-info" / "entry_points.txt"
    info.write_text(info.read_text() + "zz_broken = broken:X\n")
    code = (
        "import specstrat\n"
        "from specstrat.registry import default_registry\n"
        "try:\n"
        "    specstrat.names()\n"
        "except specstrat.PluginLoadError as exc:\n"
        "    print('error:', exc)\n"
        "print('MY_LOOKUP' in default_registry().names())\n"
    )
    done = run(tmp_path, "-c", code)
    assert done.returncode == 0, done.stderr
    assert "'zz_broken' (broken:X)" in done.stdout
    assert "RuntimeError: boom" in done.stdout
    assert done.stdout.split()[-1] == "False"
