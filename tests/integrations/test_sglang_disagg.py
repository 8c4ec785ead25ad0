"""The disaggregation boundary: SGLang's received batch in, SGLang's SpecInput and relay out.

SGLang's caller (``process_prebuilt``) and its draft-input classes need CUDA-only builds here,
so the batch and the draft-input constructors are stand-ins (``sglang_standins``); the relay is
SGLang's real ``FutureMap``, made by the adapter.
"""

import importlib
import sys
from typing import Any

import pytest
import torch

from specstrat import DFLASH, DSPARK, EAGLE, NGRAM, STANDALONE, DisaggError, InvalidStrategy
from specstrat.integrations.sglang import (
    builtin_spec_input,
    prebuilt_batch_from_schedule_batch,
    register,
)
from tests.integrations.sglang_standins import (
    USER_DRAFT,
    Recorded,
    StandInWorker,
    draft_input_modules,
    req_to_token_pool,
    request,
    schedule_batch,
    spec_config,
    spec_utils_functions,
)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Recording SGLang draft-input modules, SGLang's config bag, and spec_utils' functions."""
    config = spec_config(speculative_eagle_topk=1)
    for name, module in draft_input_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    runtime_context = importlib.import_module("sglang.srt.runtime_context")
    monkeypatch.setattr(runtime_context, "get_spec", lambda: config)
    monkeypatch.setitem(
        sys.modules, "sglang.srt.speculative.spec_utils", spec_utils_functions(lambda: config)
    )
    return config


def eagle_batch(*, overlap: bool = True, hidden_for_b: bool = True) -> Any:
    """Two received EAGLE requests at slots 2 and 5 (top-k 3 sent, hidden size 2)."""
    return schedule_batch(
        [
            request("a", topk=[0.7, 0.2, 0.1], topk_index=[3, 8, 9], hidden=torch.ones(2)),
            request(
                "b",
                topk=[0.4, 0.3, 0.3],
                topk_index=[4, 1, 2],
                hidden=torch.full((2,), 2.0) if hidden_for_b else None,
            ),
        ],
        slots=[2, 5],
        seq_lens=[9, 17],
        overlap=overlap,
    )


def test_the_received_batch_is_stacked_once_into_a_prebuilt_batch() -> None:
    """Per-request fields become one [bs, ...] tensor each, cut to the top-k SGLang relays."""
    batch = prebuilt_batch_from_schedule_batch(
        eagle_batch(), need_topk=True, carries_hidden_states=True, topk_states=1
    )
    assert batch.rids == ("a", "b")
    assert batch.slots.tolist() == [2, 5]
    assert batch.seq_lens.tolist() == [9, 17]
    assert batch.topk_p is not None
    assert batch.topk_index is not None
    assert batch.hidden_states is not None
    assert batch.topk_p.dtype == torch.float32
    assert batch.topk_p.tolist() == [[pytest.approx(0.7)], [pytest.approx(0.4)]]
    assert batch.topk_index.tolist() == [[3], [4]]
    assert batch.hidden_states.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    plain = prebuilt_batch_from_schedule_batch(
        eagle_batch(), need_topk=False, carries_hidden_states=False, topk_states=None
    )
    assert (plain.topk_p, plain.topk_index, plain.hidden_states) == (None, None, None)


def test_eagle_draft_input_and_relay_through_the_adapter(stand_ins: Any) -> None:
    """EAGLE: SGLang's EagleDraftInput from the batch; lengths published, extras stashed."""
    spec = register(EAGLE, worker=StandInWorker, name="SPECSTRAT_EAGLE")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    batch = eagle_batch()
    last = torch.tensor([21, 22])
    out = spec.build_disagg_draft_input(batch, last, relay)
    assert isinstance(out, Recorded)
    assert out.kind == "EagleDraftInput"
    assert out.capture_hidden_mode == "LAST"
    assert out.bonus_tokens.tolist() == [21, 22]
    assert out.topk_index.tolist() == [[3], [4]]
    assert out.hidden_states.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    assert out.future_indices is batch.req_pool_indices
    assert relay.new_seq_lens_buf[[2, 5]].tolist() == [9, 17]
    assert relay.output_tokens_buf[[2, 5]].tolist() == [21, 22]
    assert relay.topk_index_buf[[2, 5]].tolist() == [[3], [4]]
    assert relay.hidden_states_buf[[2, 5]].tolist() == [[1.0, 1.0], [2.0, 2.0]]


def test_without_overlap_nothing_is_relayed(stand_ins: Any) -> None:
    """With overlap off the adapter writes nothing to SGLang's relay (as SGLang's builders)."""
    spec = register(EAGLE, worker=StandInWorker, name="SPECSTRAT_EAGLE")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    out = spec.build_disagg_draft_input(eagle_batch(overlap=False), torch.tensor([1, 2]), relay)
    assert out.future_indices is None
    assert relay.publish_ready is None
    assert relay.topk_p_buf is None


def test_a_missing_hidden_state_names_the_requests(stand_ins: Any) -> None:
    """A request that arrived without its hidden state is a DisaggError naming the batch."""
    spec = register(EAGLE, worker=StandInWorker, name="SPECSTRAT_EAGLE")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    with pytest.raises(DisaggError, match=r"requests \['a', 'b'\] arrived without hidden_states"):
        spec.build_disagg_draft_input(eagle_batch(hidden_for_b=False), torch.tensor([1, 2]), relay)


def test_an_empty_batch_is_well_formed(stand_ins: Any) -> None:
    """bs = 0: an empty EAGLE draft input, and SGLang's relay skips the empty writes."""
    spec = register(EAGLE, worker=StandInWorker, name="SPECSTRAT_EAGLE")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    out = spec.build_disagg_draft_input(
        schedule_batch([], [], []), torch.zeros(0, dtype=torch.int64), relay
    )
    assert out.bonus_tokens.shape == (0,)
    assert out.topk_p.shape[0] == 0


@pytest.mark.parametrize(
    ("algo", "kind"),
    [(DSPARK, "dspark make_next_draft_input"), (DFLASH, "make_draft_input_v2")],
    ids=["DSPARK", "DFLASH"],
)
def test_dspark_and_dflash_use_sglangs_draft_input_constructors(
    algo: Any, kind: str, stand_ins: Any
) -> None:
    """DSPARK and DFLASH: SGLang's constructor from the bonus tokens and sequence lengths."""
    spec = register(algo, worker=StandInWorker, name=f"SPECSTRAT_{algo.name}")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    batch = schedule_batch([request("a"), request("b")], slots=[1, 3], seq_lens=[4, 6])
    out = spec.build_disagg_draft_input(batch, torch.tensor([7, 8]), relay)
    assert out.kind == kind
    assert out.bonus_tokens.tolist() == [7, 8]
    assert out.new_seq_lens.tolist() == [4, 6]
    assert relay.output_tokens_buf[[1, 3]].tolist() == [7, 8]
    assert relay.topk_p_buf is None


@pytest.mark.parametrize("algo", [NGRAM, STANDALONE], ids=lambda a: a.name)
def test_no_draft_state_returns_none_for_sglang_to_stash(algo: Any, stand_ins: Any) -> None:
    """No draft state: None, and SGLang's process_prebuilt stashes the last tokens itself."""
    spec = register(algo, worker=StandInWorker, name=f"SPECSTRAT_{algo.name}")
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    batch = schedule_batch([request("a", topk=[0.5], topk_index=[1])], slots=[1], seq_lens=[4])
    assert spec.build_disagg_draft_input(batch, torch.tensor([7]), relay) is None
    assert relay.publish_ready is None


def test_a_user_draft_type_goes_through_to_spec_input(stand_ins: Any) -> None:
    """to_spec_input receives the builder's own draft input; its result is relayed."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def to_spec_input(draft: Any) -> Recorded:
        seen.append(draft)
        return Recorded(kind="user", future_indices=None)

    spec = register(USER_DRAFT, worker=StandInWorker, to_spec_input=to_spec_input)
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    batch = schedule_batch([request("a")], slots=[4], seq_lens=[3])
    out = spec.build_disagg_draft_input(batch, torch.tensor([5]), relay)
    assert out.kind == "user"
    last, seq_lens = seen[0]
    assert last.tolist() == [5]
    assert seq_lens.tolist() == [3]
    assert relay.output_tokens_buf[4].item() == 5


def test_only_builtin_draft_inputs_convert_without_to_spec_input() -> None:
    """builtin_spec_input refuses a draft type it does not know, naming it."""
    with pytest.raises(InvalidStrategy, match=r"draft input tuple is not a built-in"):
        builtin_spec_input((1, 2))
