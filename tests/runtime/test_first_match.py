"""FirstMatch: drafters asked in order, per request and step; lossless, every member kept
current, a member's fault named by its position."""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

import specstrat
from specstrat import (
    EAGLE,
    NGRAM,
    DraftAdmission,
    Drafter,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    InvalidConfig,
    LoadedModels,
    ModelSet,
    RelayPayload,
    StepOutcome,
    StrategyError,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.strategies import (
    EagleHeadDrafterFactory,
    FirstMatch,
    NgramDrafterFactory,
    NoDrafterFactory,
)
from specstrat.testing import (
    FaultyDrafterFactory,
    check_algorithm,
    check_lossless_in_distribution,
)
from tests.typing.first_match import LOOKUP_THEN_HEAD

CONFIG = EngineConfig(context_len=512, max_running_requests=4, num_draft_tokens=4)
REQUESTS = workload(6, seed=3)


@dataclass
class Log:
    """What a recording member saw: (step, slots) proposed for, and slots committed per step."""

    proposed: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    committed: list[tuple[int, ...]] = field(default_factory=list)


class RecordingDrafter:
    """Proposes nothing; records every propose and commit."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def admit(self, admission: DraftAdmission[object]) -> RelayPayload:
        return RelayPayload()

    def release(self, slots: Sequence[int]) -> None:
        """Nothing kept."""

    def propose(self, step: DraftStep) -> DraftTree:
        self.log.proposed.append((len(self.log.committed), step.slots))
        dev = step.bonus_tokens.device
        filler = step.bonus_tokens[:, None].expand(len(step.slots), step.max_nodes).contiguous()
        return DraftTree.chain(
            filler, lengths=torch.zeros(len(step.slots), dtype=torch.int64, device=dev)
        )

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        self.log.committed.append(outcome.step.slots)
        return RelayPayload()


@dataclass(frozen=True, slots=True)
class RecordingFactory:
    """A member that never proposes, logging what it is asked."""

    log: Log

    @property
    def needs(self) -> DrafterNeeds:
        return DrafterNeeds()

    def create_drafter(self, context: DrafterContext) -> Drafter[object]:
        return RecordingDrafter(self.log)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return RelayPayload()


def _run(algo: Any, models: EmbeddedModels, **config: Any) -> tuple[dict[str, list[int]], Any]:
    engine = Engine(algo, models, replace(CONFIG, **config))
    outputs = engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == (4, 4 * 512)
    return outputs, engine.stats


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_lookup_then_head_is_lossless_and_accepts_more_than_either(
    models: EmbeddedModels, overlap: bool
) -> None:
    """Lookup first, head second: target-only's tokens, and τ above both members alone."""
    target, _ = _run(replace(EAGLE, drafter=NoDrafterFactory()), models, num_draft_tokens=1)
    outputs, stats = _run(LOOKUP_THEN_HEAD, models, overlap=overlap)
    assert outputs == target
    taus = [_run(a, models, overlap=overlap)[1].acceptance_length for a in (NGRAM, EAGLE)]
    assert stats.acceptance_length > max(taus)


def test_the_composition_passes_the_conformance_kit() -> None:
    """check_algorithm passes the ordered composition, hook by hook and in an engine."""
    check_algorithm(LOOKUP_THEN_HEAD)


def test_a_member_that_never_proposes_changes_nothing(models: EmbeddedModels) -> None:
    """A silent first member leaves NGRAM's tokens and τ as NGRAM alone has them."""
    log = Log()
    algo = replace(NGRAM, drafter=FirstMatch((RecordingFactory(log), NGRAM.drafter)))
    outputs, stats = _run(algo, models)
    alone, alone_stats = _run(NGRAM, models)
    assert outputs == alone
    assert stats.acceptance_length == alone_stats.acceptance_length
    assert log.proposed  # asked every step, first


def test_a_member_after_a_match_still_sees_every_commit(models: EmbeddedModels) -> None:
    """The second member is asked only for requests the lookup missed, but commits them all."""
    log = Log()
    algo = replace(NGRAM, drafter=FirstMatch((NGRAM.drafter, RecordingFactory(log))))
    _run(algo, models)
    asked = sum(len(slots) for _, slots in log.proposed)
    committed = sum(len(slots) for slots in log.committed)
    assert 0 < asked < committed  # lookup hits were never passed on
    assert all(set(slots) <= set(log.committed[step]) for step, slots in log.proposed)


@pytest.mark.parametrize("method", ["propose", "commit", "admit"])
def test_a_raising_member_is_named_by_its_position(models: EmbeddedModels, method: str) -> None:
    """A member raising mid-run is named by position and type; no slot or KV index leaks."""
    faulty = FaultyDrafterFactory(EAGLE.drafter, method, ValueError("boom"), after=1)
    algo = replace(EAGLE, drafter=FirstMatch((NgramDrafterFactory(), faulty)))
    engine = Engine(algo, models, CONFIG)
    with pytest.raises(
        StrategyError,
        match=rf"EAGLE\.drafter\.{method}: .*FirstMatch member 1 \(\w+\)\.{method} raised "
        r"ValueError: boom",
    ):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == (4, 4 * 512)


def test_a_member_refusing_the_models_stays_a_configuration_error(
    models: EmbeddedModels,
) -> None:
    """The head member without a head is an InvalidConfig naming member 1."""
    bare = ModelSet(target=models.target)
    with pytest.raises(InvalidConfig, match=r"FirstMatch member 1 \(EagleHeadDrafterFactory\): "):
        Engine(LOOKUP_THEN_HEAD, bare, CONFIG)


def test_needs_are_the_members_together() -> None:
    """The head's needs carry over; trees only where every member drafts them."""
    needs = FirstMatch((NgramDrafterFactory(), EagleHeadDrafterFactory())).needs
    head = EagleHeadDrafterFactory().needs
    assert needs == replace(head, trees=False)
    both = FirstMatch((EagleHeadDrafterFactory(), NoDrafterFactory())).needs
    assert both.trees is False


@pytest.mark.parametrize(
    ("members", "kwargs", "message"),
    [
        ((NgramDrafterFactory(),), {}, r"FirstMatch got 1 member\(s\); compose at least two"),
        ((NgramDrafterFactory(), "ngram"), {}, r"member 1 is a str, not a DrafterFactory"),
        (
            (EagleHeadDrafterFactory(), EagleHeadDrafterFactory(topk=2)),
            {},
            r"members 0 \(EagleHeadDrafterFactory\) and 1 \(EagleHeadDrafterFactory\) both "
            r"relay \['hidden_states', 'topk_index', 'topk_p'\]",
        ),
        (
            (NgramDrafterFactory(), NoDrafterFactory()),
            {"min_confidence": "high"},
            r"min_confidence='high' must be a number in \[0, 1\] or None",
        ),
        (
            (NgramDrafterFactory(), NoDrafterFactory()),
            {"min_confidence": True},
            r"min_confidence=True must be a number in \[0, 1\]",
        ),
        (
            (NgramDrafterFactory(), NoDrafterFactory()),
            {"min_confidence": float("nan")},
            r"min_confidence=nan must be a number in \[0, 1\]",
        ),
        (
            (NgramDrafterFactory(), NoDrafterFactory()),
            {"min_confidence": 1.5},
            r"min_confidence=1.5 must be a number in \[0, 1\]",
        ),
    ],
    ids=[
        "one-member",
        "not-a-factory",
        "shared-relay-field",
        "bad-threshold",
        "bool",
        "nan",
        "above-1",
    ],
)
def test_bad_compositions_are_refused(members: Any, kwargs: Any, message: str) -> None:
    """Too few members, a non-factory, two members relaying one field, a bad threshold."""
    with pytest.raises(InvalidConfig, match=message):
        FirstMatch(members, **kwargs)


def test_the_merged_tree_pads_each_row_to_the_step(models: EmbeddedModels) -> None:
    """Rows from a shorter member tree are padded with filler beyond their lengths."""
    engine = Engine(LOOKUP_THEN_HEAD, models, replace(CONFIG, num_draft_tokens=5))
    outputs = engine.run([Request("r", (65, 66, 65, 66, 65), 12)])
    assert len(outputs["r"]) == 12


def test_a_raising_member_on_the_prefill_side_is_named(models: EmbeddedModels) -> None:
    """prefill_payload names the member that raised, by position and type."""
    faulty = FaultyDrafterFactory(EAGLE.drafter, "prefill_payload", OSError("disk"))
    composed = FirstMatch((NgramDrafterFactory(), faulty))
    bonus, hidden = torch.tensor([65]), torch.zeros(1, 128, dtype=torch.float64)
    with pytest.raises(
        RuntimeError,
        match=r"FirstMatch member 1 \(FaultyDrafterFactory\)\.prefill_payload raised OSError: "
        r"disk",
    ):
        composed.prefill_payload(models, bonus, hidden)


def test_a_confidence_threshold_under_sampling_is_lossless(models: EmbeddedModels) -> None:
    """Lookup, then DSPARK's block cut at confidence 0.5: lossless in distribution at T = 1."""
    drafter = FirstMatch((NgramDrafterFactory(), specstrat.DSPARK.drafter), min_confidence=0.5)
    algo = replace(specstrat.DSPARK, name="LOOKUP_THEN_BLOCK", drafter=drafter)
    report = check_lossless_in_distribution(algo, temperature=1.0, num_samples=500, models=models)
    assert report.p_value >= report.significance
