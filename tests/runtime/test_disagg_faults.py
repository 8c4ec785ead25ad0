"""A received batch is checked whole before anything is admitted; transport and argument
errors are DisaggError/InvalidConfig naming what went wrong, before anything is spawned."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

import specstrat
from specstrat import EAGLE, DisaggError, InvalidConfig, RelayPayload
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, TransferBatch, workload
from specstrat.runtime._disagg import (
    PrefillWorker,
    process,
    recv_transfer,
    run_disaggregated,
    send_transfer,
)

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
REQUESTS = workload(3, seed=11)


@pytest.fixture(scope="module")
def good(models: EmbeddedModels) -> TransferBatch:
    """Two EAGLE requests prefilled in this process."""
    return PrefillWorker(EAGLE, models, context_len=512, batch_size=4).prefill(REQUESTS[:2])


def payload(batch: TransferBatch, **fields: Any) -> TransferBatch:
    return replace(batch, payload=replace(batch.payload, **fields))


def nan_k(batch: TransferBatch) -> TransferBatch:
    k = batch.k.clone()
    k[0, 0, 0, 0] = float("nan")
    return replace(batch, k=k)


BATCHES: list[tuple[str, Callable[[TransferBatch], Any], str]] = [
    (
        "duplicate-ids",
        lambda b: replace(b, rids=("req-0", "req-0")),
        r"request ids must be distinct",
    ),
    (
        "empty-id",
        lambda b: replace(b, rids=("", "req-1")),
        r"request ids must be distinct non-empty",
    ),
    (
        "float-first-tokens",
        lambda b: replace(b, bonus_tokens=b.bonus_tokens.double()),
        r"bonus_tokens is torch.float64 \(2,\); expected torch.int64 \[2\]",
    ),
    (
        "oov-first-tokens",
        lambda b: replace(b, bonus_tokens=b.bonus_tokens + 1000),
        r"bonus_tokens=\[\d+, \d+\] outside the vocabulary 0\.\.255",
    ),
    (
        "short-budgets",
        lambda b: replace(b, max_new_tokens=b.max_new_tokens[:1]),
        r"max_new_tokens is torch.int64 \(1,\); expected torch.int64 \[2\]",
    ),
    (
        "zero-budget",
        lambda b: replace(b, max_new_tokens=torch.zeros(2, dtype=torch.int64)),
        r"max_new_tokens < 1, or prompt \+ max_new_tokens > \d+ positions",
    ),
    (
        "huge-budget",
        lambda b: replace(b, max_new_tokens=torch.full((2,), 10**6)),
        r"max_new_tokens < 1, or prompt \+ max_new_tokens > 504 positions",
    ),
    (
        "oov-prompt",
        lambda b: replace(b, prompts=((300,) * len(b.prompts[0]), b.prompts[1])),
        r"prompt tokens must be ints in 0\.\.255",
    ),
    (
        "empty-prompt",
        lambda b: replace(b, prompts=((), b.prompts[1])),
        r"every request needs a non-empty prompt",
    ),
    (
        "kv-shape",
        lambda b: replace(b, k=b.k[:1]),
        r"k is torch.float64 \(1, \d+, 4, 32\), expected floating point \(4, \d+, 4, 32\)",
    ),
    ("kv-int", lambda b: replace(b, v=b.v.long()), r"v is torch.int64 .* expected floating point"),
    ("kv-nan", nan_k, r"k holds NaN or infinite values"),
    (
        "missing-hidden",
        lambda b: payload(b, hidden_states=None),
        r"hidden_states did not arrive; the algorithm's drafter needs them",
    ),
    (
        "missing-topk",
        lambda b: payload(b, topk_p=None, topk_index=None),
        r"topk_index, topk_p did not arrive",
    ),
    (
        "hidden-width",
        lambda b: payload(b, hidden_states=b.payload.hidden_states[:, :-1]),  # type: ignore[index]
        r"hidden_states is \(2, 127\), expected \(2, 128\)",
    ),
    (
        "hidden-inf",
        lambda b: payload(b, hidden_states=b.payload.hidden_states * float("inf")),  # type: ignore[operator]
        r"hidden_states holds NaN or infinite values",
    ),
    (
        "topk-oov",
        lambda b: payload(b, topk_index=b.payload.topk_index + 999),  # type: ignore[operator]
        r"topk_index holds ids outside the vocabulary",
    ),
    (
        "stops-count",
        lambda b: replace(b, stop_token_ids=(frozenset(),)),
        r"stop_token_ids needs one set per request",
    ),
    ("not-a-batch", lambda b: {"rids": b.rids}, r"batch=dict; pass a TransferBatch"),
]


@pytest.mark.parametrize(("case", "corrupt", "message"), BATCHES, ids=[c[0] for c in BATCHES])
def test_a_corrupt_batch_is_refused_whole(
    case: str,
    corrupt: Callable[[TransferBatch], Any],
    message: str,
    good: TransferBatch,
    models: EmbeddedModels,
) -> None:
    """Each corruption is a DisaggError naming it; nothing is queued, and the engine still runs
    the good batch exactly afterwards."""
    engine = Engine(EAGLE, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(DisaggError, match=message):
        engine.submit_prebuilt(corrupt(good))
    assert engine.submitted_ids() == []
    assert (engine.free_slots, engine.free_kv_tokens) == before
    engine.submit_prebuilt(good)
    single = Engine("NONE", models, CONFIG).run(REQUESTS[:2])
    assert engine.run() == single


def test_an_id_already_submitted_is_refused(good: TransferBatch, models: EmbeddedModels) -> None:
    """A batch repeating an id the engine already has is refused, naming the id."""
    engine = Engine(EAGLE, models, CONFIG)
    engine.submit_prebuilt(good)
    with pytest.raises(
        DisaggError, match=r"request ids \['req-0', 'req-1'\] were already submitted"
    ):
        engine.submit_prebuilt(good)


def test_a_batch_larger_than_the_engine_is_refused(
    good: TransferBatch, models: EmbeddedModels
) -> None:
    """A batch that cannot be admitted whole is refused at submit."""
    engine = Engine(EAGLE, models, replace(CONFIG, max_running_requests=1))
    with pytest.raises(
        DisaggError, match=r"batch of 2 requests needs \d+ KV indices; .* max_running_requests=1"
    ):
        engine.submit_prebuilt(good)


def test_transport_without_a_process_group_is_a_disagg_error(good: TransferBatch) -> None:
    """send_transfer and recv_transfer without a process group both name the fix."""
    with pytest.raises(DisaggError, match=r"send_transfer needs a torch.distributed process group"):
        send_transfer(good, dst=1)
    with pytest.raises(DisaggError, match=r"recv_transfer needs a torch.distributed process group"):
        recv_transfer(0, timeout=1.0)


ARGUMENTS: list[tuple[str, dict[str, Any], str]] = [
    ("timeout-zero", {"timeout": 0}, r"timeout=0 must be a finite number of seconds > 0"),
    ("timeout-nan", {"timeout": float("nan")}, r"timeout=nan must be a finite number"),
    ("timeout-str", {"timeout": "10"}, r"timeout='10' must be a finite number"),
    ("batch-zero", {"batch_size": 0}, r"batch_size=0 must be an int >= 1"),
    ("batch-too-big", {"batch_size": 99}, r"batch_size=99 > max_running_requests=8"),
    ("not-requests", {"requests": ["hello"]}, r"requests must all be specstrat.runtime.Request"),
    ("repeated-ids", {"requests": [REQUESTS[0], REQUESTS[0]]}, r"requests repeat a request id"),
    ("not-an-algorithm", {"algo": "EAGLE"}, r"algo='EAGLE'; pass a SpecAlgorithm"),
    (
        "own-models",
        {"models": "mine"},
        r"models=str: the prefill process loads the embedded weights",
    ),
]


@pytest.mark.parametrize(("case", "change", "message"), ARGUMENTS, ids=[c[0] for c in ARGUMENTS])
def test_bad_arguments_are_refused_before_spawning(
    case: str,
    change: dict[str, Any],
    message: str,
    models: EmbeddedModels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run_disaggregated checks its arguments before any process or store exists."""

    def no_spawn(*args: Any) -> Any:
        raise AssertionError("a process was started")

    monkeypatch.setattr(torch.multiprocessing, "get_context", no_spawn)
    monkeypatch.setattr(process, "TCPStore", no_spawn)
    kwargs: dict[str, Any] = {"algo": EAGLE, "requests": REQUESTS, "models": models, **change}
    with pytest.raises(InvalidConfig, match=message):
        run_disaggregated(kwargs.pop("algo"), kwargs.pop("requests"), CONFIG, **kwargs)


def test_the_backend_follows_the_device() -> None:
    """gloo for CPU tensors, NCCL for CUDA ones."""
    assert process.backend_for(torch.device("cpu")) == "gloo"
    assert process.backend_for(torch.device("cuda", 0)) == "nccl"


def test_a_prefill_payload_missing_a_field_is_named_on_the_prefill_side(
    models: EmbeddedModels,
) -> None:
    """A drafter whose prefill payload lacks what it declared is a StrategyError there."""
    from specstrat.testing import FaultyDrafterFactory

    algo = replace(
        EAGLE,
        drafter=FaultyDrafterFactory(EAGLE.drafter, "prefill_payload", lambda got: RelayPayload()),
    )
    worker = PrefillWorker(algo, models, context_len=512, batch_size=2)
    with pytest.raises(
        specstrat.StrategyError, match=r"EAGLE\.drafter\.prefill_payload: returned \[\]"
    ):
        worker.prefill(REQUESTS[:2])
    assert worker.worker.requests.available == 2  # its slots were freed
