"""MkDocs hooks: the README and CHANGELOG.md are written for the repository root (their links
say ``docs/bench.md``). The pages that include them (``--8<-- "README.md"``) get the file's
text here, with those links pointing into the site, before the snippets extension runs. A page
line ``<!-- specstrat cli reference -->`` becomes the command line's reference, read from its
parser (:mod:`specstrat.cli_reference`) at each build."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: A page line that includes one of the root files.
INCLUDE = re.compile(r'^--8<-- "(README\.md|CHANGELOG\.md)"$', flags=re.MULTILINE)
LINK = re.compile(r"\]\((docs/|CHANGELOG\.md)")
#: The page line the generated CLI reference replaces.
CLI_REFERENCE = "<!-- specstrat cli reference -->"


def _link(match: re.Match[str]) -> str:
    return "](changelog.md" if match[1] == "CHANGELOG.md" else "]("


def _include(match: re.Match[str]) -> str:
    return LINK.sub(_link, (ROOT / match[1]).read_text())


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """The page with each root-file include replaced by the file, its links rewritten."""
    markdown = INCLUDE.sub(_include, markdown)
    if CLI_REFERENCE in markdown:
        from specstrat.cli import build_parser
        from specstrat.cli_reference import cli_reference

        markdown = markdown.replace(CLI_REFERENCE, cli_reference(build_parser()))
    return markdown
