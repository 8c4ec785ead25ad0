"""Forward modes and the batch a model forward consumes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from specstrat.kernels import VerifyMetadata

__all__ = ["ForwardBatch", "ForwardMode", "TreeAttention"]


class ForwardMode(enum.Enum):
    """What a forward computes; each mode builds its attention metadata its own way.

    EXTEND: prefill of prompts (ragged). DECODE: one token per request. TARGET_VERIFY: ``T``
    tokens per request (the bonus token plus ``T - 1`` drafts). DRAFT_EXTEND: the draft
    model catching up on verified tokens (ragged). PREBUILT: admission of requests whose KV was
    computed elsewhere (disaggregation), no forward.
    """

    EXTEND = "extend"
    DECODE = "decode"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    PREBUILT = "prebuilt"


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeAttention:
    """Tree attention over the last ``W`` key columns of each request (a draft tree).

    ``start`` ``[bs]``: each request's first tree column; ``mask`` ``[bs, max_q, W]`` bool: query
    ``j`` of request ``i`` sees tree column ``start[i] + c`` only where ``mask[i, j, c]`` (its
    ancestors and itself). Columns before ``start`` (the committed prefix) stay visible.
    """

    start: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardBatch:
    """Flat inputs of one forward plus the metadata its attention reads.

    ``input_ids``, ``positions`` and ``out_cache_loc`` (KV indices the new tokens write) have one
    entry per token, padding rows included in the graph form. ``max_q``/``max_k`` are host bounds
    on per-request query and key lengths (from CPU mirrors, never read back from the device).
    ``tree``: tree attention for draft trees (``None``: causal over the new tokens).
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    metadata: VerifyMetadata
    max_q: int
    max_k: int
    tree: TreeAttention | None = None
