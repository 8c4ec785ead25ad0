"""Disaggregation draft builders: how the decode side rebuilds draft state from a prebuilt batch.

Every builder works on batched tensors (the transfer was batched once, at receive), so its cost
is a constant number of tensor ops whatever the batch size, and an empty batch is just a batch of
zero rows. Given the engine's relay, each builder publishes the batch's sequence lengths and
stashes its payload at the requests' pool slots, so the first decode step resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.batch import PrebuiltBatch
from specstrat.errors import DisaggError, InvalidConfig
from specstrat.protocols import FutureMap
from specstrat.relay import RelayPayload

__all__ = [
    "DflashDisaggDraftBuilder",
    "DflashDraftInput",
    "DsparkDisaggDraftBuilder",
    "DsparkDraftInput",
    "EagleDisaggDraftBuilder",
    "EagleDraftInput",
    "NoDraftStateDisaggDraftBuilder",
]


@dataclass(frozen=True, slots=True)
class EagleDraftInput:
    """EAGLE's draft state: the draft head's top-k, the target's hidden state, the bonus token."""

    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor
    verified_id: torch.Tensor
    seq_lens: torch.Tensor


@dataclass(frozen=True, slots=True)
class DsparkDraftInput:
    """DSPARK's draft state: the bonus token and the sequence length of each request."""

    bonus_tokens: torch.Tensor
    seq_lens: torch.Tensor


@dataclass(frozen=True, slots=True)
class DflashDraftInput:
    """DFLASH's draft state on the decode side.

    The draft KV is not transferred, so ``draft_seq_lens`` starts at 0 for every request: the
    first draft forward extends the draft KV over the whole prefix (DRAFT_EXTEND) before drafting
    from ``verified_id``.
    """

    verified_id: torch.Tensor
    seq_lens: torch.Tensor
    draft_seq_lens: torch.Tensor


def _checked_last_tokens(batch: PrebuiltBatch, last_tokens: torch.Tensor) -> torch.Tensor:
    if not isinstance(batch, PrebuiltBatch):
        raise InvalidConfig(f"batch={type(batch).__name__}; pass a PrebuiltBatch")
    if (
        not isinstance(last_tokens, torch.Tensor)
        or last_tokens.dim() != 1
        or last_tokens.dtype.is_floating_point
        or last_tokens.shape[0] != batch.bs
    ):
        got = (
            f"{last_tokens.dtype} {tuple(last_tokens.shape)}"
            if isinstance(last_tokens, torch.Tensor)
            else type(last_tokens).__name__
        )
        raise InvalidConfig(
            f"last_tokens is {got}; it must be a 1-D integer tensor with one token per request "
            f"(bs={batch.bs})"
        )
    return last_tokens


def _relay(batch: PrebuiltBatch, future_map: FutureMap | None, payload: RelayPayload) -> None:
    """Publish the batch's seq lens and stash ``payload`` at its slots (no relay: nothing)."""
    if future_map is None:
        return
    future_map.publish(batch.slots, batch.seq_lens)
    future_map.stash(batch.slots, payload)


def _require(batch: PrebuiltBatch, algorithm: str, *names: str) -> None:
    missing = [name for name in names if getattr(batch, name) is None]
    if missing and batch.bs:
        raise DisaggError(
            f"requests {list(batch.rids)} arrived without {', '.join(missing)}; {algorithm} "
            "carries them to the decode side: make the prefill side send them"
        )


@dataclass(frozen=True, slots=True)
class EagleDisaggDraftBuilder:
    """EAGLE/EAGLE3: topk_p, topk_index and hidden states travel; the bonus token is last_tokens."""

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: FutureMap | None
    ) -> EagleDraftInput:
        """EAGLE draft input from the batched transfer (no per-request stacking)."""
        last_tokens = _checked_last_tokens(batch, last_tokens)
        _require(batch, "EAGLE", "topk_p", "topk_index", "hidden_states")
        topk_p, topk_index, hidden = batch.topk_p, batch.topk_index, batch.hidden_states
        if topk_p is None or topk_index is None or hidden is None:  # only an empty batch
            empty = torch.empty((0, 0), device=batch.device)
            topk_p, topk_index, hidden = empty, empty.long(), empty
        # Only fields that arrived are relayed: an empty batch may lack them (nothing to carry).
        payload = RelayPayload(
            bonus_tokens=last_tokens,
            topk_p=batch.topk_p,
            topk_index=batch.topk_index,
            hidden_states=batch.hidden_states,
        )
        _relay(batch, future_map, payload)
        return EagleDraftInput(topk_p, topk_index, hidden, last_tokens, batch.seq_lens)


@dataclass(frozen=True, slots=True)
class DsparkDisaggDraftBuilder:
    """DSPARK: only the bonus token and the sequence length travel."""

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: FutureMap | None
    ) -> DsparkDraftInput:
        """DSPARK draft input: ``last_tokens`` as bonus tokens, with the batch's seq lens."""
        last_tokens = _checked_last_tokens(batch, last_tokens)
        _relay(batch, future_map, RelayPayload(bonus_tokens=last_tokens))
        return DsparkDraftInput(last_tokens, batch.seq_lens)


@dataclass(frozen=True, slots=True)
class DflashDisaggDraftBuilder:
    """DFLASH: the draft KV is rebuilt on the decode side, starting from length 0."""

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: FutureMap | None
    ) -> DflashDraftInput:
        """DFLASH draft input: ``last_tokens``, the seq lens, and zero draft-KV lengths."""
        last_tokens = _checked_last_tokens(batch, last_tokens)
        _relay(batch, future_map, RelayPayload(bonus_tokens=last_tokens))
        return DflashDraftInput(last_tokens, batch.seq_lens, torch.zeros_like(batch.seq_lens))


@dataclass(frozen=True, slots=True)
class NoDraftStateDisaggDraftBuilder:
    """For algorithms with no draft state to carry: returns ``None`` (plain decode).

    It still relays the bonus tokens and seq lens, so the first step resolves ``last_tokens``.
    """

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: FutureMap | None
    ) -> None:
        """Always ``None``, after validating the inputs."""
        last_tokens = _checked_last_tokens(batch, last_tokens)
        _relay(batch, future_map, RelayPayload(bonus_tokens=last_tokens))
        return None
