"""The specstrat command: list, check (conformance + mypy) and demo."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from specstrat import NGRAM, Registry
from specstrat.cli import main

BROKEN = """
from specstrat import Capabilities, SpecAlgorithm
from specstrat.strategies import SlotFutureMapFactory, NoDraftStateDisaggDraftBuilder
from specstrat.strategies import GreedyAcceptance, NgramDrafterFactory


class WidePolicy:
    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> float:
        return num_draft_tokens + 5.0


ALGO = SpecAlgorithm(
    name="WIDE",
    capabilities=Capabilities(),
    target_verify=WidePolicy(),
    future_map=SlotFutureMapFactory(),
    disagg=NoDraftStateDisaggDraftBuilder(),
    drafter=NgramDrafterFactory(),
    acceptance=GreedyAcceptance(),
)
"""


def test_list_prints_every_builtin_with_strategies(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat list` shows each algorithm's strategies and capabilities."""
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("NONE", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"):
        assert f"\n{name}\n" in f"\n{out}"
    assert "EagleDisaggDraftBuilder" in out
    assert "carries_draft_hidden_states" in out
    assert out.count("drafter        BlockDrafterFactory") == 2  # DFLASH and DSPARK


GOOD_PLUGIN = (
    "import dataclasses\nimport specstrat\nALGO = "
    "dataclasses.replace(specstrat.NGRAM, name='PLUGGED')"
)
BUILTIN_NAMES = ("NONE", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")

# Installed plugins: (id, {module: source}, {entry point: value}, listed after the built-ins,
# exit status, stderr pattern). A broken plugin keeps the good one out too (all or nothing).
LIST_CASES = [
    (
        "good_plugin",
        {"good_plugin": GOOD_PLUGIN},
        {"good": "good_plugin:ALGO"},
        ["PLUGGED"],
        0,
        r"^$",
    ),
    (
        "plugin_exits",
        {"good_plugin": GOOD_PLUGIN, "exits_plugin": "raise SystemExit(3)"},
        {"good": "good_plugin:ALGO", "broken": "exits_plugin:ALGO"},
        [],
        1,
        r"^specstrat list: PluginLoadError: plugin 'broken' \(exits_plugin:ALGO\) in group "
        r"'specstrat.algorithms' failed to load: SystemExit: 3; fix or uninstall it "
        r"\(no plugin was registered\)\n$",
    ),
    (
        "multiline_message",
        {"loud_plugin": "raise RuntimeError('line one\\n  line two')"},
        {"loud": "loud_plugin:ALGO"},
        [],
        1,
        (
            r"^specstrat list: PluginLoadError: plugin "
            r"'loud' .* RuntimeError: line one line two; .*\n$"
        ),
    ),
    (
        "custom_base_exception",
        {"odd_plugin": "class Odd(BaseException):\n    pass\nraise Odd('odd')"},
        {"odd": "odd_plugin:ALGO"},
        [],
        1,
        r"^specstrat list: PluginLoadError: plugin 'odd' .* Odd: odd; .*\n$",
    ),
]


@pytest.mark.parametrize(
    ("modules", "plugins", "extra", "status", "stderr"),
    [row[1:] for row in LIST_CASES],
    ids=[row[0] for row in LIST_CASES],
)
def test_list_with_installed_plugins(
    plugin_files: Callable[[str, str], None],
    installed_plugins: Callable[..., Registry],
    capsys: pytest.CaptureFixture[str],
    modules: dict[str, str],
    plugins: dict[str, str],
    extra: list[str],
    status: int,
    stderr: str,
) -> None:
    """`specstrat list` prints what loaded; a broken plugin adds one stderr line and status 1."""
    for name, source in modules.items():
        plugin_files(name, source)
    installed_plugins(**plugins)
    assert main(["list"]) == status
    captured = capsys.readouterr()
    assert re.match(stderr, captured.err), captured.err
    listed = [line for line in captured.out.splitlines() if not line.startswith(" ")]
    assert listed == [*BUILTIN_NAMES, *extra]


def test_list_shows_registered_algorithms_while_a_plugin_is_broken(
    plugin_files: Callable[[str, str], None],
    installed_plugins: Callable[..., Registry],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An algorithm registered in-process is listed before the broken plugin's stderr line."""
    plugin_files("exits_plugin", "import sys\nsys.exit('no CUDA device')")
    registry = installed_plugins(broken="exits_plugin:ALGO")
    registry.register(dataclasses.replace(NGRAM, name="MINE"))
    assert main(["list"]) == 1
    captured = capsys.readouterr()
    assert "\nMINE\n" in captured.out
    assert captured.err.count("\n") == 1
    assert "plugin 'broken' (exits_plugin:ALGO)" in captured.err
    assert "SystemExit: no CUDA device" in captured.err


def test_check_passes_a_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat check specstrat.builtins:DSPARK` passes every check including mypy."""
    assert main(["check", "specstrat.builtins:DSPARK"]) == 0
    out = capsys.readouterr().out
    assert "PASS conformance: target_verify" in out
    assert "PASS mypy --strict" in out


@pytest.mark.slow  # 16 s of mypy; make test's own mypy pass types the example too
def test_check_passes_the_readme_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's custom algorithm passes conformance and mypy."""
    assert main(["check", "tests.typing.readme_example:MY_EAGLE"]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_check_fails_a_broken_algorithm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy returning a float fails conformance and mypy, and the exit status is 1."""
    (tmp_path / "broken_algo.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "broken_algo:ALGO"]) == 1
    out = capsys.readouterr().out
    assert "FAIL conformance: target_verify" in out
    assert "returned 6.0 (float)" in out
    assert "FAIL mypy --strict" in out
    assert "[arg-type]" in out


def test_check_takes_a_registered_name(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat check EAGLE` checks the registered algorithm, and mypy its module."""
    assert main(["check", "eagle"]) == 0
    out = capsys.readouterr().out
    assert "PASS conformance: target_verify" in out
    assert re.search(r"PASS mypy --strict .*specstrat/builtins\.py", out)


def test_check_leaves_no_mypy_cache_in_the_users_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """mypy runs without a cache: the user's directory gets no .mypy_cache."""
    (tmp_path / "user_algo.py").write_text(USER_ALGO)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "user_algo:ALGO"]) == 0, capsys.readouterr().out
    assert not (tmp_path / ".mypy_cache").exists()


def test_check_skips_mypy_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    """--no-mypy runs only the conformance kit."""
    assert main(["check", "--no-mypy", "specstrat.builtins:EAGLE"]) == 0
    assert "mypy" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", r"no algorithm named 'no_colon'.*; or pass MODULE:ATTR"),
        ("no_such_module_q:X", r"importing 'no_such_module_q' failed: ModuleNotFoundError"),
        ("specstrat.builtins:MEDUSA", r"module 'specstrat.builtins' has no attribute 'MEDUSA'"),
    ],
)
def test_check_bad_targets_exit_with_a_message(target: str, message: str) -> None:
    """Malformed or missing targets stop with a message naming them."""
    with pytest.raises(SystemExit, match=message):
        main(["check", target])


def test_check_non_algorithm_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """Checking something that is not a SpecAlgorithm fails with a reason."""
    assert main(["check", "--no-mypy", "specstrat.builtins:BUILTINS"]) == 1
    assert "not a SpecAlgorithm" in capsys.readouterr().out


def test_demo_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat demo` runs the workload and prints the summary table with lossless: yes."""
    assert main(["demo", "--algo", "ngram", "--requests", "3", "--no-overlap"]) == 0
    captured = capsys.readouterr()
    assert "NGRAM (D=4, overlap off)" in captured.out
    assert "lossless                     yes" in captured.out
    assert "3/3" in captured.err  # the tqdm bar reached every request
    assert "acceptance (unconditional)" in captured.out
    assert "acceptance (conditional)" in captured.out


def test_demo_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`specstrat demo --json` prints the summary as JSON."""
    assert main(["demo", "--algo", "EAGLE", "--requests", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["algorithm"] == "EAGLE"
    assert summary["lossless"] is True
    assert summary["num_requests"] == 2
    assert [set(r) for r in summary["requests"]] == [{"rid", "prompt_ids", "output_ids"}] * 2
    assert all(r["output_ids"] for r in summary["requests"])
    assert (summary["temperature"], summary["top_p"], summary["top_k"], summary["seed"]) == (
        0.0,
        1.0,
        0,
        0,
    )
    assert len(summary["acceptance_by_position"]) == 3  # D = 4: positions 1..3
    assert len(summary["acceptance_conditional"]) == 3
    assert summary["acceptance_rule_lossless"] is True
    assert (summary["draft_worker_verify_forwards"], summary["draft_worker_tokens_per_req"]) == (
        0,
        0,
    )  # EAGLE's draft worker runs no TARGET_VERIFY


@pytest.mark.parametrize(("algo", "t_draft"), [("DFLASH", 4), ("DSPARK", 3)])
def test_demo_json_reports_draft_worker_verify(
    algo: str, t_draft: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A block drafter's demo reports its draft-worker TARGET_VERIFY forwards and T_draft."""
    assert main(["demo", "--algo", algo, "--requests", "2", "--no-overlap", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lossless"] is True
    assert summary["draft_worker_verify_forwards"] > 0
    assert summary["draft_worker_tokens_per_req"] == t_draft


def test_demo_unknown_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --algo exits 2 with the known names."""
    assert main(["demo", "--algo", "MEDUSA", "--requests", "1"]) == 2
    assert "no algorithm named 'MEDUSA'; known: NONE, EAGLE" in capsys.readouterr().err


def test_demo_runs_an_unregistered_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    """`--algo MODULE:ATTR` runs the user's own algorithm without registering it."""
    target = "tests.typing.readme_example:MY_EAGLE"
    assert main(["demo", "--algo", target, "--requests", "2", "--no-overlap", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["algorithm"], summary["lossless"]) == ("MY_EAGLE", True)


def test_demo_refuses_what_is_not_an_algorithm() -> None:
    """`--algo MODULE:ATTR` naming something else exits with a message naming it and its type."""
    with pytest.raises(
        SystemExit, match=r"'specstrat.builtins:BUILTINS' is a tuple, not a SpecAlgorithm"
    ):
        main(["demo", "--algo", "specstrat.builtins:BUILTINS", "--requests", "1"])
    with pytest.raises(
        SystemExit, match=r"specstrat demo: module 'specstrat' has no attribute 'NOPE'"
    ):
        main(["demo", "--algo", "specstrat:NOPE", "--requests", "1"])


USER_ALGO = """
import dataclasses

import specstrat
from specstrat import SpecAlgorithm
from specstrat.strategies import EagleDraftInput

ALGO: SpecAlgorithm[EagleDraftInput] = dataclasses.replace(specstrat.EAGLE, name="TMP_ALGO")
"""

# Runs `specstrat check` the way an editable install imports specstrat: setuptools' editable
# finder sits on sys.meta_path and maps the package to its source tree, which is not on sys.path.
EDITABLE_CHECK = """
import sys
from importlib.machinery import PathFinder


class EditableFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return PathFinder.find_spec(name, [{root!r}]) if name == "specstrat" else None


sys.meta_path.insert(0, EditableFinder)
from specstrat.cli import main

sys.exit(main(["check", "user_algo:ALGO"]))
"""

REPO_ROOT = Path(__file__).resolve().parents[2]


# How the subprocess finds specstrat: its arguments, and PYTHONPATH (None: unset).
LAYOUTS = {
    "editable": (["-c", EDITABLE_CHECK.format(root=str(REPO_ROOT))], None),
    "pythonpath": (["-m", "specstrat.cli", "check", "user_algo:ALGO"], str(REPO_ROOT)),
}


@pytest.mark.parametrize(
    ("args", "pythonpath"),
    [  # the PYTHONPATH layout: 16 s of mypy, in make test-slow
        pytest.param(
            *LAYOUTS[name], id=name, marks=[pytest.mark.slow] if name != "editable" else []
        )
        for name in LAYOUTS
    ],
)
def test_check_passes_outside_the_repository(
    tmp_path: Path, args: list[str], pythonpath: str | None
) -> None:
    """From a directory without specstrat's mypy.ini, a correct algorithm passes mypy in any
    layout."""
    (tmp_path / "user_algo.py").write_text(USER_ALGO)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    report = done.stdout + done.stderr
    assert f"PASS mypy --strict {tmp_path / 'user_algo.py'}" in done.stdout, report
    assert done.returncode == 0, report


def test_demo_trace_to_an_unwritable_path_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trace into a missing directory exits 2 with a one-line message, no traceback."""
    assert main(["demo", "--requests", "1", "--trace", str(tmp_path / "missing" / "x")]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"specstrat demo: InvalidConfig: --trace '.*missing/x': its directory '.*missing' does "
        r"not exist.*\n",
        err,
    ), err


def test_demo_trace_writes_one_json_line_per_step_and_request(tmp_path: Path) -> None:
    """--trace FILE records drafts, accepted nodes, tokens and stops as JSON lines."""
    path = tmp_path / "trace.jsonl"
    assert main(["demo", "--algo", "NGRAM", "--requests", "2", "--json", "--trace", str(path)]) == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records
    keys = {"step", "rid", "width", "drafts", "parents", "accepted", "tokens", "stop"}
    assert set(records[0]) == keys
    assert {r["width"] for r in records if r["step"] > 0} == {4}  # each decode step's D


def test_demo_adaptive_reports_the_widths_it_chose(capsys: pytest.CaptureFixture[str]) -> None:
    """``demo --adaptive goodput --json`` runs NGRAM_GOODPUT losslessly and reports its
    histogram of D per step; two policies at once are refused by name."""
    assert (
        main(["demo", "--algo", "NGRAM", "--adaptive", "goodput", "--requests", "2", "--json"]) == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["algorithm"] == "NGRAM_GOODPUT"
    assert summary["lossless"] is True
    assert set(summary["width_histogram"]) <= {"1", "2", "3", "4"}
    assert len(summary["width_histogram"]) > 1  # goodput profiles each D first
    assert main(["demo", "--adaptive", "ema", "--adaptive", "fixed"]) == 2
    assert "--adaptive given 2 times (ema, fixed); demo runs one policy" in capsys.readouterr().err


def test_check_says_whether_the_acceptance_rule_is_lossless(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`specstrat check` prints a note naming the rule and whether it is lossless."""
    assert main(["check", "specstrat.builtins:EAGLE", "--no-mypy"]) == 0
    assert "NOTE acceptance rule RejectionSamplingAcceptance is lossless" in capsys.readouterr().out


def test_demo_topk_and_steps_set_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    """--topk/--steps verify a top-k tree; --json reports topk, num_steps, num_draft_tokens."""
    argv = ["demo", "--algo", "EAGLE", "--topk", "2", "--steps", "3", "--draft-tokens", "5"]
    assert main([*argv, "--requests", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["topk"], summary["num_steps"], summary["num_draft_tokens"]) == (2, 3, 5)
    assert summary["lossless"] is True


def test_demo_without_tree_flags_is_a_chain(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --topk/--steps the demo drafts a chain: topk 1, D - 1 steps."""
    assert main(["demo", "--algo", "EAGLE", "--requests", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["topk"], summary["num_steps"], summary["num_draft_tokens"]) == (1, 3, 4)


def test_demo_refuses_a_tree_for_a_chain_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    """--topk 2 with prompt lookup exits 2, naming the drafter that drafts chains only."""
    assert main(["demo", "--algo", "NGRAM", "--topk", "2", "--requests", "1"]) == 2
    assert "NGRAM.drafter (NgramDrafterFactory) drafts chains only" in capsys.readouterr().err


def test_demo_refuses_a_budget_the_tree_cannot_fill(capsys: pytest.CaptureFixture[str]) -> None:
    """--draft-tokens 8 with topk 2 and 2 steps exits 2, naming the budget and the shape."""
    argv = ["demo", "--topk", "2", "--steps", "2", "--draft-tokens", "8", "--requests", "1"]
    assert main(argv) == 2
    assert "tokens_per_req=8 needs 7 draft nodes but topk=2, num_steps=2" in capsys.readouterr().err


def test_demo_tree_flags_need_a_budget_of_two() -> None:
    """--topk with --draft-tokens 1 exits naming the budget the tree needs, not a derived value."""
    with pytest.raises(SystemExit, match=r"a tree needs --draft-tokens >= 2"):
        main(["demo", "--topk", "2", "--draft-tokens", "1", "--requests", "1"])


def test_check_sglang_without_sglang_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check --sglang` with no SGLang importable exits 2 naming the install command."""
    monkeypatch.setitem(sys.modules, "sglang", None)
    assert main(["check", "--sglang", "tests.typing.readme_example:MY_EAGLE"]) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"^specstrat check: IntegrationError: SGLang is not installed .*"
        r"pip install --no-deps sglang==0\.5\.23.*make sglang-env",
        err,
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", r"no algorithm named 'no_colon'.*; or pass MODULE:ATTR"),
        ("no_such_module_q:X", r"importing 'no_such_module_q' failed: ModuleNotFoundError"),
        ("specstrat.builtins:MEDUSA", r"module 'specstrat.builtins' has no attribute 'MEDUSA'"),
        (
            "specstrat.builtins:BUILTINS",
            r"check --sglang: 'specstrat.builtins:BUILTINS' is a tuple",
        ),
    ],
)
def test_check_sglang_bad_targets_exit_before_importing_sglang(
    target: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed, missing or non-algorithm target stops with its message, SGLang or not."""
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(SystemExit, match=message):
        main(["check", "--sglang", target])


BUGGY_ALGO = """
import dataclasses
import specstrat
from specstrat.strategies import NgramDrafterFactory

class Buggy(NgramDrafterFactory):
    def create_drafter(self, context):
        inner = super().create_drafter(context)
        class D:
            admit, release, commit = inner.admit, inner.release, inner.commit
            def propose(self, step):
                return [][1]
        return D()

BUGGY = dataclasses.replace(specstrat.NGRAM, name="BUGGY", drafter=Buggy())
"""


@pytest.mark.parametrize("traceback", [False, True])
def test_a_hook_failure_names_the_users_line_and_traceback_shows_its_frame(
    traceback: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user's hook that raises ends the one-line message with its file:line; --traceback
    also prints the chained traceback through the user's frame."""
    (tmp_path / "buggy_algo.py").write_text(BUGGY_ALGO)
    monkeypatch.chdir(tmp_path)
    args = ["demo", "--algo", "buggy_algo:BUGGY", "--requests", "1", "--no-overlap"]
    assert main([*args, "--traceback"] if traceback else args) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"StrategyError: BUGGY\.drafter\.propose: raised IndexError: list index out of range "
        r"\(at .*buggy_algo\.py:12\)$",
        err.strip(),
    )
    assert ('File "' in err and "in propose" in err) == traceback
