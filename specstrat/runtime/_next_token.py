"""A model's logits for the token after each of some prompts, from one prefill forward."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.models import CausalLM
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._worker import ModelWorker

__all__ = ["next_token_logits"]


def next_token_logits(model: CausalLM, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """``model``'s logits for the token after each prompt, ``[len(prompts), vocab_size]`` on the
    model's device, as the engine computes them at prefill: one EXTEND forward of every prompt
    together, on a request pool and KV cache of their own that are freed before it returns.

    Raises :class:`~specstrat.errors.InvalidConfig` for an empty list, an empty prompt or a
    token id outside the model's vocabulary.
    """
    if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence) or not prompts:
        raise InvalidConfig(
            f"prompts={prompts!r} must be a non-empty sequence of prompts (sequences of token ids)"
        )
    vocab = model.shape.vocab_size
    rows: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if (
            isinstance(prompt, str | bytes)
            or not isinstance(prompt, Sequence)
            or not prompt
            or any(not is_int(t) or not 0 <= t < vocab for t in prompt)
        ):
            raise InvalidConfig(
                f"prompts[{i}]={prompt!r} must be a non-empty sequence of token ids in "
                f"0..{vocab - 1}"
            )
        rows.append(list(prompt))
    lengths = [len(r) for r in rows]
    worker = ModelWorker(
        model,
        max_running_requests=len(rows),
        context_len=max(lengths) + 1,
        max_total_tokens=sum(lengths),
    )
    slots = [worker.alloc_request() for _ in rows]
    ends = list(itertools.accumulate(lengths))
    try:
        logits, _ = worker.forward(
            ForwardMode.EXTEND, slots, rows, logit_rows=[end - 1 for end in ends]
        )
    finally:
        for slot in slots:
            worker.free_request(slot)
    return logits
