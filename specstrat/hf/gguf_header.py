"""A bounds check of a GGUF file's key-value header, run before ``gguf.GGUFReader`` reads it.

The reader loops over an array's declared count, and a numeric item past the end of the file
reads as an empty array without raising, so one flipped bit in an array's type or count (a
string turned into an array whose count is eight bytes of text) had it loop for ever, growing
its list of parts until the machine ran out of memory. Here every length and count is checked
against the bytes left in the file before the reader sees it.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

__all__ = ["gguf_header_problem"]

#: Bytes of each scalar GGUF value type, by its type number (gguf's ``GGUFValueType``).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
#: The fewest bytes a value of each kind takes: a scalar its size, a string its length, an
#: array its item type and count.
_LEAST = {**_SCALAR_BYTES, _STRING: 8, _ARRAY: 12}


class _Past(Exception):
    """A length or count that runs past the end of the file (its message says which)."""


def gguf_header_problem(file: Path) -> str:
    """What makes ``file``'s key-value header unsafe to parse, or "": a key, string or array
    whose length or count runs past the end of the file, or a value type GGUF does not have.
    A file too short for the header, or of a version before 2 (32-bit lengths), is left to the
    reader, which refuses it by itself."""
    with file.open("rb") as handle:
        size = handle.seek(0, 2)
        if size < 24:
            return ""
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if struct.unpack_from("<I", data, 4)[0] < 2:
                return ""
            (count,) = struct.unpack_from("<Q", data, 16)
            offs = 24
            try:
                for index in range(count):  # each pass moves at least 12 bytes on
                    key_len = _u64(data, offs, f"key {index}'s length")
                    key = bytes(data[offs + 8 : offs + 8 + key_len]).decode("utf-8", "replace")
                    _need(data, offs + 8, key_len, f"key {index} ({key_len} bytes)")
                    offs += 8 + key_len
                    kind = _u32(data, offs, f"field {key}'s type")
                    try:
                        offs = _skip(data, offs + 4, kind)
                    except _Past as exc:
                        return f"field {key}: {exc}"
            except _Past as exc:
                return str(exc)
    return ""


def _skip(data: mmap.mmap, offs: int, kind: int) -> int:
    """The offset after a value of type ``kind`` at ``offs``."""
    if kind in _SCALAR_BYTES:
        _need(data, offs, _SCALAR_BYTES[kind], "its value")
        return offs + _SCALAR_BYTES[kind]
    if kind == _STRING:
        length = _u64(data, offs, "its string's length")
        _need(data, offs + 8, length, f"its string of {length} bytes")
        return offs + 8 + length
    if kind != _ARRAY:
        raise _Past(f"value type {kind} is not a GGUF type")
    item = _u32(data, offs, "its array's item type")
    count = _u64(data, offs + 4, "its array's count")
    if item not in _LEAST:
        raise _Past(f"array item type {item} is not a GGUF type")
    offs += 12
    _need(data, offs, count * _LEAST[item], f"its array of {count} items")
    if item in _SCALAR_BYTES:
        return offs + count * _SCALAR_BYTES[item]
    for _ in range(count):
        offs = _skip(data, offs, item)
    return offs


def _need(data: mmap.mmap, offs: int, length: int, what: str) -> None:
    if offs + length > len(data):
        raise _Past(f"{what} runs past the end of the file")


def _u32(data: mmap.mmap, offs: int, what: str) -> int:
    _need(data, offs, 4, what)
    value: int = struct.unpack_from("<I", data, offs)[0]
    return value


def _u64(data: mmap.mmap, offs: int, what: str) -> int:
    _need(data, offs, 8, what)
    value: int = struct.unpack_from("<Q", data, offs)[0]
    return value
