"""The command line's reference, read from its argparse parsers: every subcommand's usage, flags,
defaults and help as Markdown (the docs build renders it into ``docs/reference/cli.md``), and the
flags each subcommand accepts (the tests check every flag the docs name against them).

The parser is the one owner of the flags: a flag added to it appears in the docs at the next
build, and a page that names a flag the parser lacks fails the suite."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

__all__ = ["cli_reference", "subcommand_flags", "subcommands"]

#: Columns of the usage lines in the reference (a code block: no wrapping of its own).
_WIDTH = 96


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by name, in the order the parser declares them."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def subcommand_flags(parser: argparse.ArgumentParser) -> dict[str, frozenset[str]]:
    """Each subcommand's option strings (``--overlap`` and ``--no-overlap`` both), ``-h`` and
    ``--help`` included."""
    return {
        name: frozenset(flag for action in sub._actions for flag in action.option_strings)
        for name, sub in subcommands(parser).items()
    }


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """The Markdown reference: a section per subcommand with its summary, its usage line and a
    table of its arguments (flags, default, meaning)."""
    summaries = _summaries(parser)
    sections = [
        f"`{parser.prog}` subcommands: "
        + ", ".join(f"[`{name}`](#{parser.prog}-{name})" for name in subcommands(parser))
        + ". Generated from the parser at each docs build."
    ]
    for name, sub in subcommands(parser).items():
        sections.append("\n".join(_section(name, sub, summaries.get(name, ""))))
    return "\n\n".join(sections) + "\n"


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line ``help``, as ``specstrat --help`` lists it."""
    found: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[choice.dest] = choice.help or ""
    return found


def _section(name: str, sub: argparse.ArgumentParser, summary: str) -> Iterator[str]:
    yield f"## {sub.prog}"
    yield ""
    if summary:
        yield _sentence(summary)
        yield ""
    if sub.description:
        yield sub.description
        yield ""
    yield "```"
    yield _usage(sub)
    yield "```"
    yield ""
    yield "| argument | default | meaning |"
    yield "|---|---|---|"
    for action in sub._actions:
        if action.help == argparse.SUPPRESS:
            continue
        yield f"| {_names(action)} | {_default(action)} | {_cell(_help(action, sub.prog))} |"


def _usage(sub: argparse.ArgumentParser) -> str:
    """The usage line at a fixed width, whatever the terminal that builds the docs."""
    formatter = argparse.HelpFormatter(sub.prog, width=_WIDTH)
    formatter.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _names(action: argparse.Action) -> str:
    """The argument as a user types it: ``--draft-tokens D``, ``--overlap, --no-overlap``, or a
    positional's name."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper()
    if action.choices is not None and action.metavar is None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    shown = [f"{flag} {metavar}" if takes_value else flag for flag in action.option_strings]
    return ", ".join(f"`{text}`" for text in shown)  # a table keeps a | inside a code span


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    value = action.default
    switch = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
    if value is None or value is argparse.SUPPRESS or switch:
        return ""
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        value = ",".join(str(v) for v in value)
    return f"`{value}`"


def _help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's ``%(default)s``-style fields filled, as ``--help`` does."""
    text = action.help or ""
    if "%" not in text:
        return text
    fields = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    fields["prog"] = prog
    if action.choices is not None:
        fields["choices"] = ", ".join(str(c) for c in action.choices)
    return text % fields


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
