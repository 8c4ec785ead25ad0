"""A model's outputs against its declared :class:`~specstrat.models.ModelShape`.

A model that returns logits wider than ``vocab_size`` (a padded LM head) or hidden states of
another width than ``hidden_size`` would otherwise end in an ``IndexError`` far from the model,
or in an error blamed on the drafter that read them. The worker checks every forward's outputs
(shapes only: no value is read, so it costs no host sync), so the first forward of each model,
target and drafts alike, refuses a model that disagrees with its shape.
"""

from __future__ import annotations

import torch

from specstrat.contracts import describe
from specstrat.errors import ModelShapeError
from specstrat.models import ModelShape

__all__ = ["check_model_outputs"]


def check_model_outputs(
    model: object,
    shape: ModelShape,
    rows: int,
    logits: object,
    hidden: object,
    logit_rows: int | None = None,
) -> None:
    """``logits`` are ``[rows, shape.vocab_size]`` (``[logit_rows, ...]`` when the forward asked
    for those rows' logits only) and ``hidden`` ``[rows, shape.hidden_size]`` tensors; anything
    else is a ModelShapeError naming the model, the width and the fix."""
    name = type(model).__name__
    for what, value, width, field in (
        ("logits", logits, shape.vocab_size, "vocab_size"),
        ("hidden states", hidden, shape.hidden_size, "hidden_size"),
    ):
        wanted = logit_rows if logit_rows is not None and what == "logits" else rows
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ModelShapeError(
                f"model={name} returned {what} of {describe(value)} for {rows} tokens; a "
                f"CausalLM returns {what} [tokens, {field}={width}]"
            )
        if value.shape[0] != wanted:
            asked = "" if wanted == rows else f" (forward_rows asked for {wanted} rows)"
            raise ModelShapeError(
                f"model={name} returned {value.shape[0]} rows of {what} for {rows} tokens"
                f"{asked}; a CausalLM returns one row per token, a RowLogitsLM's forward_rows "
                "one row of logits per asked row"
            )
        if value.shape[1] != width:
            raise ModelShapeError(
                f"model={name} returned {what} {value.shape[1]} wide but its ModelShape."
                f"{field}={width}; declare {field}={value.shape[1]} in the model's shape, or "
                f"return {what} of width {width}"
                + (" (slice a padded LM head to the vocabulary)" if field == "vocab_size" else "")
            )
