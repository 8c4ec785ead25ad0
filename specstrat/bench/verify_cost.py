"""What a wider verify costs: verify(T) / decode for T = 2..9, in specstrat and in transformers.

An algorithm that verifies T tokens a step pays one T-token forward where plain decoding pays a
one-token forward; on a memory-bound machine the ratio stays near 1 until compute catches up.
:func:`measure_verify_cost` times, after one prompt's prefill, a DECODE forward and a
TARGET_VERIFY forward of each T through specstrat's model worker (paged attention through the
adapter), and, for a Hugging Face target, the same forwards through transformers' own model and
KV cache (``DynamicCache``, cropped back after each); samples interleave (every kind beside the
others, round after round) and the ratio is of medians. ``specstrat bench`` puts it in its
JSON's ``environment``: ``verify_cost`` (specstrat's map from T to the ratio),
``verify_cost_transformers`` (transformers', or ``null`` for a model transformers does not run)
and ``verify_cost_vs_transformers`` (specstrat's ratio over transformers', per T).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specstrat.errors import InvalidConfig
from specstrat.models import CausalLM
from specstrat.runtime import forward_seconds

__all__ = ["VERIFY_TOKENS", "VerifyCost", "measure_verify_cost"]

#: The verifies measured: T = 2..9 tokens a request (``--draft-tokens`` D = T: D - 1
#: drafts plus the bonus token).
VERIFY_TOKENS = tuple(range(2, 10))


@dataclass(frozen=True, slots=True)
class VerifyCost:
    """verify(T) / decode per T (keys are T as strings, JSON's way): ``specstrat`` always,
    ``transformers`` for a Hugging Face target (else ``None``), ``samples`` of each forward."""

    specstrat: dict[str, float]
    transformers: dict[str, float] | None
    samples: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON keys of a bench run's ``environment``."""
        versus = None
        if self.transformers is not None:
            versus = {t: r / self.transformers[t] for t, r in self.specstrat.items()}
        return {
            "verify_cost": self.specstrat,
            "verify_cost_transformers": self.transformers,
            "verify_cost_vs_transformers": versus,
            "verify_cost_samples": self.samples,
        }


def _theirs(target: Any, prompt: Sequence[int]) -> Callable[[int], float]:
    """Seconds of one transformers forward of ``t`` tokens after ``prompt``, its own cache."""
    from transformers import DynamicCache

    with target.reference() as model, torch.inference_mode():
        cache = DynamicCache(config=model.config)
        device = next(model.parameters()).device
        model(torch.tensor([list(prompt)], device=device), cache=cache, use_cache=True)
    first = int(prompt[0])

    def run(tokens: int) -> float:
        with target.reference() as model, torch.inference_mode():  # switched outside the timing
            ids = torch.full((1, tokens), first, device=device)
            start = time.perf_counter()
            model(ids, cache=cache, use_cache=True)
            elapsed = time.perf_counter() - start
        cache.crop(-tokens)  # drop what this forward appended
        return elapsed

    return run


def measure_verify_cost(
    target: CausalLM,
    prompt: Sequence[int],
    *,
    tokens_per_req: Sequence[int] = VERIFY_TOKENS,
    samples: int = 5,
) -> VerifyCost:
    """verify(T) / decode after ``prompt`` (its end, if with T tokens it would pass the model's
    positions) for each T in ``tokens_per_req``, medians of ``samples``
    interleaved forwards each (after one untimed warm-up round); transformers' too when
    ``target`` is a Hugging Face model (:class:`~specstrat.hf.HFCausalLM`)."""
    from specstrat.hf import HFCausalLM

    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise InvalidConfig(f"samples={samples!r} must be an int >= 1")
    bad = [t for t in tokens_per_req if isinstance(t, bool) or not isinstance(t, int) or t < 2]
    if not tokens_per_req or bad:
        raise InvalidConfig(
            f"tokens_per_req={tuple(tokens_per_req)!r} must be ints >= 2 (T: drafts + bonus)"
        )
    if not prompt:
        raise InvalidConfig("prompt is empty; pass the token ids a verify runs after")
    room = target.shape.max_positions - max(tokens_per_req) - 1
    if room < 1:
        raise InvalidConfig(
            f"tokens_per_req up to {max(tokens_per_req)} leave no room for a prompt in the "
            f"model's {target.shape.max_positions} positions; measure narrower verifies"
        )
    prompt = list(prompt)[-room:]  # the prompt's end, where it would pass the model's positions
    sides = {"specstrat": forward_seconds(target, prompt, max(tokens_per_req))}
    if isinstance(target, HFCausalLM):
        sides["transformers"] = _theirs(target, prompt)
    times: dict[tuple[str, int], list[float]] = {}
    for round_ in range(samples + 1):
        for tokens in (1, *tokens_per_req):
            for side, run in sides.items():
                elapsed = run(tokens)
                if round_:  # the first round warms up
                    times.setdefault((side, tokens), []).append(elapsed)
    median = {key: statistics.median(v) for key, v in times.items()}
    ratios = {
        side: {str(t): median[(side, t)] / median[(side, 1)] for t in tokens_per_req}
        for side in sides
    }
    return VerifyCost(ratios["specstrat"], ratios.get("transformers"), samples)
