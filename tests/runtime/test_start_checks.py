"""Construction and start-up checks without holes: a broken strategy is named before the first
request (or at its first use), never an AttributeError or a bare exception mid-run."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

import specstrat
import specstrat.strategies
from specstrat import (
    DSPARK,
    EAGLE,
    NGRAM,
    Acceptance,
    DrafterNeeds,
    EngineStateError,
    InvalidStrategy,
    StrategyError,
)
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.strategies import GreedyAcceptance
from specstrat.testing import FaultyAcceptance

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = [replace(r, max_new_tokens=8) for r in workload(3, seed=3)]


class NoneFactory(specstrat.strategies.NgramDrafterFactory):
    def create_drafter(self, context: Any) -> Any:
        return None


class NoCommit:
    """A drafter that can propose but not commit."""

    def admit(self, admission: Any) -> Any:
        return specstrat.RelayPayload()

    def release(self, slots: Any) -> None:
        return None

    def propose(self, step: Any) -> Any:
        return None


class NoCommitFactory(specstrat.strategies.NgramDrafterFactory):
    def create_drafter(self, context: Any) -> Any:
        return NoCommit()


@dataclass(frozen=True, slots=True)
class RaisingNeeds(specstrat.strategies.NgramDrafterFactory):
    @property
    def needs(self) -> DrafterNeeds:
        raise NotImplementedError("needs is not decided yet")


class RaisingLossless(GreedyAcceptance):
    @property
    def lossless(self) -> bool:
        raise NotImplementedError("ask the authors")


class DividingPolicy(specstrat.strategies.OffsetVerifyPolicy):
    def get_num_tokens_per_req_for_target_verify(self, d: int, is_draft_worker: bool) -> int:
        return d // 0


class DividingDraftPolicy(specstrat.strategies.OffsetVerifyPolicy):
    def supports_target_verify_for_draft(self) -> bool:
        raise ZeroDivisionError("which worker?")


class LaterNarrowerPolicy:
    """Answers T=4 at the start-up purity check, then T=3: impure past the check."""

    def __init__(self) -> None:
        self.calls = 0

    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(self, d: int, is_draft_worker: bool) -> int:
        self.calls += 1
        return 4 if self.calls <= 3 else 3


class RaisingFutureMapFactory(specstrat.strategies.SlotFutureMapFactory):
    def create_future_map(self, *args: Any) -> Any:
        raise OSError("no room")


ENGINE_START: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "create-drafter-none",
        lambda: replace(NGRAM, drafter=NoneFactory()),
        InvalidStrategy,
        (
            r"NGRAM\.drafter\.create_drafter\(\) returned "
            r"None; drafter=NoneFactory must return a Drafter"
        ),
    ),
    (
        "create-drafter-no-commit",
        lambda: replace(NGRAM, drafter=NoCommitFactory()),
        InvalidStrategy,
        r"NGRAM\.drafter\.create_drafter\(\) result=NoCommit has no method commit\(outcome",
    ),
    (
        "policy-raises",
        lambda: replace(EAGLE, target_verify=DividingPolicy()),
        StrategyError,
        r"EAGLE\.target_verify\.get_num_tokens_per_req_for_target_verify: raised "
        r"ZeroDivisionError: integer division or modulo by zero",
    ),
    (
        "policy-impure-past-the-check",
        lambda: replace(EAGLE, target_verify=LaterNarrowerPolicy()),
        StrategyError,
        r"EAGLE\.target_verify\.get_num_tokens_per_req_for_target_verify: "
        r"target_verify=LaterNarrowerPolicy answered T=3 for the target worker when its graph "
        r"runner was built, after T=4",
    ),
    (
        "future-map-factory-raises",
        lambda: replace(EAGLE, future_map=RaisingFutureMapFactory()),
        StrategyError,
        r"EAGLE\.future_map\.create_future_map: raised OSError: no room",
    ),
]


@pytest.mark.parametrize(
    ("case", "make", "error", "message"), ENGINE_START, ids=[c[0] for c in ENGINE_START]
)
def test_engine_start_names_the_strategy(
    case: str,
    make: Callable[[], Any],
    error: type[Exception],
    message: str,
    models: EmbeddedModels,
) -> None:
    """A drafter factory returning None or an incomplete drafter, a verify policy that raises
    or answers differently past the purity check, and a relay factory that raises are named
    at Engine(), before any request."""
    with pytest.raises(error, match=message) as info:
        Engine(make(), models, CONFIG)
    if error is StrategyError and "raised" in message:
        assert info.value.__cause__ is not None


CONSTRUCTION: list[tuple[str, Callable[[], Any], str, type[BaseException]]] = [
    (
        "needs-raises",
        lambda: replace(NGRAM, drafter=RaisingNeeds()),
        r"drafter=RaisingNeeds\.needs raised NotImplementedError: needs is not decided yet; "
        r"DrafterFactory\.needs must be readable",
        NotImplementedError,
    ),
    (
        "lossless-raises",
        lambda: replace(NGRAM, acceptance=RaisingLossless()),
        r"acceptance=RaisingLossless\.lossless raised NotImplementedError: ask the authors",
        NotImplementedError,
    ),
    (
        "draft-worker-policy-raises",
        lambda: replace(DSPARK, target_verify=DividingDraftPolicy()),
        r"DSPARK\.target_verify\.supports_target_verify_for_draft: raised ZeroDivisionError: which "
        r"worker\?",
        ZeroDivisionError,
    ),
]


@pytest.mark.parametrize(
    ("case", "make", "message", "cause"), CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION]
)
def test_raising_members_are_named_at_construction(
    case: str, make: Callable[[], Any], message: str, cause: type[BaseException]
) -> None:
    """A needs or lossless property, or a policy, that raises while SpecAlgorithm checks it is
    an InvalidStrategy naming hook and member, the original chained."""
    with pytest.raises(InvalidStrategy, match=message) as info:
        make()
    assert isinstance(info.value.__cause__, cause)


def test_drafter_members_inherited_by_the_protocol_are_checked() -> None:
    """check_strategy against Drafter sees the methods Drafter inherits (it defines none)."""
    from specstrat.algorithm import check_strategy
    from specstrat.protocols import Drafter

    with pytest.raises(InvalidStrategy, match=r"d=NoCommit has no method commit\(outcome"):
        check_strategy("d", Drafter, NoCommit())
    with pytest.raises(InvalidStrategy, match=r"d is None; pass an object that satisfies Drafter"):
        check_strategy("d", Drafter, None)


def on_meta(answer: Acceptance) -> Acceptance:
    return Acceptance(
        answer.accept_index.to("meta"), answer.accept_lengths, answer.bonus_tokens.to("meta")
    )


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_an_acceptance_on_another_device_is_named_at_first_use(
    overlap: bool, models: EmbeddedModels
) -> None:
    """A meta-device acceptance answer is a StrategyError naming the rule (not a raw
    NotImplementedError); nothing leaks and the engine refuses reuse."""
    algo = replace(EAGLE, acceptance=FaultyAcceptance(EAGLE.acceptance, on_meta))
    engine = Engine(algo, models, replace(CONFIG, overlap=overlap))
    before = (engine.free_slots, engine.free_kv_tokens)
    with pytest.raises(
        StrategyError,
        match=r"EAGLE\.acceptance\.accept: answered accept_index on meta; the engine runs on cpu",
    ):
        engine.run(REQUESTS)
    assert (engine.free_slots, engine.free_kv_tokens) == before
    with pytest.raises(EngineStateError, match=r"closed after a failed run"):
        engine.run(REQUESTS)


def test_a_meta_tensor_check_reads_nothing() -> None:
    """The device check runs before any value is read (a meta tensor has none to read)."""
    from specstrat.contracts import check_acceptance_shape

    shapes: list[tuple[int, ...]] = [(2, 3), (2,), (2,)]
    answer = Acceptance(*(torch.zeros(s, dtype=torch.int64, device="meta") for s in shapes))
    with pytest.raises(
        StrategyError, match=r"X\.acceptance\.accept: answered accept_index on meta"
    ):
        check_acceptance_shape("X", answer, 2, 3, torch.device("cpu"))
