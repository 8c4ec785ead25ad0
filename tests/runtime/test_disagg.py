"""Prefill/decode disaggregation in two processes: lossless, batched, and every fault handled."""

import time
from dataclasses import replace
from typing import Any

import pytest

import specstrat
import specstrat.strategies
from specstrat import DisaggError, SpecAlgorithm
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, TransferBatch, workload
from specstrat.runtime._disagg import PrefillWorker, process, run_disaggregated
from tests.runtime import faults
from tests.runtime.custom_algos import LOOKUP, LookupDisaggDraftBuilder
from tests.typing.first_match import LOOKUP_THEN_HEAD
from tests.typing.readme_drafter import BIGRAM
from tests.typing.readme_example import MY_EAGLE

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(6, seed=11)  # request 3 stops at its first newline
TIMEOUT = 120.0  # generous: a loaded machine may take long to import torch in the child


@pytest.fixture(scope="module")
def single(models: EmbeddedModels) -> dict[str, list[int]]:
    """Single-process target-only output of the workload."""
    return Engine(specstrat.NONE, models, CONFIG).run(REQUESTS)


def disagg(algo: SpecAlgorithm[Any], models: EmbeddedModels, **kw: Any) -> process.DisaggResult:
    """One disaggregated run of the workload (batches of 4)."""
    config = replace(CONFIG, **kw)
    return run_disaggregated(algo, REQUESTS, config, models=models, batch_size=4, timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("algo", "overlap"),
    [(specstrat.EAGLE, True), (LOOKUP, False), (BIGRAM, True)],
    ids=["EAGLE-overlap", "LOOKUP-sync", "BIGRAM-overlap"],
)
def test_disaggregated_equals_single_process(
    algo: SpecAlgorithm[Any], overlap: bool, models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """Prefill in another process, decode here: token-for-token the single-process output."""
    LookupDisaggDraftBuilder.seen.clear()
    result = disagg(algo, models, overlap=overlap)
    assert result.outputs == single
    assert result.rejected == []
    if algo is LOOKUP:  # the custom builder saw both batches, batched
        assert [d.seq_lens.numel() for d in LookupDisaggDraftBuilder.seen] == [4, 2]


@pytest.mark.slow
@pytest.mark.parametrize("stops", [True, False], ids=["stops", "no-stops"])
@pytest.mark.parametrize("d", [1, 4])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize(
    "algo",
    [*specstrat.BUILTINS[1:], MY_EAGLE, BIGRAM, LOOKUP, LOOKUP_THEN_HEAD],
    ids=lambda a: a.name,
)
def test_disaggregated_matrix(
    algo: SpecAlgorithm[Any], overlap: bool, d: int, stops: bool, models: EmbeddedModels
) -> None:
    """Every algorithm x mode x D x stop tokens disaggregated equals single-process
    target-only output."""
    requests = workload(6, seed=11, stops=stops)
    want = Engine(specstrat.NONE, models, replace(CONFIG, num_draft_tokens=d)).run(requests)
    config = replace(CONFIG, overlap=overlap, num_draft_tokens=d)
    result = run_disaggregated(algo, requests, config, models=models, batch_size=4, timeout=TIMEOUT)
    assert result.outputs == want


def test_a_batch_with_a_bad_payload_is_refused_alone(
    models: EmbeddedModels, single: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hidden-state width that disagrees with the model: that batch is refused naming its
    requests and the field; the other batch runs exactly."""
    monkeypatch.setattr(process, "prefill_main", faults.bad_hidden_width)
    result = disagg(specstrat.EAGLE, models)
    assert len(result.rejected) == 1
    assert "requests ['req-4', 'req-5']: hidden_states is (2, 127), expected (2, 128)" in str(
        result.rejected[0]
    )
    assert result.outputs == {rid: single[rid] for rid in ("req-0", "req-1", "req-2", "req-3")}


def test_prefill_process_killed_mid_transfer(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode side raises, names the lost requests, admits no half batch."""
    monkeypatch.setattr(process, "prefill_main", faults.die_mid_transfer)
    with pytest.raises(
        DisaggError,
        match=(
            r"broke off .* lost requests \['req-4', 'req-5'\]; nothing of that "
            r"batch was admitted; requests never admitted: \['req-4', 'req-5'\]"
        ),
    ):
        disagg(specstrat.EAGLE, models)


def test_prefill_process_dying_before_it_connects_is_reported_at_once(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill process that exits before joining the group is reported with its exit code,
    without waiting for the rendezvous timeout."""
    monkeypatch.setattr(process, "prefill_main", faults.die_before_connect)
    start = time.monotonic()
    with pytest.raises(
        DisaggError, match=r"exited with code 3 before it connected .* not in __main__"
    ):
        disagg(specstrat.EAGLE, models)
    assert time.monotonic() - start < TIMEOUT


def test_prefill_process_that_never_connects_times_out(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill process that stays alive but never connects is killed after the timeout."""
    monkeypatch.setattr(process, "prefill_main", faults.stall_before_connect)
    with pytest.raises(DisaggError, match=r"the prefill process did not connect within 2\.0s"):
        run_disaggregated(specstrat.EAGLE, REQUESTS, CONFIG, models=models, timeout=2.0)


def test_an_algorithm_that_cannot_be_pickled_is_refused(models: EmbeddedModels) -> None:
    """Strategies defined inside a function cannot reach the prefill process: a clear error."""

    class LocalPolicy(specstrat.strategies.OffsetVerifyPolicy):
        pass

    algo = replace(specstrat.NGRAM, name="LOCAL", target_verify=LocalPolicy())
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
    payload = full.payload
    empty = TransferBatch(
        rids=(),
        prompts=(),
        max_new_tokens=full.max_new_tokens[:0],
        bonus_tokens=full.bonus_tokens[:0],
        k=full.k[:, :0],
        v=full.v[:, :0],
        payload=replace(
            payload,
            **{name: tensor[:0] for name, tensor in payload.present().items()},
        ),
    )
    engine = Engine(specstrat.EAGLE, models, CONFIG)
    engine.submit_prebuilt(empty)
    assert engine.run() == {}


@pytest.mark.parametrize("algo", [specstrat.DFLASH, specstrat.EAGLE], ids=lambda a: a.name)
def test_prebuilt_in_process_matches_single(
    algo: SpecAlgorithm[Any], models: EmbeddedModels, single: dict[str, list[int]]
) -> None:
    """PREBUILT admission of an in-process prefill continues exactly like local prefill."""
    engine = Engine(algo, models, CONFIG)
    engine.submit_prebuilt(prefilled(models, algo, 3))
    assert engine.run() == {rid: single[rid] for rid in ("req-0", "req-1", "req-2")}
