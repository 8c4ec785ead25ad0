"""The engine run that records a target's hidden states while it generates.

:class:`EngineRun` runs specstrat's engine, target-only, with :class:`RecordingDrafter`: it
drafts nothing and keeps every request's rows (the hidden state at admission and after each
step), and :func:`recorded_sequence` turns one response's rows into a
:class:`~specstrat.train.CapturedSequence`. :mod:`specstrat.train.generation` builds on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from specstrat.drafting import DraftAdmission, DrafterContext, StepOutcome
from specstrat.errors import EngineStateError, InternalError, InvalidConfig
from specstrat.hf import HFCausalLM
from specstrat.relay import RelayPayload
from specstrat.runtime import Request
from specstrat.strategies import NoDrafter, NoDrafterFactory
from specstrat.train.capture import CapturedSequence, Generation


@dataclass(frozen=True, slots=True)
class Rows:
    """One request's recorded hidden states: ``start`` is its last prompt position, ``parts``
    the ``[1, W]`` rows from there on, in order; ``prompt`` the ``[start, W]`` rows before
    it."""

    start: int
    parts: list[torch.Tensor] = field(default_factory=list)
    prompt: torch.Tensor | None = None


#: Released requests, keyed by (last prompt position, committed tokens): two requests with one
#: key have one prompt and one response, so their rows are equal too.
Recorded = list[tuple[tuple[int, tuple[int, ...]], Rows]]


class RecordingDrafter(NoDrafter):
    """Drafts nothing; keeps each request's hidden states (with ``prompt_rows``, the prompt's
    too) and, at release, its committed tokens (what the slot table holds: the prompt and
    every token but the last)."""

    def __init__(self, context: DrafterContext, done: Recorded, prompt_rows: bool) -> None:
        self.context, self.done, self.prompt_rows = context, done, prompt_rows
        self.open: dict[int, Rows] = {}

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """The last prompt position's hidden state starts each request's rows."""
        if admission.hidden is None:
            raise EngineStateError(
                "capture during generation needs a local prefill; a PREBUILT admission carries "
                "no hidden states (run generate_captured on one engine, not disaggregated)"
            )
        hidden = admission.hidden.float().cpu()
        lengths = admission.seq_lens.tolist()
        prompts = admission.prompt_hidden if self.prompt_rows else None
        for i, slot in enumerate(admission.slots):
            before = None if prompts is None else prompts[i][:-1].half().cpu()
            self.open[slot] = Rows(
                start=int(lengths[i]) - 1, parts=[hidden[i : i + 1]], prompt=before
            )
        return super().admit(admission)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        """The hidden state that chose each request's new token is its next row."""
        hidden = outcome.hidden.float().cpu()
        for i, slot in enumerate(outcome.step.slots):
            self.open[slot].parts.append(hidden[i : i + 1])
        return super().commit(outcome)

    def release(self, slots: Sequence[int]) -> None:
        """A finished request's rows, with its committed tokens."""
        for slot in slots:
            rows = self.open.pop(slot, None)
            if rows is not None:
                tokens = tuple(self.context.target_tokens(slot))
                self.done.append(((rows.start, tokens), rows))


@dataclass(frozen=True, slots=True)
class RecordingDrafterFactory(NoDrafterFactory):
    """The recording drafter's factory: released requests go to ``done`` (one run's output
    list, shared by reference: a pickled copy would record elsewhere, so this factory is for
    one process's engine, not for disaggregation)."""

    done: Recorded = field(default_factory=list, compare=False)
    prompt_rows: bool = False

    def create_drafter(self, context: DrafterContext) -> RecordingDrafter:
        """A recorder writing to ``done``."""
        return RecordingDrafter(context, self.done, self.prompt_rows)


class EngineRun:
    """Specstrat's engine, target-only, sized for ``sizing`` (the longest prompt plus
    ``max_new_tokens``), ``batch`` requests at once; with ``layers``, the target viewed through
    them plus its last layer and every request's rows recorded, keyed by committed tokens (with
    ``prompt_rows``, the prompt's rows too)."""

    def __init__(
        self,
        model: HFCausalLM,
        sizing: Sequence[Request],
        batch: int,
        layers: tuple[int, ...] | None,
        num_layers: int,
        prompt_rows: bool = False,
    ) -> None:
        from specstrat.builtins import NONE
        from specstrat.models import ModelSet
        from specstrat.runtime import Engine, EngineConfig, kv_reservation

        self.reservation = kv_reservation(NONE, 1)
        self.context = self.reservation.context_len_for(sizing)
        if self.context > model.shape.max_positions:
            raise InvalidConfig(
                f"the longest prompt plus max_new_tokens={sizing[0].max_new_tokens} needs "
                f"context_len={self.context}, past the model's {model.shape.max_positions} "
                "positions; lower max_new_tokens or shorten the prompts"
            )
        self.recorder = RecordingDrafterFactory(prompt_rows=prompt_rows)
        algo, target = NONE, model
        if layers is not None:
            algo = replace(NONE, drafter=self.recorder)
            target = model.with_feature_layers(with_last(layers, num_layers))
        config = EngineConfig(context_len=self.context, max_running_requests=batch)
        self.engine = Engine(algo, ModelSet(target=target), config)
        self.batch, self.runs = batch, 0

    def run(
        self, requests: Sequence[Request], deadline: float | None
    ) -> tuple[tuple[Generation, ...], dict[tuple[int, tuple[int, ...]], Rows]]:
        """``requests``' responses (stopping between batches once ``time.monotonic()`` passes
        ``deadline``) and the rows recorded for them; request ids are made unique per run."""
        need = self.reservation.context_len_for(requests)
        if need > self.context:
            raise InvalidConfig(
                f"these prompts need context_len={need}, past the {self.context} the capturer "
                "was sized for; build the GenerationCapturer with every prompt it will capture"
            )
        self.runs += 1
        unique = [replace(r, rid=f"run{self.runs}-{r.rid}") for r in requests]
        out: list[Generation] = []
        try:
            for first in range(0, len(unique), self.batch):
                if deadline is not None and time.monotonic() > deadline:
                    break
                chunk = unique[first : first + self.batch]
                outputs = self.engine.run(chunk)
                for r in chunk:
                    tokens = torch.tensor([*r.prompt, *outputs[r.rid]], dtype=torch.int64)
                    out.append(Generation(tokens=tokens, prompt_len=len(r.prompt)))
            return tuple(out), dict(self.recorder.done)
        finally:  # a failed run's rows never reach the next run's
            self.recorder.done.clear()


def with_last(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """The distinct ``layers`` (a tiny model's default repeats one) and the last layer (the LM
    head's input), each once, in that order."""
    return tuple(dict.fromkeys((*layers, num_layers - 1)))


def recorded_sequence(
    g: Generation,
    recorded: dict[tuple[int, tuple[int, ...]], Rows],
    layers: tuple[int, ...],
    num_layers: int,
    head: Any,
    vocab: int,
    prompt_rows: bool = False,
) -> CapturedSequence:
    """``g``'s recorded rows as a :class:`CapturedSequence`: the fused layers' part, the LM
    head's input (the last layer's part) and its greedy choice over the first ``vocab`` ids;
    with ``prompt_rows``, from the first prompt position on (the prompt's rows its
    ``context``)."""
    start = g.prompt_len - 1
    rows = recorded.get((start, tuple(int(t) for t in g.tokens[:-1])))
    response = g.tokens.numel() - g.prompt_len
    if rows is None or len(rows.parts) != response:
        raise InternalError(
            f"the recording drafter holds {0 if rows is None else len(rows.parts)} rows for a "
            f"response of {response} tokens after a {g.prompt_len}-token prompt (one row per "
            "response token: admission and each step); please report it"
        )
    hidden = torch.cat(rows.parts)
    if prompt_rows:
        if rows.prompt is None:
            raise InternalError("the recording drafter kept no prompt rows; please report it")
        hidden = torch.cat([rows.prompt.float(), hidden])
        start = 0
    viewed = with_last(layers, num_layers)
    width = hidden.shape[1] // len(viewed)
    blocks = torch.split(hidden, width, dim=1)
    final = blocks[viewed.index(num_layers - 1)]
    bias = getattr(head, "bias", None)
    with torch.inference_mode():
        logits = F.linear(final.to(head.weight.device, head.weight.dtype), head.weight, bias)
    return CapturedSequence(
        features=torch.cat([blocks[viewed.index(x)] for x in layers], dim=1).half(),
        tokens=g.tokens[start:-1].clone(),
        final=final.half(),
        greedy=logits[:, :vocab].argmax(-1).cpu(),
        start=start,
        context=g.prompt_len - 1 - start,
    )
