"""The embedded models' byte encoding of text: indentation as one depth byte per line."""

from __future__ import annotations

__all__ = ["MAX_DEPTH", "decode_indentation", "encode_indentation"]

#: Line-start bytes 1..8 stand for that many levels of 4-space indentation (9 is tab, 10 newline).
MAX_DEPTH = 8


def encode_indentation(text: bytes) -> bytes:
    """Replace each line's leading 4-space groups by one byte (the depth, 1..8).

    A byte model this small cannot count runs: trained on space-indented code (and then on
    tab-indented code) it greedily emitted spaces (tabs) forever after an indented newline. One
    byte per line for the whole indentation leaves nothing to count. Form feeds, which some
    stdlib files use as page breaks, are dropped so bytes 1..8 mean indentation only.
    """
    lines = []
    for line in text.replace(b"\x0c", b"").split(b"\n"):
        body = line.lstrip(b" ")
        depth = min((len(line) - len(body)) // 4, MAX_DEPTH)
        rest = len(line) - len(body) - 4 * depth
        body = body.rstrip()
        lines.append((bytes([depth]) if depth and body else b"") + b" " * rest + body)
    return b"\n".join(lines)


def decode_indentation(data: bytes) -> str:
    """Text from model bytes: a line-start depth byte becomes 4 spaces per level."""
    lines = []
    for line in data.split(b"\n"):
        if line and 1 <= line[0] <= MAX_DEPTH:
            line = b"    " * line[0] + line[1:]
        lines.append(line.decode(errors="replace"))
    return "\n".join(lines)
