"""A griffe extension for the API reference: docstrings here use Sphinx roles
(:class:`~specstrat.runtime.Engine`, :func:`load`), which Markdown would print literally; each
becomes inline code of the name it shows (the last part after a ``~``, else the whole path)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRolesToCode(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads as Markdown inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_shown, obj.docstring.value)
