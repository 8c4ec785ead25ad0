"""``--compile COUNTS`` on ``specstrat bench`` and ``specstrat demo``: the Hugging Face target's
fast forward compiled for forwards of those token counts
(:mod:`specstrat.hf.compiled_forward`)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from specstrat.errors import InvalidConfig

__all__ = ["add_compile_flag", "compile_target", "int_list"]


def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--compile COUNTS`` (ints >= 1, comma-separated) to ``parser``."""
    parser.add_argument(
        "--compile",
        type=int_list,
        metavar="N[,N..]",
        help="a Hugging Face model's forward compiled with torch.compile for forwards of these "
        "token counts (1: a bs-1 decode; bs x D for a verify at D), each 5-50 s at load; other "
        "forwards stay eager (default: none compiled)",
    )


def compile_target(models: Any, counts: tuple[int, ...] | None) -> None:
    """Compile ``models.target`` for ``counts`` (nothing for ``None``), saying so on stderr;
    the embedded byte models are refused naming the flag."""
    if counts is None:
        return
    from specstrat.hf import HFCausalLM

    target = getattr(models, "target", None)
    if not isinstance(target, HFCausalLM):
        raise InvalidConfig(
            f"--compile {','.join(map(str, counts))}: only a Hugging Face model's forward "
            "compiles; pass --model smollm2 or --model PATH, or drop --compile"
        )
    start = time.perf_counter()
    try:
        target.compile(counts)
    except InvalidConfig as exc:
        raise InvalidConfig(f"--compile {','.join(map(str, counts))}: {exc}") from exc
    took = time.perf_counter() - start
    print(f"compiled the forward for {list(counts)} token(s) in {took:.1f} s", file=sys.stderr)


def int_list(text: str) -> tuple[int, ...]:
    """``4`` or ``1,4,16``: one int >= 1 or several, comma-separated, repeats dropped (an
    argparse ``type``: ``--compile`` and ``specstrat bench``'s sweeps)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an int >= 1 or a comma-separated list of them (e.g. 1,4,16)"
        )
    return tuple(dict.fromkeys(values))
