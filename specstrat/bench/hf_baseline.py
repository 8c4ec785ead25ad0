"""transformers' own ``generate`` as a bench contender (``specstrat bench --baseline hf``).

Plain greedy ``generate`` runs the requests in static batches of the cell's batch size (left
padded, a batch decoding until its longest request finishes); its prompt lookup
(``prompt_lookup_num_tokens = D - 1``, the same drafts per step as a chain of D) only at batch
size 1, the only size transformers supports for it; likewise its assisted generation with the
run's draft LM (``generate(assistant_model=...)``, ``num_assistant_tokens = D - 1``, constant),
the side-by-side anchor for STANDALONE. Token times come from a streamer: every
``put`` after the prompt is one target forward, so TTFT, TPOT and (for prompt lookup) tau are
measured the same way as the engine's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specstrat.runtime import Request

__all__ = ["GenerateRecord", "generate_run"]


@dataclass(frozen=False, slots=True)
class GenerateRecord:
    """One ``generate`` run: per request, arrival, first and last token times, and
    ``forwards`` (target forwards that produced its tokens)."""

    arrivals: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    forwards: dict[str, int] = field(default_factory=dict)


class _Clock:
    """A transformers streamer that stamps each ``put`` after the prompt: ``times[k]`` and the
    tokens each row got then (``[bs]`` for plain decoding, ``[1, n]`` for prompt lookup)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.times: list[float] = []
        self.counts: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the first put is the prompt itself
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.counts.append(int(value.shape[-1]) if value.dim() == 2 else 1)

    def end(self) -> None:
        """Nothing to flush."""


def generate_run(
    models: Any,
    requests: Sequence[Request],
    *,
    batch_size: int,
    lookup: int,
    record: GenerateRecord,
    assisted: int = 0,
) -> dict[str, list[int]]:
    """Greedy ``generate`` over ``requests`` in batches of ``batch_size`` (``lookup`` > 0:
    prompt lookup, batch size 1; ``assisted`` > 0: that many drafts per step from
    ``models.draft``'s ``assistant()``, batch size 1), all arriving at once; fills ``record``."""
    from specstrat.hf.reference import generation_config, plain_defaults

    lm = models.target
    pad = getattr(models.tokenizer, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else min(models.eos_token_ids, default=0)
    start = time.perf_counter()
    out: dict[str, list[int]] = {}
    helper = models.draft.assistant() if assisted else contextlib.nullcontext()
    quiet = _quiet() if assisted else contextlib.nullcontext()
    with (
        lm.reference() as model,
        plain_defaults(model),
        helper as assistant,
        quiet,
        torch.inference_mode(),
    ):
        for lo in range(0, len(requests), batch_size):
            batch = list(requests[lo : lo + batch_size])
            width = max(len(r.prompt) for r in batch)
            ids = torch.full((len(batch), width), pad)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(batch):
                ids[i, width - len(r.prompt) :] = torch.tensor(list(r.prompt))
                mask[i, width - len(r.prompt) :] = 1
            stops = frozenset().union(*(r.stop_token_ids for r in batch))
            config = generation_config(
                lm,
                max(r.max_new_tokens for r in batch),
                stops,
                pad_token_id=pad,
                prompt_lookup_num_tokens=lookup,
                num_assistant_tokens=assisted,
            )
            clock = _Clock()
            extra = {"assistant_model": assistant} if assisted else {}
            done = model.generate(
                ids, attention_mask=mask, generation_config=config, streamer=clock, **extra
            )
            for i, r in enumerate(batch):
                row = [int(t) for t in done[i, width:]][: r.max_new_tokens]
                end = next((j + 1 for j, t in enumerate(row) if t in r.stop_token_ids), len(row))
                out[r.rid] = row[:end]
                record.arrivals[r.rid] = start
                _stamp(record, r.rid, end, clock)
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings about its own assisted-generation defaults kept off stderr for
    the block."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _stamp(record: GenerateRecord, rid: str, tokens: int, clock: _Clock) -> None:
    """The times of a request's first and last token, and the forwards that made them."""
    if not tokens or not clock.times:
        return
    total = 0
    for k, (at, n) in enumerate(zip(clock.times, clock.counts, strict=True)):
        if total == 0:
            record.first[rid] = at
        total += n
        if total >= tokens:
            record.last[rid] = at
            record.forwards[rid] = k + 1
            return
    record.last[rid] = clock.times[-1]
    record.forwards[rid] = len(clock.times)
