"""``Engine.run(trace=...)``: one JSON line per step and request, and the per-request records
a traced decode step makes (:class:`~specstrat.runtime._step_types.Produced`).

A decode line's ``width`` is the step's D, the value ``RunStats.widths`` holds for that step
(both come from the step's lane: 1 for plain decoding, a non-speculative algorithm included);
a prefill's or an admission's line says 0. ``tokens`` is what the request kept (cut at its
budget or a stop token); a dropped overlapped step writes no line.
"""

from __future__ import annotations

import json
from typing import TextIO

from specstrat.contracts import HostTree
from specstrat.runtime._slots import SlotRow
from specstrat.runtime._step_types import Produced

__all__ = ["TraceWriter", "traced"]


def traced(
    tokens: list[list[int]], tree: HostTree, paths: list[list[int]], width: int
) -> list[Produced]:
    """A traced decode step's records, per request: its tokens, drafts, parents, accepted
    nodes and the step's D (a per-request loop, made only when the run is traced)."""
    return [
        Produced(row, drafted[:n], parents[:n], path, width)
        for row, drafted, parents, n, path in zip(
            tokens, tree.tokens, tree.parents, tree.lengths, paths, strict=True
        )
    ]


class TraceWriter:
    """Writes the trace lines to ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, step: int, row: SlotRow, result: Produced, kept: list[int]) -> None:
        """One request's line for scheduler step ``step``; ``kept``: the tokens it kept."""
        output, stops = row.output, row.request.stop_token_ids
        record = {
            "step": step,
            "rid": row.request.rid,
            "width": result.width,  # the step's D (0 for a prefill)
            "drafts": list(result.drafts),
            "parents": list(result.parents),
            "accepted": list(result.accepted),
            "tokens": kept,  # what the request kept (cut at its budget or stop)
            "stop": row.finished and bool(output) and output[-1] in stops,
        }
        self.stream.write(json.dumps(record) + "\n")
