"""The prebuilt decode batch that the decode side of disaggregation hands to a builder.

Batching happens once, when the transfer is received: every transferred field arrives here as
one batched tensor, so a :class:`~specstrat.protocols.DisaggDraftBuilder` never loops over
requests to stack tensors (the engines' per-request ``torch.as_tensor`` + ``torch.stack`` is what
crashed on empty batches and missing hidden states).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specstrat.errors import InvalidConfig
from specstrat.relay import RelayPayload

__all__ = ["PrebuiltBatch"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PrebuiltBatch:
    """A received batch of requests, ready for PREBUILT admission on the decode side.

    ``rids`` names each request (for error messages); ``slots`` ``[bs]`` int64 are their
    request-pool indices (never 0: row 0 is the padding row); ``seq_lens`` ``[bs]`` int are the
    prefix lengths whose KV was transferred. ``topk_p``/``topk_index`` ``[bs, k]`` and
    ``hidden_states`` ``[bs, H]`` are present when the algorithm's capabilities say they travel.
    """

    rids: tuple[str, ...]
    slots: torch.Tensor
    seq_lens: torch.Tensor
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        bs = len(self.rids)
        if len(set(self.rids)) != bs:
            raise InvalidConfig(f"rids={self.rids!r} has duplicates; every request id is unique")
        if not isinstance(self.slots, torch.Tensor) or self.slots.dim() != 1:
            raise InvalidConfig(
                f"slots={self.slots!r} must be a 1-D integer tensor of request-pool indices"
            )
        if self.slots.dtype.is_floating_point or self.slots.shape[0] != bs:
            raise InvalidConfig(
                f"slots has dtype={self.slots.dtype} and {self.slots.shape[0]} rows; "
                f"it must be an integer tensor with one row per rid ({bs})"
            )
        if self.slots.device.type == "cpu" and bs and int(self.slots.min()) < 1:
            raise InvalidConfig(
                f"slots={self.slots.tolist()} contains a slot < 1; row 0 is the padding row, "
                "real requests use slots 1..max_running_requests"
            )
        # Shapes, dtypes, rows and device of the transferred fields share the relay's rules.
        relay = RelayPayload(
            seq_lens=self.seq_lens,
            topk_p=self.topk_p,
            topk_index=self.topk_index,
            hidden_states=self.hidden_states,
        )
        if relay.num_rows != bs:
            raise InvalidConfig(
                f"seq_lens has {relay.num_rows} rows but rids has {bs}; one row per request"
            )
        if (self.topk_p is None) != (self.topk_index is None):
            raise InvalidConfig(
                "topk_p and topk_index travel together; got only "
                + ("topk_p" if self.topk_p is not None else "topk_index")
            )
        if (
            self.topk_p is not None
            and self.topk_index is not None
            and self.topk_p.shape != self.topk_index.shape
        ):
            raise InvalidConfig(
                f"topk_p.shape={tuple(self.topk_p.shape)} != "
                f"topk_index.shape={tuple(self.topk_index.shape)}; both are [bs, k]"
            )

    @property
    def bs(self) -> int:
        """Number of requests in the batch."""
        return len(self.rids)
