"""The embedded models' workload: prompts cut from the Python standard library's source (which
every machine has), encoded as the models read them."""

from __future__ import annotations

import random
import sysconfig
from dataclasses import replace
from pathlib import Path

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.runtime._models.text import encode_indentation
from specstrat.runtime._requests import Request

__all__ = ["NEWLINE", "PROMPT_FILES", "STOP_EVERY", "workload"]

#: Stdlib files the prompts come from (not among the training files).
PROMPT_FILES = ("json/__init__.py", "glob.py", "fnmatch.py", "keyword.py", "colorsys.py", "this.py")


#: Every ``STOP_EVERY``-th request asks to finish the line it is on: it stops at a newline.
STOP_EVERY = 4
NEWLINE = 10


def workload(
    num_requests: int, *, seed: int = 0, stops: bool = True, sampling: SamplingParams = GREEDY
) -> list[Request]:
    """``num_requests`` prompts of 24..160 bytes, each asking for 48..128 tokens; with ``stops``,
    every fourth one stops at the first newline it generates; request ``i`` samples with
    ``sampling`` and seed ``sampling.seed + i``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    # Encoded like the training text (see specstrat.runtime._models.text.encode_indentation).
    texts = [
        encode_indentation((root / f).read_bytes()) for f in PROMPT_FILES if (root / f).is_file()
    ]
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        text = texts[i % len(texts)]
        length = rng.randint(24, 160)
        start = rng.randrange(0, max(1, len(text) - length))
        start = text.rfind(b"\n", 0, start) + 1  # begin at a line start
        prompt = text[start : start + length] or b"def "
        stop = frozenset({NEWLINE}) if stops and i % STOP_EVERY == STOP_EVERY - 1 else frozenset()
        params = replace(sampling, seed=(sampling.seed + i) % 2**63)
        requests.append(Request(f"req-{i}", tuple(prompt), rng.randint(48, 128), stop, params))
    return requests
