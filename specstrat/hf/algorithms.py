"""Algorithms that run on any Hugging Face model without trained draft weights."""

from __future__ import annotations

from dataclasses import replace

from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm
from specstrat.builtins import NGRAM, STANDALONE
from specstrat.errors import InvalidConfig
from specstrat.strategies.early_exit import EarlyExitDrafterFactory

__all__ = ["EARLY_EXIT", "NGRAM_RAGGED", "early_exit_algorithm"]


def early_exit_algorithm(exit_layer: int) -> SpecAlgorithm[None]:
    """Self-speculation by early exit at ``exit_layer``: STANDALONE's relay, verify policy and
    acceptance (rejection sampling; greedy for temperature 0), drafting with the target's own
    first ``exit_layer`` layers (:class:`~specstrat.strategies.EarlyExitDrafterFactory`)."""
    if not is_int(exit_layer):
        raise InvalidConfig(f"exit_layer={exit_layer!r} must be an int")
    return replace(
        STANDALONE, name=f"EARLY_EXIT_{exit_layer}", drafter=EarlyExitDrafterFactory(exit_layer)
    )


#: Early exit at layer 8 (of SmolLM2-135M's 30; see the docs' acceptance table per layer).
EARLY_EXIT = early_exit_algorithm(8)


#: Prompt lookup with ragged verify: a step verifies only what the drafter proposed for each
#: request (SGLang 0.5.23's NGRAM row has no ragged verify; the composition of
#: docs/concepts/builtins.md).
NGRAM_RAGGED = replace(
    NGRAM,
    name="NGRAM_RAGGED",
    capabilities=replace(NGRAM.capabilities, supports_ragged_verify=True),
)
