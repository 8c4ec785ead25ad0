"""The command line's reference is generated from its parser, and every flag a page names is a
flag of the command it names."""

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from specstrat.cli import build_parser
from specstrat.cli_reference import cli_reference, subcommand_flags, subcommands

ROOT = Path(__file__).resolve().parents[2]
#: The pages a user reads (CHANGELOG.md is history: it may name what was since renamed).
PAGES = [
    *(p for p in sorted((ROOT / "docs").rglob("*.md")) if p.name != "changelog.md"),
    ROOT / "README.md",
]
FLAGS = subcommand_flags(build_parser())
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: ``specstrat SUB ...`` in a command, or a code span that starts with the subcommand.
COMMAND = re.compile(rf"(?:\bspecstrat |^)({'|'.join(FLAGS)})(?=\s|$)(.*)")
#: A script or module of this repository run with flags: ``python bench/e2e.py --section ...``.
SCRIPT = re.compile(r"\bpython (?:-m ([\w.]+)|([\w/]+\.py))(.*)")
#: Other tools' flags the pages name, with the tool.
OTHER_TOOLS = {"--no-deps": "pip", "--strict": "mypy", "--speculative-algorithm": "SGLang"}


def _hook() -> ModuleType:
    """docs/hooks.py, the MkDocs hook, imported by path (it is build code, not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(text: str) -> list[str]:
    """The commands a page shows: each line of its code blocks (``\\`` continuations joined, the
    ``# ...`` comment cut), and each inline code span of its prose."""
    found: list[str] = []
    for i, part in enumerate(re.split(r"^```.*$", text, flags=re.MULTILINE)):
        if i % 2:  # inside a fenced block
            for line in part.replace("\\\n", " ").splitlines():
                found.append(line.split(" #")[0].removeprefix("$ "))
        else:
            found.extend(" ".join(span.split()) for span in re.findall(r"`([^`]+)`", part))
    return found


def _script_flags(module: str | None, path: str | None) -> set[str] | None:
    """The flags a repository script's source declares (``"--section"``); ``None`` for a
    module outside the repository (``python -m pytest``: another tool's flags)."""
    file = ROOT / path if path else ROOT / (str(module).replace(".", "/") + ".py")
    if module is not None and not file.is_file():
        return None
    assert file.is_file(), f"no script {file}"
    return set(re.findall(r"\"(--[a-z][a-z0-9-]*)\"", file.read_text()))


def _wrong_flags(text: str) -> list[str]:
    """Each flag the text names that the command it names lacks, as ``command: flag``."""
    wrong: list[str] = []
    others: set[str] = set()  # flags of the scripts and other tools' modules the text runs
    for command in _commands(text):
        for segment in re.split(
            r" \| |&&|;", command.replace("python -m specstrat ", "specstrat ")
        ):
            script = SCRIPT.search(segment)
            if script:
                known = _script_flags(script[1], script[2])
                if known is None:
                    others |= set(FLAG.findall(script[3]))
                    continue
                others |= known
                wrong += [f"{script[0]}: {f}" for f in FLAG.findall(script[3]) if f not in known]
                continue
            for match in COMMAND.finditer(segment):
                named = [f for f in FLAG.findall(match[2]) if f not in FLAGS[match[1]]]
                wrong += [f"specstrat {match[1]}: {f}" for f in named]
    scripts = [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh")]
    declared: set[str] = set()
    for path in scripts:
        declared |= _script_flags(None, str(path.relative_to(ROOT))) or set()
    anywhere = set().union(*FLAGS.values(), declared, others, OTHER_TOOLS)
    wrong += [f"(prose): {f}" for f in FLAG.findall(text) if f not in anywhere]
    return wrong


def _rendered(page: Path) -> str:
    """The page as the docs build renders it (the CLI reference filled in)."""
    return str(_hook().on_page_markdown(page.read_text()))


def test_the_reference_lists_every_argument_of_every_subcommand() -> None:
    """Each subcommand has a section, and each of its flags and positionals a row in it."""
    reference = cli_reference(build_parser())
    sections = dict(
        zip(
            re.findall(r"^## specstrat (\w+)$", reference, flags=re.MULTILINE),
            re.split(r"^## specstrat \w+$", reference, flags=re.MULTILINE)[1:],
            strict=True,
        )
    )
    assert list(sections) == list(subcommands(build_parser()))
    for name, parser in subcommands(build_parser()).items():
        rows = re.findall(r"^\| (.+?) \|", sections[name], flags=re.MULTILINE)
        for action in parser._actions:
            shown = action.option_strings or [action.dest]
            assert all(any(f"`{s}" in row for row in rows) for s in shown), (name, shown)


def test_the_reference_fills_help_fields_and_defaults() -> None:
    """``%(default)s`` in a help text is filled as ``--help`` fills it, and defaults show."""
    reference = cli_reference(build_parser())
    assert "%(" not in reference
    assert "| `--draft-tokens D` | `4` |" in reference
    assert "| `--out FILE.safetensors` | required |" in reference


def test_the_cli_page_is_the_generated_reference() -> None:
    """docs/reference/cli.md holds the marker, and the docs hook replaces it by the reference."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    hook = _hook()
    assert hook.CLI_REFERENCE in page
    rendered = hook.on_page_markdown(page)
    assert hook.CLI_REFERENCE not in rendered
    assert cli_reference(build_parser()) in rendered


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_a_page_names_exists(page: Path) -> None:
    """A flag after ``specstrat SUB`` is SUB's, a flag after ``python bench/x.py`` is in that
    script, and any other flag in the prose belongs to some subcommand, script or other tool."""
    assert _wrong_flags(_rendered(page)) == []


def test_a_flag_the_parser_lacks_is_caught() -> None:
    """The page check fails a demo flag that exists only on bench, and an invented flag."""
    text = "Run `specstrat demo --repeats 3`.\n\n```\nspecstrat bench --fast\n```\n"
    assert _wrong_flags(text) == [
        "specstrat demo: --repeats",
        "specstrat bench: --fast",
        "(prose): --fast",
    ]


def test_each_command_of_a_pipeline_and_a_continuation_is_checked() -> None:
    """``a | b`` checks b's flags against b; a ``\\`` continuation is one command."""
    text = (
        "`specstrat demo --json | specstrat bench --trace t`\n\n"
        "```\nspecstrat bench --algo NGRAM \\\n    --repeat 2\n```\n"
    )
    assert _wrong_flags(text) == [
        "specstrat bench: --trace",
        "specstrat bench: --repeat",
        "(prose): --repeat",
    ]


def test_python_dash_m_is_the_command_or_another_tool() -> None:
    """``python -m specstrat demo`` is checked as the demo; ``python -m pytest -x`` is pytest's."""
    assert _wrong_flags("`python -m specstrat demo --fast` and `python -m pytest -q --lf`") == [
        "specstrat demo: --fast",
        "(prose): --fast",
    ]


def test_a_script_without_the_flag_is_caught() -> None:
    """A flag after ``python bench/e2e.py`` that the script does not declare is named."""
    assert _wrong_flags("`python bench/e2e.py --section trees --turbo`\n") == [
        "python bench/e2e.py --section trees --turbo: --turbo",
        "(prose): --turbo",
    ]


def test_the_rendered_reference_names_only_real_flags() -> None:
    """The help texts, as the reference renders them, name only flags their commands have."""
    assert _wrong_flags(_rendered(ROOT / "docs" / "reference" / "cli.md")) == []


def test_a_default_a_help_text_states_is_the_parsers() -> None:
    """``(default X)`` in a help text is the default the parser holds (sweeps as ``1,4``)."""
    stated = re.compile(r"\(default (?P<value>[^\s:;,)]+)[;,)]")
    for name, parser in subcommands(build_parser()).items():
        for action in parser._actions:
            match = stated.search(action.help or "")
            if match is None or action.default is None or "%(" in (action.help or ""):
                continue
            value = action.default
            held = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            if isinstance(action, argparse.BooleanOptionalAction):
                held = "on" if value else "off"
            assert match["value"] == held, (name, action.option_strings, match["value"], held)
