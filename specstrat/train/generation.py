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
from typing import Any

import torch

from specstrat._ints import is_int
from specstrat.drafting import SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.hf import HFCausalLM, chat_request, eos_token_ids, plain_defaults, text_request
from specstrat.runtime import Request
from specstrat.train._recording import EngineRun, recorded_sequence
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
        engine = EngineRun(model, requests, batch, None, model.shape.layers)
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
    ``prompt_rows``: each sequence starts at the first prompt position, the prompt's rows its
    ``context`` (what a head that attends over the context trains on).
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
        prompt_rows: bool = False,
    ) -> None:
        self.layers, self.prompt_rows = tuple(int(x) for x in layers), prompt_rows
        sizing = _requests(model, tokenizer, prompts, max_new_tokens, 0.0, 0)
        with raw_model(model) as lm:
            self.depth = int(lm.config.num_hidden_layers)
            check_layers(self.layers, self.depth)
            self.vocab = target_vocab(lm, tokenizer)
            if sizing and isinstance(model, HFCausalLM):
                check_lm_head(lm, sizing[0].prompt)
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        self._engine: EngineRun | None = None
        if sizing and isinstance(model, HFCausalLM):
            self._engine = EngineRun(
                model, sizing, batch, self.layers, self.depth, prompt_rows=prompt_rows
            )

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
            seqs = capture_sequences(
                self.model,
                gens,
                layers=self.layers,
                vocab_size=self.vocab,
                prompt_rows=self.prompt_rows,
            )
            return gens, seqs
        gens, recorded = self._engine.run(requests, None)
        with raw_model(self.model) as lm:
            head = lm.get_output_embeddings()
            sequences = tuple(
                recorded_sequence(
                    g, recorded, self.layers, self.depth, head, self.vocab, self.prompt_rows
                )
                for g in gens
            )
        return gens, sequences


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
