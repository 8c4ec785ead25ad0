"""The slot table owns each slot's draft rows: a drafter takes them through its runner's
slot-aware calls (alloc_for, rows_for, free_for), the table records them per runner, and the
engine frees whatever a drafter's release leaves, so draft KV never leaks."""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from specstrat import (
    DFLASH,
    DSPARK,
    NONE,
    STANDALONE,
    BlockKV,
    CapacityError,
    CausalLM,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftKV,
    DraftStep,
    DraftTree,
    InvalidConfig,
    LoadedModels,
    RelayPayload,
    SpecAlgorithm,
    StepOutcome,
    StrategyError,
)
from specstrat.protocols import Drafter, DrafterFactory
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.runtime._kv_runner import KVRunner
from specstrat.runtime._memory import RequestPool
from specstrat.runtime._models.model import TinyLM
from specstrat.runtime._slots import SlotTable
from specstrat.strategies import BlockDrafter, DraftModelDrafter
from specstrat.testing import FaultyDrafterFactory, check_drafter
from tests.runtime.conftest import make_worker
from tests.typing.guide_draft_lm_drafter import GREEDY_DRAFT_LM, GreedyDraftLMDrafterFactory

# Four slots and six requests: slots (and, without the engine's backstop, draft rows) are reused.
CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = [replace(r, max_new_tokens=24) for r in workload(6, seed=5)]
DRAFTING = [STANDALONE, DFLASH, DSPARK]


def _holds(runner: DraftKV, slot: int) -> bool:
    """Whether ``slot`` holds a draft row of ``runner``."""
    try:
        runner.rows_for([slot])
    except InvalidConfig:
        return False
    return True


# -- the slot table and a runner, without an engine ----------------------------------------------


def _table_and_runners(tiny: TinyLM, count: int = 2) -> tuple[SlotTable, list[KVRunner]]:
    table = SlotTable(RequestPool(4, 64, torch.device("cpu")), kv_capacity=1000)
    return table, [KVRunner(make_worker(tiny, requests=3), table) for _ in range(count)]


def test_each_slot_row_records_its_draft_rows_per_runner(tiny: TinyLM) -> None:
    """alloc_for records one fresh draft row per slot in that slot's row, keyed by the runner;
    rows_for reads them back in the order asked; free_for drops one runner's rows only."""
    table, (one, two) = _table_and_runners(tiny)
    a, b = (table.admit(Request(rid, [1, 2], 4), 10, "prefill") for rid in "ab")
    rows_one, rows_two = one.alloc_for([a, b]), two.alloc_for([b])
    assert len(set(rows_one)) == 2
    assert table.row(a).draft_rows == {0: rows_one[0]}
    assert table.row(b).draft_rows == {0: rows_one[1], 1: rows_two[0]}
    assert one.rows_for([b, a]) == rows_one[::-1]
    assert one.worker.requests.available == 1
    one.free_for([a, b, b])  # a slot freed twice, or holding none, is skipped
    assert (table.row(a).draft_rows, table.row(b).draft_rows) == ({}, {1: rows_two[0]})
    assert one.worker.requests.available == 3


def test_the_engines_backstop_frees_every_runners_rows(tiny: TinyLM) -> None:
    """free_draft_rows frees what every runner still holds for the slots, and forgets it."""
    table, (one, two) = _table_and_runners(tiny)
    a, b = (table.admit(Request(rid, [1, 2], 4), 10, "prefill") for rid in "ab")
    one.alloc_for([a, b])
    two.alloc_for([a])
    table.free_draft_rows([a])
    assert (table.row(a).draft_rows, one.worker.requests.available) == ({}, 2)
    assert two.worker.requests.available == 3
    assert _holds(one, b)


def test_rows_for_a_slot_without_a_draft_row_names_it(tiny: TinyLM) -> None:
    """rows_for on a slot that holds no row of the runner (never allocated, freed, or no request
    at all) is an InvalidConfig naming the slot and alloc_for."""
    table, (one, two) = _table_and_runners(tiny)
    a, b = (table.admit(Request(rid, [1, 2], 4), 10, "prefill") for rid in "ab")
    one.alloc_for([a])
    message = rf"slot {b} holds no draft row of this runner \(slots=\[{a}, {b}\]\); allocate one "
    with pytest.raises(InvalidConfig, match=message + r"per request with alloc_for"):
        one.rows_for([a, b])
    with pytest.raises(InvalidConfig, match=rf"slot {a} holds no draft row of this runner"):
        two.rows_for([a])  # held, but of another runner
    with pytest.raises(InvalidConfig, match=r"slot 4 holds no draft row"):
        one.rows_for([4])  # a free slot
    one.free_for([a])
    with pytest.raises(InvalidConfig, match=rf"slot {a} holds no draft row"):
        one.rows_for([a])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("free-slot", r"slot 6 holds no request; alloc_for takes the target's slots"),
        ("held", r"slot 1 already holds draft row \d+ of this runner; read it with rows_for"),
        ("repeated", r"slots=\[2, 2\] repeat a slot; one draft row per slot"),
        ("full", r"draft request pool has 3 free rows, 4 needed; raise max_running_requests"),
    ],
)
def test_alloc_for_is_all_or_none(tiny: TinyLM, case: str, message: str) -> None:
    """A refused alloc_for (a free slot, one holding a row already, a repeat, a full draft
    pool) allocates and records nothing."""
    table = SlotTable(RequestPool(8, 64, torch.device("cpu")), kv_capacity=1000)
    runner = KVRunner(make_worker(tiny, requests=4), table)
    slots = [table.admit(Request(f"r{i}", [1], 4), 10, "prefill") for i in range(5)]
    runner.alloc_for([1])
    asked = {"free-slot": [2, 6], "held": [2, 1], "repeated": [2, 2], "full": slots[1:]}[case]
    with pytest.raises(CapacityError if case == "full" else InvalidConfig, match=message):
        runner.alloc_for(asked)
    assert runner.worker.requests.available == 3
    assert [_holds(runner, s) for s in slots] == [True, False, False, False, False]


def test_free_refuses_a_row_a_slot_holds(tiny: TinyLM) -> None:
    """free (for rows from alloc) refuses a row held for a slot, which only free_for releases
    with its record; rows from alloc are freed as before."""
    table, (runner, _) = _table_and_runners(tiny)
    slot = table.admit(Request("a", [1], 4), 10, "prefill")
    (held,) = runner.alloc_for([slot])
    loose = runner.alloc(1)
    with pytest.raises(InvalidConfig, match=rf"draft rows \[{held}\] are held for slots"):
        runner.free([held, *loose])
    runner.free(loose)
    assert runner.worker.requests.available == 2
    assert runner.rows_for([slot]) == [held]


# -- in the engine -------------------------------------------------------------------------------


class _Watching:
    """A drafter wrapper that records, after each admit, the draft rows its runner shows for
    the admitted slots, and, after each release, the released slots still holding one."""

    def __init__(self, inner: Drafter[Any], spy: "_Spying") -> None:
        self.inner, self.spy = inner, spy

    def admit(self, admission: DraftAdmission[Any]) -> RelayPayload:
        payload = self.inner.admit(admission)
        (runner,) = self.spy.runners
        self.spy.live.update(zip(admission.slots, runner.rows_for(admission.slots), strict=True))
        self.spy.admitted.append((list(admission.slots), dict(self.spy.live)))
        return payload

    def release(self, slots: Sequence[int]) -> None:
        self.inner.release(slots)
        (runner,) = self.spy.runners
        self.spy.left.extend(s for s in slots if _holds(runner, s))
        for slot in slots:
            del self.spy.live[slot]

    def propose(self, step: DraftStep) -> DraftTree:
        return self.inner.propose(step)

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        return self.inner.commit(outcome)


@dataclass(frozen=True, slots=True)
class _Spying:
    """Wraps a drafter factory: keeps the runners the engine makes for its drafter, and wraps
    the drafter in :class:`_Watching`."""

    inner: DrafterFactory[Any]
    runners: list[DraftKV] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)  # slot -> draft row, while admitted
    admitted: list[tuple[list[int], dict[int, int]]] = field(default_factory=list)
    left: list[int] = field(default_factory=list)

    @property
    def needs(self) -> DrafterNeeds:
        return self.inner.needs

    def create_drafter(self, context: DrafterContext) -> _Watching:
        new_kv, new_block = context.new_kv_runner, context.new_block_runner

        def kv(model: CausalLM) -> DraftKV:
            self.runners.append(new_kv(model))
            return self.runners[-1]

        def block(model: CausalLM) -> BlockKV:
            assert new_block is not None
            runner = new_block(model)
            self.runners.append(runner)
            return runner

        spied = replace(context, new_kv_runner=kv, new_block_runner=block if new_block else None)
        return _Watching(self.inner.create_drafter(spied), self)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return self.inner.prefill_payload(models, bonus_tokens, hidden)


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """The target's own output for REQUESTS (what every lossless run returns)."""
    return Engine(NONE, models, CONFIG).run(REQUESTS)


@pytest.mark.parametrize("algo", DRAFTING, ids=lambda a: a.name)
def test_the_slot_table_shows_each_slots_draft_rows_until_release(
    algo: SpecAlgorithm[Any], models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """After each admission every admitted slot holds a draft row of the drafter's one runner,
    no row held by two slots; after release none does; the output is the target's alone."""
    spy = _Spying(algo.drafter)
    engine = Engine(replace(algo, drafter=spy), models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    outputs = engine.run(REQUESTS)
    assert len(spy.runners) == 1
    assert sum(len(slots) for slots, _ in spy.admitted) == len(REQUESTS)  # slots were reused
    for slots, live in spy.admitted:
        assert set(slots) <= set(live)
        assert len(set(live.values())) == len(live)
    assert (spy.left, spy.live) == ([], {})
    assert not any(_holds(spy.runners[0], s) for s in range(1, CONFIG.max_running_requests + 1))
    assert (engine.free_slots, engine.free_kv_tokens) == before
    assert outputs == target_only


@pytest.mark.parametrize("algo", DRAFTING, ids=lambda a: a.name)
def test_a_drafter_whose_release_does_nothing_leaks_no_draft_kv(
    algo: SpecAlgorithm[Any],
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drafter that never frees its draft rows leaks nothing: the engine frees what the slot
    table says released slots still hold, so later requests find free draft rows (4 slots, 6
    requests), the engine stays usable and the output is unchanged."""
    drafter_type = DraftModelDrafter if algo is STANDALONE else BlockDrafter
    monkeypatch.setattr(drafter_type, "release", lambda self, slots: None)
    engine = Engine(algo, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    assert engine.run(REQUESTS) == target_only
    assert (engine.free_slots, engine.free_kv_tokens) == before
    engine.run([Request("again", (65, 66, 67), 8)])
    assert (engine.free_slots, engine.free_kv_tokens) == before


@pytest.mark.parametrize("algo", DRAFTING, ids=lambda a: a.name)
def test_a_drafter_whose_release_raises_leaks_no_draft_kv(
    algo: SpecAlgorithm[Any], models: EmbeddedModels
) -> None:
    """A release hook that raises ends the run naming it, and every draft pool is free again."""
    faulty = FaultyDrafterFactory(algo.drafter, "release", RuntimeError("gone"))
    engine = Engine(replace(algo, drafter=faulty), models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(StrategyError, match=rf"{algo.name}\.drafter\.release: raised RuntimeError"):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before


@pytest.mark.parametrize("algo", DRAFTING, ids=lambda a: a.name)
def test_a_failed_run_leaves_every_draft_pool_free(
    algo: SpecAlgorithm[Any], models: EmbeddedModels
) -> None:
    """A drafter failing mid-run, with draft rows held, ends the run with every pool free."""
    faulty = FaultyDrafterFactory(algo.drafter, "propose", RuntimeError("mid"), after=3)
    engine = Engine(replace(algo, drafter=faulty), models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(StrategyError, match=rf"{algo.name}\.drafter\.propose: raised RuntimeError"):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before


def test_the_guides_draft_lm_drafter_passes_the_kit_and_drafts(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """The drafter guide's draft-LM drafter passes check_drafter, reproduces the target's output
    with drafts accepted, and leaves every draft row free."""
    check_drafter(GreedyDraftLMDrafterFactory(), algorithm="GREEDY_DRAFT_LM")
    engine = Engine(GREEDY_DRAFT_LM, models, CONFIG)
    before = (engine.free_slots, engine.free_kv_tokens)
    assert engine.run(REQUESTS) == target_only
    assert engine.stats.accepted_by_position[0] > 0
    assert (engine.free_slots, engine.free_kv_tokens) == before
