"""The command line's reference is generated from its parser, and every flag a page names is a
flag of the command it names."""

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from specstrat.cli import build_parser
from specstrat.cli_reference import cli_reference, subcommand_flags, subcommands

ROOT = Path(__file__).resolve().parents[2]
#: The pages a user reads (CHANGELOG.md is history: it may name what was since renamed).
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
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


def _script_flags(module: str | None, path: str | None) -> set[str]:
    """The flags a repository script's source declares (``"--section"``)."""
    file = ROOT / path if path else ROOT / (str(module).replace(".", "/") + ".py")
    assert file.is_file(), f"no script {file}"
    return set(re.findall(r"\"(--[a-z][a-z0-9-]*)\"", file.read_text()))


def _wrong_flags(page: Path) -> list[str]:
    """Each flag the page names that the command it names lacks, as ``command: flag``."""
    wrong: list[str] = []
    named_scripts: set[str] = set()
    for command in _commands(page.read_text()):
        for match in SCRIPT.finditer(command):
            known = _script_flags(match[1], match[2])
            named_scripts |= known
            wrong += [f"{match[0]}: {f}" for f in FLAG.findall(match[3]) if f not in known]
        if SCRIPT.search(command):
            continue
        for match in COMMAND.finditer(command):
            rest = re.split(r" \| |&&|;", match[2])[0]
            named = [f for f in FLAG.findall(rest) if f not in FLAGS[match[1]]]
            wrong += [f"specstrat {match[1]}: {f}" for f in named]
    scripts = [*(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh")]
    declared = set().union(*(_script_flags(None, str(p.relative_to(ROOT))) for p in scripts))
    anywhere = set().union(*FLAGS.values(), declared, named_scripts, OTHER_TOOLS)
    wrong += [f"(prose): {f}" for f in FLAG.findall(page.read_text()) if f not in anywhere]
    return wrong


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
    assert _wrong_flags(page) == []


def test_a_flag_the_parser_lacks_is_caught(tmp_path: Path) -> None:
    """The page check fails a demo flag that exists only on bench, and an invented flag."""
    page = tmp_path / "page.md"
    page.write_text("Run `specstrat demo --repeats 3`.\n\n```\nspecstrat bench --fast\n```\n")
    assert _wrong_flags(page) == [
        "specstrat demo: --repeats",
        "specstrat bench: --fast",
        "(prose): --fast",
    ]


def test_a_script_without_the_flag_is_caught(tmp_path: Path) -> None:
    """A flag after ``python bench/e2e.py`` that the script does not declare is named."""
    page = tmp_path / "page.md"
    page.write_text("`python bench/e2e.py --section trees --turbo`\n")
    assert _wrong_flags(page) == [
        "python bench/e2e.py --section trees --turbo: --turbo",
        "(prose): --turbo",
    ]
