"""``specstrat check``: the conformance kit and mypy on a user's algorithm (``MODULE:ATTR`` or a
registered name, plugins included), and the ``MODULE:ATTR`` loader the other commands share."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from specstrat import registry
from specstrat._module_attr import not_a
from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import UnknownAlgorithm
from specstrat.testing.conformance import run_conformance

__all__ = ["check_command", "load_target"]


def load_target(spec: str, command: str = "check") -> tuple[Any, Path | None]:
    """Import ``MODULE:ATTR`` (the current directory is importable) and find its source file."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(
            f"specstrat {command}: {spec!r} is not MODULE:ATTR (e.g. mypkg.algos:MY_ALGO)"
        )
    # The current directory stays importable: `demo --disagg` spawns a prefill process that
    # imports the module again from the same sys.path to unpickle the algorithm.
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        where = ""
        if isinstance(exc, ModuleNotFoundError) and module_name.startswith(str(exc.name)):
            where = (
                f" (MODULE is imported from the current directory, {Path.cwd()}, and sys.path: "
                "run from the directory that holds it or add that directory to PYTHONPATH)"
            )
        raise SystemExit(
            f"specstrat {command}: importing {module_name!r} failed: {type(exc).__name__}: "
            f"{exc}{where}"
        ) from exc
    if not hasattr(module, attr):
        found = [k for k, v in vars(module).items() if isinstance(v, SpecAlgorithm)]
        raise SystemExit(
            f"specstrat {command}: module {module_name!r} has no attribute {attr!r}; its "
            f"SpecAlgorithms: {', '.join(found) or 'none'}"
        )
    source = getattr(module, "__file__", None)
    return getattr(module, attr), Path(source) if source else None


#: ``--cache-dir`` os.devnull: mypy writes no ``.mypy_cache`` into the user's directory.
_MYPY_FLAGS = ("--strict", "--no-error-summary", "--cache-dir", os.devnull)


def _mypy(path: Path) -> tuple[bool, str]:
    """mypy --strict on the user's module, seeing this specstrat as an installed package."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    # mypy finds installed packages on the interpreter's sys.path and silences errors inside them
    # (PEP 561; specstrat ships py.typed), so only the user's module is judged, under the user's
    # config. An editable install (a meta-path finder) or a checkout is not on sys.path: found any
    # other way, specstrat's own modules are checked too, and without this repository's mypy.ini
    # Triton's missing stubs fail them. site-packages is on sys.path already and must not move
    # ahead of the standard library.
    if not {"site-packages", "dist-packages"} & set(root.parts):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    # A fresh process: mypy reads the interpreter's search path once per process and caches it.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *_MYPY_FLAGS, str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _target(spec: str) -> tuple[Any, Path | None]:
    """``MODULE:ATTR``, or a registered name (plugins loaded) with the file of the first module
    other than the top-level package that holds it."""
    if ":" in spec:
        return load_target(spec)
    try:
        algo = registry.get(spec)  # installed plugins are loaded first
    except UnknownAlgorithm as exc:
        message = f"specstrat check: {exc}; or pass MODULE:ATTR (e.g. mypkg.algos:ALGO)"
        raise SystemExit(message) from exc
    source = getattr(registry.holding_module(algo), "__file__", None)
    return algo, Path(source) if source else None


def _check_sglang(target: str) -> int:
    """SGLang parity of MODULE:ATTR: one PASS/FAIL line per check, status 1 on any FAIL."""
    from specstrat.integrations.sglang import check_sglang  # imports SGLang: only here

    algo, _ = _target(target)
    if not isinstance(algo, SpecAlgorithm):
        raise SystemExit(
            "specstrat check --sglang: " + not_a("", target, algo, "SpecAlgorithm", SpecAlgorithm)
        )
    report = check_sglang(algo)
    for check in report.checks:
        print(check.line())
    return 0 if report.passed else 1


def check_command(args: argparse.Namespace) -> int:
    """Run ``specstrat check``: one PASS/FAIL line per check; status 1 on any FAIL."""
    if args.sglang:
        return _check_sglang(args.target)
    algo, source = _target(args.target)
    if not isinstance(algo, SpecAlgorithm) and (isinstance(algo, type) or callable(algo)):
        raise SystemExit(
            "specstrat check: " + not_a("", args.target, algo, "SpecAlgorithm", SpecAlgorithm)
        )
    failed = False
    results = run_conformance(algo)
    for result in results:
        failed |= not result.passed
        line = f"{'PASS' if result.passed else 'FAIL'} conformance: {result.name}"
        print(line if result.passed else f"{line}\n    {result.message}")
        if result.error is not None and args.traceback:  # the chain reaches the user's frames
            sys.stdout.flush()
            traceback.print_exception(result.error, file=sys.stderr)
    rule_failed = any(r.name == "acceptance" and not r.passed for r in results)
    if isinstance(algo, SpecAlgorithm) and not rule_failed:
        rule = type(algo.acceptance).__name__
        kind = "lossless" if algo.lossless else "LOSSY: it does not keep the target's distribution"
        print(f"NOTE acceptance rule {rule} is {kind}")
    if args.mypy:
        if source is None:
            print("FAIL mypy: the module has no source file to check")
            failed = True
        else:
            ok, report = _mypy(source)
            failed |= not ok
            print(f"{'PASS' if ok else 'FAIL'} mypy --strict {source}")
            if not ok:
                print("\n".join(f"    {line}" for line in report.splitlines()))
    return 1 if failed else 0
