"""Every command transcript the docs show (a fenced block whose first line is ``$ COMMAND``) is
what the command prints now, line for line, so a changed line fails the suite.

A figure that moves from run to run (a timing) is named on the line before the block,
``<!-- varies: LABEL, LABEL -->``: a line that starts with a listed label is compared up to the
label. ``…`` in a transcript stands for any text (``/…/tests/typing/readme_drafter.py``)."""

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from specstrat.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(
    r"^(?:<!-- varies: (.*?) -->\n)?```\n(\$ .*?)```", flags=re.MULTILINE | re.DOTALL
)
#: Transcripts of the SGLang venv's command: tests/integrations runs them, with SGLang.
SGLANG = ".venv-sglang/bin/specstrat "


@dataclass(frozen=True, slots=True)
class Transcript:
    """A command the docs show and the lines they say it prints."""

    page: str
    command: list[str]
    lines: list[str]
    varies: tuple[str, ...]


def transcripts(text: str, page: str) -> list[Transcript]:
    """The page's command transcripts, in order."""
    found: list[Transcript] = []
    for match in BLOCK.finditer(text):
        command, *lines = match[2].rstrip("\n").splitlines()
        words = shlex.split(command.removeprefix("$ "), comments=True)
        varies = tuple(label.strip() for label in (match[1] or "").split(",") if label.strip())
        found.append(Transcript(page, words, lines, varies))
    return found


def differences(transcript: Transcript, printed: str) -> list[str]:
    """Where the printed lines and the transcript's part: ``-`` shown, ``+`` printed."""
    printed_lines = printed.rstrip("\n").splitlines()
    wrong: list[str] = []
    for i in range(max(len(transcript.lines), len(printed_lines))):
        shown = transcript.lines[i] if i < len(transcript.lines) else ""
        got = printed_lines[i] if i < len(printed_lines) else ""
        if not _same(shown, got, transcript.varies):
            wrong += [f"- {shown}", f"+ {got}"]
    return wrong


def _same(shown: str, got: str, varies: tuple[str, ...]) -> bool:
    for label in varies:
        if shown.startswith(label):
            return got.startswith(label)
    pattern = ".*".join(re.escape(part) for part in shown.split("…"))
    return re.fullmatch(pattern, got) is not None


ALL = [t for page in PAGES for t in transcripts(page.read_text(), str(page.relative_to(ROOT)))]


def test_every_block_that_starts_with_a_prompt_is_compared() -> None:
    """A fenced block of any language or indentation whose first line is ``$ ...`` is one of
    the transcripts above (a bare fence at the margin), so none is skipped unseen."""
    fence = re.compile(r"^([ \t]*)```[\w-]*\n\s*\$ ", flags=re.MULTILINE)
    for page in PAGES:
        text = page.read_text()
        shown = [m for m in fence.finditer(text)]
        odd = [m[0] for m in shown if m[0] != "```\n$ "]
        assert odd == [], f"{page}: write a transcript as a bare ``` block at the margin"
        assert len(shown) == len(transcripts(text, str(page))), page


def test_the_docs_show_the_transcripts_this_suite_runs() -> None:
    """The check guide, the engine page and the SGLang guide each show a transcript."""
    pages = {t.page for t in ALL}
    assert {"docs/guides/checking.md", "docs/concepts/engine.md"} <= pages
    assert "docs/guides/sglang.md" in pages


@pytest.mark.parametrize(
    "transcript",
    [t for t in ALL if not " ".join(t.command).startswith(SGLANG)],
    ids=lambda t: f"{t.page}: {' '.join(t.command)}",
)
def test_each_transcript_is_what_the_command_prints(
    transcript: Transcript, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command, run now, prints the transcript's lines (varying figures aside)."""
    program, *words = transcript.command
    assert program == "specstrat", f"{transcript.page}: no runner for {program}"
    status = main(words)
    printed = capsys.readouterr().out
    assert differences(transcript, printed) == [], printed
    assert status == 0


def test_the_sglang_transcript_is_checked_with_sglang() -> None:
    """tests/integrations compares the SGLang guide's transcript with the command's output."""
    source = (ROOT / "tests" / "integrations" / "test_sglang_guide.py").read_text()
    assert "def test_the_check_output_is_what_the_command_prints" in source
    assert [t.page for t in ALL if " ".join(t.command).startswith(SGLANG)] == [
        "docs/guides/sglang.md"
    ]


def test_a_changed_line_is_caught() -> None:
    """A transcript line the command no longer prints fails; a varying label and … match."""
    text = (
        "<!-- varies: speed -->\n```\n$ specstrat demo\nalgorithm  EAGLE\nspeed  1.1x\n"
        "path /…/x.py\n```\n"
    )
    (transcript,) = transcripts(text, "page.md")
    assert transcript.command == ["specstrat", "demo"]
    assert differences(transcript, "algorithm  EAGLE\nspeed  9.9x\npath /a/b/x.py\n") == []
    assert differences(transcript, "algorithm  NGRAM\nspeed  1.1x\npath /a/x.py\n") == [
        "- algorithm  EAGLE",
        "+ algorithm  NGRAM",
    ]
    assert differences(transcript, "algorithm  EAGLE\npace 1x\n") == [
        "- speed  1.1x",
        "+ pace 1x",
        "- path /…/x.py",
        "+ ",
    ]
