"""Disaggregation builders: batched draft inputs, the relay, and missing-field errors."""

from typing import Any

import pytest
import torch
from hypothesis import given

from specstrat import Capabilities, DisaggError, PrebuiltBatch
from specstrat.strategies import (
    DflashDisaggDraftBuilder,
    DsparkDisaggDraftBuilder,
    EagleDisaggDraftBuilder,
    NoDraftStateDisaggDraftBuilder,
    SlotFutureMapFactory,
)
from specstrat.testing import prebuilt_batches

EAGLE_CAPS = Capabilities(has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True)


def eagle_batch(bs: int, *, hidden: bool = True) -> PrebuiltBatch:
    return PrebuiltBatch(
        rids=tuple(f"r{i}" for i in range(bs)),
        slots=torch.arange(1, bs + 1),
        seq_lens=torch.arange(bs) + 5,
        topk_p=torch.rand(bs, 4),
        topk_index=torch.randint(0, 100, (bs, 4)),
        hidden_states=torch.randn(bs, 8) if hidden else None,
    )


def test_eagle_builder_passes_batched_fields_through() -> None:
    """EAGLE's draft input is the batch's tensors plus last_tokens as verified ids."""
    batch, last = eagle_batch(3), torch.tensor([7, 8, 9])
    out = EagleDisaggDraftBuilder().build_disagg_draft_input(batch, last, None)
    assert out.topk_p is batch.topk_p
    assert out.hidden_states is batch.hidden_states
    assert out.verified_id is last
    assert out.seq_lens is batch.seq_lens


def test_eagle_builder_names_requests_missing_hidden_states() -> None:
    """A batch without hidden states raises DisaggError listing every request id."""
    with pytest.raises(DisaggError, match=r"requests \['r0', 'r1'\] arrived without hidden_states"):
        EagleDisaggDraftBuilder().build_disagg_draft_input(
            eagle_batch(2, hidden=False), torch.tensor([1, 2]), None
        )


def test_empty_batch_is_well_defined_for_every_builder() -> None:
    """bs=0 builds an empty draft input (or None) without touching torch.stack."""
    empty = PrebuiltBatch(
        rids=(), slots=torch.zeros(0, dtype=torch.int64), seq_lens=torch.zeros(0, dtype=torch.int64)
    )
    last = torch.zeros(0, dtype=torch.int64)
    eagle = EagleDisaggDraftBuilder().build_disagg_draft_input(empty, last, None)
    assert eagle.topk_p.shape[0] == 0
    assert eagle.verified_id.shape == (0,)
    assert (
        DsparkDisaggDraftBuilder().build_disagg_draft_input(empty, last, None).bonus_tokens.numel()
        == 0
    )
    assert (
        DflashDisaggDraftBuilder()
        .build_disagg_draft_input(empty, last, None)
        .draft_seq_lens.numel()
        == 0
    )
    none_builder: Any = NoDraftStateDisaggDraftBuilder()
    assert none_builder.build_disagg_draft_input(empty, last, None) is None


def test_dflash_starts_draft_kv_from_zero() -> None:
    """DFLASH's decode side rebuilds draft KV: draft_seq_lens start at 0 for every request."""
    batch = PrebuiltBatch(
        rids=("a", "b"), slots=torch.tensor([3, 1]), seq_lens=torch.tensor([10, 4])
    )
    out = DflashDisaggDraftBuilder().build_disagg_draft_input(batch, torch.tensor([5, 6]), None)
    assert out.draft_seq_lens.tolist() == [0, 0]
    assert out.seq_lens.tolist() == [10, 4]


def test_builder_relays_eagle_state_at_slots() -> None:
    """Given a relay, the builder publishes seq lens and stashes every field at the slots."""
    batch, last = eagle_batch(3), torch.tensor([7, 8, 9])
    relay = SlotFutureMapFactory().create_future_map(8, 8, 64, torch.device("cpu"))
    EagleDisaggDraftBuilder().build_disagg_draft_input(batch, last, relay)
    got = relay.resolve(torch.tensor([3, 1]))
    assert got.bonus_tokens.tolist() == [9, 7]  # type: ignore[union-attr]
    assert got.seq_lens.tolist() == [7, 5]  # type: ignore[union-attr]
    assert got.hidden_states is not None
    assert batch.hidden_states is not None
    assert torch.equal(got.hidden_states, batch.hidden_states[[2, 0]])


@given(prebuilt_batches(EAGLE_CAPS))
def test_eagle_overlap_round_trip_for_any_batch(batch: PrebuiltBatch) -> None:
    """For any received batch, the relay resolves exactly what the builder returned."""
    relay = SlotFutureMapFactory().create_future_map(16, 8, 64, torch.device("cpu"))
    last = torch.arange(batch.bs, dtype=torch.int64) + 1000
    out = EagleDisaggDraftBuilder().build_disagg_draft_input(batch, last, relay)
    got = relay.resolve(batch.slots)
    assert torch.equal(got.seq_lens, batch.seq_lens)  # type: ignore[arg-type]
    assert torch.equal(got.bonus_tokens, out.verified_id)  # type: ignore[arg-type]
    assert torch.equal(got.topk_index, out.topk_index)  # type: ignore[arg-type]
