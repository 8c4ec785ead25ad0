"""The target's own responses, and the features a head trains on captured while they are made.

:func:`generate_captured` runs specstrat's engine, target-only, with a drafter that drafts
nothing and records: the target is viewed through the fused layers plus its last layer (whose
entry is the LM head's input), so the hidden state the engine hands a drafter at admission (the
last prompt position) and after every step (the position that chose the new token) is exactly a
row of :class:`~specstrat.train.CapturedSequence`. No second forward runs. A bare transformers
model has no engine: it generates through ``generate`` and is captured by a second pass
(:func:`~specstrat.train.capture_sequences`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from specstrat._ints import is_int
from specstrat.drafting import DraftAdmission, DrafterContext, SamplingParams, StepOutcome
from specstrat.errors import EngineStateError, InternalError, InvalidConfig
from specstrat.hf import HFCausalLM, chat_request, eos_token_ids, plain_defaults, text_request
from specstrat.relay import RelayPayload
from specstrat.runtime import Request
from specstrat.strategies import NoDrafter, NoDrafterFactory
from specstrat.train.capture import (
    CapturedSequence,
    Generation,
    capture_sequences,
    check_layers,
    check_lm_head,
    raw_model,
    target_vocab,
)

__all__ = ["GenerationCapturer", "fitting_prompts", "generate", "generate_captured"]


def _requests(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[Request]:
    """One request per prompt, the prompt as one user turn through the chat template (plain
    text without one), stopping at the target's EOS ids; prompt ``i`` sampled with
    ``seed + i``."""
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise InvalidConfig(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
    with raw_model(model) as lm:
        eos = eos_token_ids(lm, tokenizer)
    chat = getattr(tokenizer, "chat_template", None) is not None
    out = []
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=temperature, seed=(seed + i) % 2**63)
        rid, turn = f"p{i}", [{"role": "user", "content": prompt}]
        out.append(
            chat_request(tokenizer, rid, turn, max_new_tokens, eos=eos, sampling=sampling)
            if chat
            else text_request(tokenizer, rid, prompt, max_new_tokens, eos=eos, sampling=sampling)
        )
    return out


def fitting_prompts(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int
) -> tuple[str, ...]:
    """The ``prompts`` whose request (chat template included) and ``max_new_tokens`` fit an
    :class:`~specstrat.hf.HFCausalLM`'s positions, in order; every prompt for a bare
    transformers model, which generates without specstrat's context."""
    if not isinstance(model, HFCausalLM):
        return tuple(prompts)
    from specstrat.builtins import NONE
    from specstrat.runtime import kv_reservation

    requests = _requests(model, tokenizer, prompts, max_new_tokens, 0.0, 0)
    reservation = kv_reservation(NONE, 1)
    limit = model.shape.max_positions
    return tuple(
        p for p, r in zip(prompts, requests, strict=True) if reservation.for_request(r) <= limit
    )


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    deadline: float | None = None,
    batch: int = 64,
) -> tuple[Generation, ...]:
    """The target's responses to ``prompts``: greedy at ``temperature=0``, else sampled at it
    with ``seed + i`` for prompt ``i``; stops at the tokenizer's and generation config's EOS.
    Logits past the tokenizer's vocabulary (a padded head) are never chosen. An
    :class:`~specstrat.hf.HFCausalLM` generates through specstrat's own engine, ``batch``
    prompts at a time (greedy output equal to transformers' ``generate``, batched); a bare
    transformers model through its ``generate``, one prompt at a time. Stops early, keeping
    what it has, once ``time.monotonic()`` passes ``deadline`` (checked between batches)."""
    requests = _requests(model, tokenizer, prompts, max_new_tokens, temperature, seed)
    if not requests:
        return ()
    if isinstance(model, HFCausalLM):
        engine = _EngineRun(model, requests, batch, None, model.shape.layers)
        return engine.run(requests, deadline)[0]
    return _transformers_generate(model, tokenizer, requests, deadline)


def generate_captured(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    layers: Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    batch: int = 64,
) -> tuple[tuple[Generation, ...], tuple[CapturedSequence, ...]]:
    """:func:`generate` of ``prompts`` and, for each response in the same order, its
    :class:`~specstrat.train.CapturedSequence` on the fused ``layers``. An
    :class:`~specstrat.hf.HFCausalLM` records them while it generates (see the module
    docstring): the rows cover the last prompt position up to the position that chose the
    last token, one fewer than a second pass, whose extra row predicts past the response. A
    bare transformers model is captured by a second pass. For many batches, one
    :class:`GenerationCapturer` reserves the engine's memory once."""
    capturer = GenerationCapturer(
        model, tokenizer, prompts, layers=layers, max_new_tokens=max_new_tokens, batch=batch
    )
    return capturer.capture(prompts, temperature=temperature, seed=seed)


class GenerationCapturer:
    """:func:`generate_captured` for many batches on one engine, built once.

    The engine and its KV cache are sized for the longest of ``prompts`` (with
    ``max_new_tokens``) and reserved when the capturer is made, so a long run is never refused
    memory half-way: an engine per batch reserved its cache again each time, and memory other
    processes took in between refused a training run 14 minutes in. :meth:`capture` takes any
    prompts that fit that size, at any temperature; ``batch`` requests run at once.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[str],
        *,
        layers: Sequence[int],
        max_new_tokens: int,
        batch: int = 64,
    ) -> None:
        self.layers = tuple(int(x) for x in layers)
        sizing = _requests(model, tokenizer, prompts, max_new_tokens, 0.0, 0)
        with raw_model(model) as lm:
            self.depth = int(lm.config.num_hidden_layers)
            check_layers(self.layers, self.depth)
            self.vocab = target_vocab(lm, tokenizer)
            if sizing and isinstance(model, HFCausalLM):
                check_lm_head(lm, sizing[0].prompt)
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self._engine: _EngineRun | None = None
        if sizing and isinstance(model, HFCausalLM):
            self._engine = _EngineRun(model, sizing, batch, self.layers, self.depth)

    def capture(
        self, prompts: Sequence[str], *, temperature: float = 0.0, seed: int = 0
    ) -> tuple[tuple[Generation, ...], tuple[CapturedSequence, ...]]:
        """The responses to ``prompts`` (prompt ``i`` sampled with ``seed + i``) and their
        captured rows, in order; a prompt longer than the capturer was sized for is refused
        by name before anything runs."""
        requests = _requests(
            self.model, self.tokenizer, prompts, self.max_new_tokens, temperature, seed
        )
        if not requests:
            return (), ()
        if self._engine is None and isinstance(self.model, HFCausalLM):
            raise InvalidConfig(
                f"this GenerationCapturer was built with no prompts, so it has no engine for "
                f"these {len(requests)}; build it with every prompt it will capture"
            )
        if self._engine is None:
            gens = _transformers_generate(self.model, self.tokenizer, requests, None)
            seqs = capture_sequences(self.model, gens, layers=self.layers, vocab_size=self.vocab)
            return gens, seqs
        gens, recorded = self._engine.run(requests, None)
        with raw_model(self.model) as lm:
            head = lm.get_output_embeddings()
            sequences = tuple(
                _sequence(g, recorded, self.layers, self.depth, head, self.vocab) for g in gens
            )
        return gens, sequences


@dataclass(frozen=False, slots=True)
class _Rows:
    """One request's recorded hidden states: ``start`` is its last prompt position, ``parts``
    the ``[1, W]`` rows from there on, in order."""

    start: int
    parts: list[torch.Tensor] = field(default_factory=list)


#: Released requests, keyed by (last prompt position, committed tokens): two requests with one
#: key have one prompt and one response, so their rows are equal too.
_Recorded = list[tuple[tuple[int, tuple[int, ...]], _Rows]]


class _RecordingDrafter(NoDrafter):
    """Drafts nothing; keeps each request's hidden states and, at release, its committed
    tokens (what the slot table holds: the prompt and every token but the last)."""

    def __init__(self, context: DrafterContext, done: _Recorded) -> None:
        self.context, self.done = context, done
        self.open: dict[int, _Rows] = {}

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        """The last prompt position's hidden state starts each request's rows."""
        if admission.hidden is None:
            raise EngineStateError(
                "capture during generation needs a local prefill; a PREBUILT admission carries "
                "no hidden states (run generate_captured on one engine, not disaggregated)"
            )
        hidden = admission.hidden.float().cpu()
        lengths = admission.seq_lens.tolist()
        for i, slot in enumerate(admission.slots):
            self.open[slot] = _Rows(start=int(lengths[i]) - 1, parts=[hidden[i : i + 1]])
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
class _RecordingDrafterFactory(NoDrafterFactory):
    """The recording drafter's factory: released requests go to ``done`` (one run's output
    list, shared by reference: a pickled copy would record elsewhere, so this factory is for
    one process's engine, not for disaggregation)."""

    done: _Recorded = field(default_factory=list, compare=False)

    def create_drafter(self, context: DrafterContext) -> _RecordingDrafter:
        """A recorder writing to ``done``."""
        return _RecordingDrafter(context, self.done)


class _EngineRun:
    """Specstrat's engine, target-only, sized for ``sizing`` (the longest prompt plus
    ``max_new_tokens``), ``batch`` requests at once; with ``layers``, the target viewed through
    them plus its last layer and every request's rows recorded, keyed by committed tokens."""

    def __init__(
        self,
        model: HFCausalLM,
        sizing: Sequence[Request],
        batch: int,
        layers: tuple[int, ...] | None,
        num_layers: int,
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
        self.recorder = _RecordingDrafterFactory()
        algo, target = NONE, model
        if layers is not None:
            algo = replace(NONE, drafter=self.recorder)
            target = model.with_feature_layers(_with_last(layers, num_layers))
        config = EngineConfig(context_len=self.context, max_running_requests=batch)
        self.engine = Engine(algo, ModelSet(target=target), config)
        self.batch, self.runs = batch, 0

    def run(
        self, requests: Sequence[Request], deadline: float | None
    ) -> tuple[tuple[Generation, ...], dict[tuple[int, tuple[int, ...]], _Rows]]:
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


def _with_last(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """The distinct ``layers`` (a tiny model's default repeats one) and the last layer (the LM
    head's input), each once, in that order."""
    return tuple(dict.fromkeys((*layers, num_layers - 1)))


def _sequence(
    g: Generation,
    recorded: dict[tuple[int, tuple[int, ...]], _Rows],
    layers: tuple[int, ...],
    num_layers: int,
    head: Any,
    vocab: int,
) -> CapturedSequence:
    """``g``'s recorded rows as a :class:`CapturedSequence`: the fused layers' part, the LM
    head's input (the last layer's part) and its greedy choice over the first ``vocab`` ids."""
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
    viewed = _with_last(layers, num_layers)
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
    )


def _transformers_generate(
    model: Any,
    tokenizer: Any,
    requests: Sequence[Request],
    deadline: float | None,
) -> tuple[Generation, ...]:
    """``requests`` (at least one, all at one temperature) through transformers' ``generate``,
    one at a time (a bare model), each sampled with its own seed."""
    from transformers import GenerationConfig

    out: list[Generation] = []
    with raw_model(model) as lm, plain_defaults(lm), torch.inference_mode():
        vocab, width = target_vocab(lm, tokenizer), int(lm.get_output_embeddings().weight.shape[0])
        temperature = requests[0].sampling.temperature
        sampled = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=requests[0].max_new_tokens,
            eos_token_id=sorted(eos_token_ids(lm, tokenizer)) or None,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            suppress_tokens=list(range(vocab, width)) or None,
            **(sampled if temperature > 0 else {"do_sample": False}),
        )
        device = next(lm.parameters()).device
        for request in requests:
            if deadline is not None and time.monotonic() > deadline:
                break
            ids = torch.tensor([list(request.prompt)], device=device)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(request.sampling.seed)
                done = lm.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=config
                )
            out.append(Generation(tokens=done[0].cpu(), prompt_len=ids.shape[1]))
    return tuple(out)
