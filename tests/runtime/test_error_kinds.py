"""Errors say what kind of thing went wrong: a pool running out mid-run is a CapacityError and a
broken invariant of the engine an InternalError, neither an InvalidConfig."""

from dataclasses import replace
from typing import Any

import pytest

from specstrat import NGRAM, CapacityError, EngineStateError, InternalError, InvalidConfig
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.runtime._worker import ModelWorker

CONFIG = EngineConfig(context_len=512, max_running_requests=4, max_total_tokens=300)
REQUESTS = [replace(r, max_new_tokens=40) for r in workload(4, seed=3)]


def test_kv_running_out_mid_run_is_a_capacity_error(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When admission under-reserves, the KV pool runs out mid-run: a CapacityError (not an
    InvalidConfig), every slot and KV token comes back, the engine refuses reuse."""
    monkeypatch.setattr(Engine, "_reserve", lambda self, request: 1)
    engine = Engine(NGRAM, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(CapacityError, match=r"KV pool has \d+ free KV indices, \d+ needed") as info:
        engine.run(REQUESTS)
    assert not isinstance(info.value, InvalidConfig)
    assert (engine.free_slots, engine.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"closed after a failed run \(CapacityError"):
        engine.run(REQUESTS)


def test_a_refused_rewind_of_a_checked_path_is_an_internal_error(
    models: EmbeddedModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An InvalidConfig from the engine's own bookkeeping with checked values is reported as
    an InternalError (a bug to report), the original chained; nothing leaks."""

    def refuse(self: ModelWorker, *args: Any) -> None:
        raise InvalidConfig("rewind to new_len=9 outside 0..5")

    monkeypatch.setattr(ModelWorker, "rewind_many", refuse)
    engine = Engine(NGRAM, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(
        InternalError,
        match=r"keeping the accepted path after a checked acceptance refused "
        r"values the engine "
        r"checked before .*; this is a bug in specstrat",
    ) as info:
        engine.run(REQUESTS[:2])
    assert isinstance(info.value.__cause__, InvalidConfig)
    assert (engine.free_slots, engine.free_kv_tokens) == before
