"""Every public entry point refuses bad input with a SpecstratError naming the value and the fix."""

from collections.abc import Callable
from typing import Any

import pytest
import torch

import specstrat
from specstrat import (
    EAGLE,
    Capabilities,
    PrebuiltBatch,
    RelayPayload,
    SpecAlgorithm,
    SpecstratError,
)
from specstrat.kernels import VerifyMetadataBuffers, build_verify_metadata, gather_relay
from specstrat.strategies import (
    EagleDisaggDraftBuilder,
    GreedyAcceptance,
    NgramDrafterFactory,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    RingFutureMapFactory,
    SlotFutureMapFactory,
)

CPU = torch.device("cpu")
I64 = torch.int64


def loose(value: object) -> Any:
    """Pass a deliberately mistyped value past mypy (these tests check the runtime guard)."""
    return value


def algo(**kw: Any) -> SpecAlgorithm[Any]:
    fields: dict[str, Any] = {
        "name": "X",
        "capabilities": Capabilities(),
        "target_verify": OffsetVerifyPolicy(),
        "future_map": SlotFutureMapFactory(),
        "disagg": NoDraftStateDisaggDraftBuilder(),
        "drafter": NgramDrafterFactory(),
        "acceptance": GreedyAcceptance(),
    }
    return SpecAlgorithm(**{**fields, **kw})


def batch(**kw: Any) -> PrebuiltBatch:
    fields: dict[str, Any] = {
        "rids": ("a", "b"),
        "slots": torch.tensor([1, 2]),
        "seq_lens": torch.tensor([3, 4]),
    }
    return PrebuiltBatch(**{**fields, **kw})


def slot_map() -> Any:
    return SlotFutureMapFactory().create_future_map(4, 8, 16, CPU)


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("name-empty", lambda: algo(name=""), r"name='' is not an identifier"),
    ("name-space", lambda: algo(name="my algo"), r"name='my algo' is not an identifier"),
    ("capabilities-dict", lambda: algo(capabilities={}), r"capabilities=\{\}; pass specstrat"),
    (
        "capability-not-bool",
        lambda: Capabilities(need_topk=loose(1)),
        r"need_topk=1 must be True or False",
    ),
    (
        "none-with-draft-kv",
        lambda: Capabilities(speculative=False, has_draft_kv=True),
        r"has_draft_kv=True",
    ),
    (
        "offset-too-big",
        lambda: OffsetVerifyPolicy(target_offset=2),
        r"target_offset=2 is outside -1\.\.1",
    ),
    (
        "offset-float",
        lambda: OffsetVerifyPolicy(draft_worker_offset=loose(0.5)),
        r"draft_worker_offset=0.5 must be an int",
    ),
    (
        "allow-not-bool",
        lambda: OffsetVerifyPolicy(allow_on_draft_worker=loose(1)),
        r"allow_on_draft_worker=1",
    ),
    (
        "draft-tokens-zero",
        lambda: EAGLE.get_num_tokens_per_req_for_target_verify(0),
        r"num_draft_tokens=0 must be >= 1",
    ),
    (
        "draft-tokens-bool",
        lambda: EAGLE.get_num_tokens_per_req_for_target_verify(True),
        r"num_draft_tokens=True",
    ),
    (
        "draft-worker-str",
        lambda: EAGLE.get_num_tokens_per_req_for_target_verify(4, loose("yes")),
        r"is_draft_worker='yes'",
    ),
    (
        "register-not-algo",
        lambda: specstrat.Registry().register(loose("EAGLE")),
        r"algo='EAGLE' is a str",
    ),
    (
        "register-reserved",
        lambda: specstrat.Registry().register(algo(name="eagle")),
        r"name='eagle' is reserved",
    ),
    (
        "get-unknown",
        lambda: specstrat.get("EAGLE4"),
        r"no algorithm named 'EAGLE4'; known: NONE, EAGLE",
    ),
    ("get-not-str", lambda: specstrat.get(loose(3)), r"name=3 must be a str"),
    (
        "mrr-zero",
        lambda: SlotFutureMapFactory().create_future_map(0, 8, 16, CPU),
        r"max_running_requests=0",
    ),
    (
        "chunk-negative",
        lambda: RingFutureMapFactory().create_future_map(4, -8, 16, CPU),
        r"chunked_prefill_size=-8",
    ),
    (
        "ring-capacity-zero",
        lambda: RingFutureMapFactory(capacity=0),
        r"capacity=0 must be an int >= 1",
    ),
    (
        "slot-out-of-range",
        lambda: slot_map().resolve(torch.tensor([5])),
        r"slots range 5\.\.5 is outside 0\.\.4",
    ),
    ("slots-float", lambda: slot_map().resolve(torch.tensor([1.0])), r"slots.dtype=torch.float32"),
    (
        "slots-repeated",
        lambda: slot_map().publish(torch.tensor([1, 1]), torch.tensor([2, 3])),
        r"repeats a request slot",
    ),
    (
        "payload-rows",
        lambda: slot_map().stash(
            torch.tensor([1, 2]), RelayPayload(bonus_tokens=torch.tensor([1]))
        ),
        r"bonus_tokens has 1 rows for 2 slots",
    ),
    (
        "payload-float-tokens",
        lambda: RelayPayload(bonus_tokens=torch.tensor([1.0])),
        r"bonus_tokens.dtype=torch.float32",
    ),
    (
        "payload-rank",
        lambda: RelayPayload(hidden_states=torch.zeros(3)),
        r"hidden_states.shape=\(3,\) has rank 1",
    ),
    (
        "payload-row-mismatch",
        lambda: RelayPayload(
            bonus_tokens=torch.zeros(2, dtype=I64), seq_lens=torch.zeros(3, dtype=I64)
        ),
        r"seq_lens has 3 rows but bonus_tokens has 2",
    ),
    ("batch-dup-rids", lambda: batch(rids=("a", "a")), r"rids=\('a', 'a'\) has duplicates"),
    (
        "batch-slot-zero",
        lambda: batch(slots=torch.tensor([0, 2])),
        r"contains a slot < 1; row 0 is the padding row",
    ),
    (
        "batch-seq-rows",
        lambda: batch(seq_lens=torch.tensor([3])),
        r"seq_lens has 1 rows but rids has 2",
    ),
    (
        "batch-topk-alone",
        lambda: batch(topk_p=torch.zeros(2, 2)),
        r"topk_p and topk_index travel together",
    ),
    (
        "builder-last-tokens",
        lambda: EagleDisaggDraftBuilder().build_disagg_draft_input(
            batch(
                topk_p=torch.zeros(2, 1),
                topk_index=torch.zeros(2, 1, dtype=I64),
                hidden_states=torch.zeros(2, 1),
            ),
            torch.tensor([1]),
            None,
        ),
        r"last_tokens is torch.int64 \(1,\); .* \(bs=2\)",
    ),
    (
        "metadata-not-multiple",
        lambda: build_verify_metadata(torch.tensor([1, 2, 3, 4]), num_tokens=10),
        r"num_tokens=10 is not a multiple of bs=4",
    ),
    (
        "metadata-float-seq",
        lambda: build_verify_metadata(torch.tensor([1.0]), num_tokens=1),
        r"seq_lens.dtype=torch.float32",
    ),
    ("buffers-negative", lambda: VerifyMetadataBuffers.allocate(-1), r"padded_bs=-1 must be >= 0"),
    (
        "gather-index-range",
        lambda: gather_relay(RelayPayload(bonus_tokens=torch.arange(3)), torch.tensor([3])),
        r"index range 3\.\.3 is outside the source's 3 rows",
    ),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_named_value(call: Callable[[], object], message: str) -> None:
    """The call raises a SpecstratError whose message names the bad value."""
    with pytest.raises(SpecstratError, match=message):
        call()


def test_case_table_is_large_and_ids_unique() -> None:
    """The table covers at least 20 distinct invalid inputs."""
    ids = [c[0] for c in CASES]
    assert len(ids) >= 20
    assert len(set(ids)) == len(ids)
