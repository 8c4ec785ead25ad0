"""Conformance runners: built-ins pass, one line each; broken strategies fail naming the
obligation."""

from typing import Any

import pytest
import torch

import specstrat
from specstrat import Capabilities, ConformanceError, PrebuiltBatch, RelayPayload
from specstrat.strategies import (
    DflashDisaggDraftBuilder,
    DsparkDisaggDraftBuilder,
    EagleDisaggDraftBuilder,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    RingFutureMapFactory,
    SlotFutureMap,
    SlotFutureMapFactory,
)
from specstrat.testing import (
    check_algorithm,
    check_disagg_draft_builder,
    check_future_map_factory,
    check_target_verify_policy,
    run_conformance,
)
from tests.typing.readme_example import MY_EAGLE

EAGLE_CAPS = Capabilities(has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True)


def test_builtin_strategies_pass_their_runners() -> None:
    """Every built-in strategy passes the runner of its hook."""
    check_target_verify_policy(OffsetVerifyPolicy())
    check_target_verify_policy(
        OffsetVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=-1)
    )
    check_target_verify_policy(OffsetVerifyPolicy(target_offset=1))
    check_future_map_factory(SlotFutureMapFactory())
    check_future_map_factory(RingFutureMapFactory())
    check_disagg_draft_builder(EagleDisaggDraftBuilder())
    check_disagg_draft_builder(
        DsparkDisaggDraftBuilder(), capabilities=Capabilities(has_draft_kv=True)
    )
    check_disagg_draft_builder(
        DflashDisaggDraftBuilder(), capabilities=Capabilities(has_draft_kv=True)
    )
    check_disagg_draft_builder(NoDraftStateDisaggDraftBuilder(), capabilities=Capabilities())


@pytest.mark.parametrize("algo", [*specstrat.BUILTINS, MY_EAGLE], ids=lambda a: a.name)
def test_builtin_algorithms_and_readme_example_pass(algo: specstrat.SpecAlgorithm[Any]) -> None:
    """Each built-in algorithm and the README example pass check_algorithm."""
    check_algorithm(algo)


class GreedyPolicy:
    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        return num_draft_tokens + 2


class FloatPolicy(GreedyPolicy):
    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> Any:
        return num_draft_tokens / 1


class FlakyPolicy(GreedyPolicy):
    def __init__(self) -> None:
        self.calls = 0

    def supports_target_verify_for_draft(self) -> bool:
        self.calls += 1
        return self.calls % 2 == 0


def test_policy_over_width_names_the_obligation() -> None:
    """T = D + 2 breaks 'T is an int in 1..num_draft_tokens+1'."""
    with pytest.raises(
        ConformanceError,
        match=(
            r"T is an int in 1\.\.num_draft_tokens\+1.*num_draft_tokens=1, "
            r"is_draft_worker=False\) returned 3"
        ),
    ):
        check_target_verify_policy(GreedyPolicy())


def test_policy_returning_float_names_the_type() -> None:
    """A float T is reported with its type."""
    with pytest.raises(ConformanceError, match=r"returned 1.0 \(float\)"):
        check_target_verify_policy(FloatPolicy())


def test_impure_policy_is_caught() -> None:
    """A policy whose answer changes between calls breaks purity."""
    with pytest.raises(ConformanceError, match=r"the same every call.*returned False then True"):
        check_target_verify_policy(FlakyPolicy())


def test_structural_failure_is_a_conformance_error() -> None:
    """A policy missing a method fails 'implements TargetVerifyPolicy'."""
    with pytest.raises(ConformanceError, match=r"implements TargetVerifyPolicy.*has no method"):
        check_target_verify_policy(object())


class StaleMap(SlotFutureMap):
    """Ignores every write after the first to a slot (a stale-read bug)."""

    def __init__(self) -> None:
        super().__init__(8, torch.device("cpu"))
        self.seen: set[int] = set()

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        super().stash(slots, RelayPayload(seq_lens=new_seq_lens))

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        fresh = [i for i, s in enumerate(slots.tolist()) if s not in self.seen]
        self.seen.update(slots.tolist())
        keep = torch.tensor(fresh, dtype=torch.int64)
        trimmed = RelayPayload(**{k: v.index_select(0, keep) for k, v in payload.present().items()})
        super().stash(slots.index_select(0, keep), trimmed)


class CastingMap(SlotFutureMap):
    """Silently casts mismatched payloads instead of refusing them."""

    def __init__(self) -> None:
        super().__init__(8, torch.device("cpu"))

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        if payload.topk_p is not None and payload.topk_p.shape[1] != 2:
            return
        if payload.hidden_states is not None and payload.hidden_states.dtype != torch.float32:
            return
        super().stash(slots, payload)


class Factory:
    def __init__(self, cls: type) -> None:
        self.cls = cls

    def create_future_map(self, mrr: int, chunk: int, ctx: int, device: torch.device) -> Any:
        return self.cls()


def test_stale_future_map_is_caught() -> None:
    """A map that keeps an old value after a re-write breaks 'no stale read'."""
    with pytest.raises(ConformanceError, match=r"no stale read.*bonus_tokens"):
        check_future_map_factory(Factory(StaleMap))


def test_silently_casting_future_map_is_caught() -> None:
    """A map that accepts a mismatched width breaks the RelayError obligation."""
    with pytest.raises(
        ConformanceError, match=r"topk_p of another width or dtype raises RelayError.*accepted"
    ):
        check_future_map_factory(Factory(CastingMap))


class NoneBuilder:
    def build_disagg_draft_input(self, batch: PrebuiltBatch, last: torch.Tensor, fm: Any) -> None:
        return None


class MutatingBuilder:
    def build_disagg_draft_input(self, batch: PrebuiltBatch, last: torch.Tensor, fm: Any) -> None:
        last.add_(1)
        return None


class NoPublishBuilder:
    def build_disagg_draft_input(self, batch: PrebuiltBatch, last: torch.Tensor, fm: Any) -> int:
        return 1


class StackingBuilder:
    """The engines' per-request stacking: crashes on an empty batch."""

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last: torch.Tensor, fm: Any
    ) -> torch.Tensor:
        return torch.stack([torch.as_tensor(int(t)) for t in last])


def test_builder_returning_none_with_hidden_state_is_caught() -> None:
    """Returning None for an algorithm that carries hidden states breaks the None obligation."""
    with pytest.raises(
        ConformanceError, match=r"returns None only when the algorithm has no draft state"
    ):
        check_disagg_draft_builder(NoneBuilder(), capabilities=EAGLE_CAPS)


def test_builder_mutating_inputs_is_caught() -> None:
    """A builder that edits last_tokens in place breaks 'does not modify'."""
    with pytest.raises(ConformanceError, match=r"does not modify the batch or last_tokens"):
        check_disagg_draft_builder(MutatingBuilder(), capabilities=Capabilities())


def test_builder_ignoring_overlap_is_caught() -> None:
    """A builder that never publishes under overlap breaks the relay obligation."""
    with pytest.raises(ConformanceError, match=r"publishes batch.seq_lens.*resolved seq_lens=None"):
        check_disagg_draft_builder(NoPublishBuilder(), capabilities=Capabilities())


def test_stacking_builder_fails_on_empty_batch() -> None:
    """The engines' torch.stack builder fails conformance at bs=0."""
    with pytest.raises(ConformanceError, match=r"bs=0.*stack expects a non-empty TensorList"):
        check_disagg_draft_builder(StackingBuilder(), capabilities=Capabilities())


def test_run_conformance_reports_every_check() -> None:
    """run_conformance returns one result per check and keeps going after a failure."""
    results = run_conformance(specstrat.EAGLE)
    assert [r.name for r in results] == [
        "target_verify",
        "future_map",
        "disagg",
        "drafter",
        "tree",
        "acceptance",
        "speculation",
        "engine methods",
    ]
    assert all(r.passed for r in results)
    bad = run_conformance("EAGLE")
    assert len(bad) == 1
    assert not bad[0].passed
    assert "not a SpecAlgorithm" in bad[0].message
