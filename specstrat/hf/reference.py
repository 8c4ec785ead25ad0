"""Lossless against a reference nobody here wrote: transformers' own greedy ``generate``.

Outputs are compared token for token. At the first position where they differ, the divergence
is a **certified numerical tie** when, recomputed by transformers' own forward of the common
prefix, the two tokens' float32 logits are both within ``TIE_EPSILON * max|logit|`` of the top
logit: a batched verify forward and a one-token decode sum in different orders, and their drift
can flip such a pair. Measured in float32 on six tiny families (llama, qwen2, qwen3, mistral,
gpt2, gemma2; 216 prefix/width/seed configurations): at most 4.5e-6 of max|logit| between a
verify and one-token decodes, 3.9e-6 between the engine and transformers' forward; the tests hold
both to 2e-5, and ``TIE_EPSILON`` sits 5x above that. The rest of that request is not
compared; the count is reported as ``ties``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specstrat.errors import InvalidConfig
from specstrat.hf.adapter import HFCausalLM
from specstrat.runtime import Request

__all__ = [
    "TIE_EPSILON",
    "ReferenceCheck",
    "certified_tie",
    "compare",
    "generate_reference",
    "generation_config",
    "plain_defaults",
]

#: Relative logit gap below which a divergence is a tie (see the module docstring).
TIE_EPSILON = 1e-4


@dataclass(frozen=True, slots=True)
class ReferenceCheck:
    """How a run's outputs compare with the reference: ``lossless`` is true only when every
    divergence is a certified tie; ``mismatches`` names each other one (rid, position, tokens)."""

    lossless: bool
    requests: int
    compared_tokens: int
    ties: int
    mismatches: tuple[str, ...]

    def line(self) -> str:
        """One line for a summary."""
        verdict = "identical" if self.lossless else "DIFFERENT"
        tie = f", {self.ties} certified tie(s)" if self.ties else ""
        bad = f"; {'; '.join(self.mismatches[:3])}" if self.mismatches else ""
        return f"{verdict} over {self.requests} requests, {self.compared_tokens} tokens{tie}{bad}"


def generation_config(
    lm: HFCausalLM,
    max_new_tokens: int,
    stop_token_ids: Iterable[int] = (),
    *,
    pad_token_id: int | None = None,
    prompt_lookup_num_tokens: int = 0,
    num_assistant_tokens: int = 0,
) -> Any:
    """The ``GenerationConfig`` of a reference run: greedy, ``max_new_tokens``, the stop ids as
    EOS, a padded LM head's ids past the tokenizer's vocabulary suppressed (transformers'
    ``suppress_tokens``: the engine never uses them) and, if asked, transformers' own prompt
    lookup with that many candidate tokens, or ``num_assistant_tokens`` drafts per step from an
    assistant model (a constant number: no schedule, no confidence cut). Use it inside
    :func:`plain_defaults`."""
    from transformers import GenerationConfig

    stops = sorted(stop_token_ids)
    padded = list(range(lm.shape.vocab_size, lm.head_width))
    extra: dict[str, Any] = (
        {"prompt_lookup_num_tokens": prompt_lookup_num_tokens} if prompt_lookup_num_tokens else {}
    )
    if num_assistant_tokens:
        extra.update(
            num_assistant_tokens=num_assistant_tokens,
            num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0,
        )
    return GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stops or None,
        pad_token_id=pad_token_id if pad_token_id is not None else (stops or [0])[0],
        suppress_tokens=padded or None,
        **extra,
    )


def generate_reference(
    lm: HFCausalLM,
    requests: Sequence[Request],
    *,
    pad_token_id: int | None = None,
    prompt_lookup_num_tokens: int = 0,
) -> dict[str, list[int]]:
    """Each request's output from transformers' greedy ``generate`` at batch size 1
    (:func:`generation_config`; the model's own generation defaults, such as a repetition
    penalty, are not applied); ``prompt_lookup_num_tokens``: transformers' prompt lookup."""
    out: dict[str, list[int]] = {}
    device = next(lm.parameters()).device
    with lm.reference() as model, plain_defaults(model), torch.inference_mode():
        for r in requests:
            config = generation_config(
                lm,
                r.max_new_tokens,
                r.stop_token_ids,
                pad_token_id=pad_token_id,
                prompt_lookup_num_tokens=prompt_lookup_num_tokens,
            )
            ids = torch.tensor([list(r.prompt)], device=device)
            done = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config
            )
            out[r.rid] = [int(t) for t in done[0, len(r.prompt) :]]
    return out


@contextlib.contextmanager
def plain_defaults(model: Any) -> Iterator[None]:
    """``model.generation_config`` replaced by transformers' plain defaults for the block:
    ``generate`` fills every field a passed config leaves unset from the model's own, so without
    this a model's EOS ids would end a request that has none, and its repetition penalty or
    sampling defaults would apply."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        model.generation_config = saved


def certified_tie(lm: HFCausalLM, context: Sequence[int], a: int, b: int) -> bool:
    """Whether tokens ``a`` and ``b`` tie after ``context``: transformers' forward gives both
    logits within ``TIE_EPSILON * max|logit|`` of the top one. The forward runs in the model's
    dtype: the epsilon is justified for float32 (bf16 and fp16 round logits far coarser than
    it, so a tie found there certifies nothing; the GPU check reports such runs, not passes)."""
    device = next(lm.parameters()).device
    with lm.reference() as model, torch.inference_mode():
        logits = model(torch.tensor([list(context)], device=device)).logits[0, -1]
    logits = logits[: lm.shape.vocab_size].float()
    top, bound = logits.max(), TIE_EPSILON * logits.abs().max()
    return bool((top - logits[a] <= bound) & (top - logits[b] <= bound))


def compare(
    lm: HFCausalLM,
    requests: Sequence[Request],
    outputs: Mapping[str, Sequence[int]],
    reference: Mapping[str, Sequence[int]],
) -> ReferenceCheck:
    """``outputs`` against ``reference`` for each request in ``reference``."""
    compared = ties = 0
    mismatches: list[str] = []
    by_rid = {r.rid: r for r in requests}
    missing = sorted(set(reference) - set(by_rid))
    if missing:
        raise InvalidConfig(
            f"reference has request ids {missing} that requests do not; pass the requests the "
            "reference was generated from"
        )
    for rid, want in reference.items():
        got = list(outputs.get(rid, ()))
        first = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)
        if first is None:
            compared += min(len(got), len(want))
            if len(got) != len(want):
                mismatches.append(f"{rid}: {len(got)} tokens vs the reference's {len(want)}")
            continue
        compared += first
        context = [*by_rid[rid].prompt, *want[:first]]
        if certified_tie(lm, context, got[first], want[first]):
            ties += 1
        else:
            mismatches.append(f"{rid}: position {first}: {got[first]} vs {want[first]}")
    return ReferenceCheck(
        lossless=not mismatches,
        requests=len(reference),
        compared_tokens=compared,
        ties=ties,
        mismatches=tuple(mismatches),
    )
