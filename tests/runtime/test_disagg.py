"""Prefill/decode disaggregation in two processes: lossless, batched, and every fault handled."""

import time
from typing import Any

import pytest
import torch

import specstrat
from specstrat import DisaggError, SpecAlgorithm
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig
from specstrat.runtime.demo import workload
from specstrat.runtime.disagg import PrefillWorker, TransferBatch, check_transfer, run_disaggregated
from tests.runtime.custom_algos import LOOKUP, LookupDisaggDraftBuilder

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(6, seed=11)


@pytest.fixture(scope="module")
def single(models: EmbeddedModels) -> dict[str, list[int]]:
    """Single-process target-only output of the workload."""
    return Engine(specstrat.NONE, models, CONFIG).run(REQUESTS)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize(
    "algo", [specstrat.EAGLE, specstrat.DSPARK, specstrat.DFLASH, LOOKUP], ids=lambda a: a.name
)
def test_disaggregated_equals_single_process(
    algo: SpecAlgorithm[Any], overlap: bool, models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """Prefill in another process, decode here: token-for-token the single-process output."""
    LookupDisaggDraftBuilder.seen.clear()
    config = EngineConfig(context_len=512, max_running_requests=8, overlap=overlap)
    result = run_disaggregated(algo, REQUESTS, config, models=models, batch_size=4, timeout=30)
    assert result.outputs == single
    assert result.rejected == []
    if algo is LOOKUP:  # the custom builder saw both batches, batched
        assert [d.seq_lens.numel() for d in LookupDisaggDraftBuilder.seen] == [4, 2]


def test_missing_hidden_states_reject_only_that_batch(
    models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """A request without hidden states: its batch is refused naming it; the rest run exactly."""
    result = run_disaggregated(
        specstrat.EAGLE, REQUESTS, CONFIG, models=models, fault="missing_hidden", timeout=30
    )
    assert len(result.rejected) == 1
    assert "hidden_states missing for ['req-4']; EAGLE carries them" in str(result.rejected[0])
    assert result.outputs == {
        rid: out for rid, out in single.items() if rid not in ("req-4", "req-5")
    }


def test_payload_of_wrong_shape_is_refused(
    models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """A hidden-state width that disagrees with the model: clear error, batch not admitted."""
    result = run_disaggregated(
        specstrat.EAGLE, REQUESTS, CONFIG, models=models, fault="bad_hidden_width", timeout=30
    )
    assert "hidden_states is (2, 127), expected (2, 128); the batch was not admitted" in str(
        result.rejected[0]
    )
    assert set(result.outputs) == {"req-0", "req-1", "req-2", "req-3"}


def test_prefill_process_killed_mid_transfer(models: EmbeddedModels) -> None:
    """The decode side raises within the timeout, names the lost requests, admits no half batch."""
    start = time.perf_counter()
    with pytest.raises(
        DisaggError,
        match=r"broke off .* lost requests \['req-4', 'req-5'\]; nothing of that batch was admitted; requests never admitted: \['req-4', 'req-5'\]",
    ):
        run_disaggregated(
            specstrat.EAGLE, REQUESTS, CONFIG, models=models, fault="die_mid_transfer", timeout=10
        )
    assert time.perf_counter() - start < 30


def test_prefill_process_dying_before_it_connects_is_reported_at_once(
    models: EmbeddedModels,
) -> None:
    """A prefill process that exits before joining the group is reported with its exit code,
    well before the rendezvous timeout."""
    start = time.perf_counter()
    with pytest.raises(
        DisaggError, match=r"exited with code 3 before it connected .* not in __main__"
    ):
        run_disaggregated(
            specstrat.EAGLE, REQUESTS, CONFIG, models=models, fault="die_before_connect", timeout=60
        )
    assert time.perf_counter() - start < 30


def test_prefill_process_that_never_connects_times_out(models: EmbeddedModels) -> None:
    """A prefill process that stays alive but never connects is killed after the timeout."""
    start = time.perf_counter()
    with pytest.raises(DisaggError, match=r"the prefill process did not connect within 3\.0s"):
        run_disaggregated(
            specstrat.EAGLE,
            REQUESTS,
            CONFIG,
            models=models,
            fault="stall_before_connect",
            timeout=3.0,
        )
    assert time.perf_counter() - start < 15


def test_an_algorithm_that_cannot_be_pickled_is_refused(models: EmbeddedModels) -> None:
    """Strategies defined inside a function cannot reach the prefill process: a clear error."""

    class LocalPolicy(specstrat.FixedWidthVerifyPolicy):
        pass

    algo: SpecAlgorithm[None] = specstrat.SpecAlgorithm(
        name="LOCAL",
        capabilities=specstrat.Capabilities(),
        target_verify=LocalPolicy(),
        future_map=specstrat.SlotFutureMapFactory(),
        disagg=specstrat.NoDraftStateDisaggDraftBuilder(),
    )
    with pytest.raises(
        DisaggError,
        match=r"cannot send algorithm 'LOCAL' to the prefill process: .*LocalPolicy.*module level",
    ):
        run_disaggregated(algo, REQUESTS, CONFIG, models=models)


def prefilled(models: EmbeddedModels, algo: SpecAlgorithm[Any], n: int = 2) -> TransferBatch:
    """A batch prefilled in this process."""
    return PrefillWorker(algo, models, context_len=512, batch_size=4).prefill(REQUESTS[:n])


def test_empty_batch_is_admitted_as_nothing(models: EmbeddedModels) -> None:
    """A batch of zero requests is well defined: nothing admitted, nothing crashes."""
    full = prefilled(models, specstrat.EAGLE)
    empty = TransferBatch(
        rids=(), prompts=(), max_new_tokens=full.max_new_tokens[:0], first_tokens=full.first_tokens[:0],
        k=full.k[:, :0], v=full.v[:, :0], topk_p=full.topk_p[:0] if full.topk_p is not None else None,
        topk_index=full.topk_index[:0] if full.topk_index is not None else None,
        hidden_states=full.hidden_states[:0] if full.hidden_states is not None else None,
        hidden_mask=torch.zeros(0, dtype=torch.int64),
    )  # fmt: skip
    engine = Engine(specstrat.EAGLE, models, CONFIG)
    engine.submit_prebuilt(empty)
    assert engine.run() == {}


def test_prebuilt_in_process_matches_single(
    models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """PREBUILT admission of an in-process prefill continues exactly like local prefill."""
    engine = Engine(specstrat.DFLASH, models, CONFIG)
    engine.submit_prebuilt(prefilled(models, specstrat.DFLASH, 3))
    assert engine.run() == {rid: single[rid] for rid in ("req-0", "req-1", "req-2")}


def test_check_transfer_errors(models: EmbeddedModels) -> None:
    """Payloads that disagree with the algorithm are refused naming the field and requests."""
    good = prefilled(models, specstrat.EAGLE)
    engine = Engine(specstrat.EAGLE, models, CONFIG)
    fields = {name: getattr(good, name) for name in TransferBatch.__slots__}
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"k": good.k[:1]},
            r"k is torch.float64 \(1, \d+, 4, 32\), expected float \(4, \d+, 4, 32\)",
        ),
        ({"hidden_states": None}, r"EAGLE carries hidden states but none arrived"),
        ({"topk_index": good.topk_p}, r"topk_p is torch.float64 and topk_index torch.float64"),
        ({"topk_p": None}, r"EAGLE needs topk_p and topk_index; none arrived"),
        (
            {"first_tokens": good.first_tokens[:1]},
            r"first_tokens and max_new_tokens need one entry per request",
        ),
    ]
    for change, message in cases:
        with pytest.raises(DisaggError, match=message):
            check_transfer(TransferBatch(**{**fields, **change}), engine)
    engine.submit_prebuilt(good)
    with pytest.raises(DisaggError, match=r"request id 'req-0' arrived twice"):
        engine.submit_prebuilt(good)
