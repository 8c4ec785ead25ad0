"""Conformance and composition messages name the user's algorithm and strategy, and say
precisely what is wrong."""

from dataclasses import dataclass, replace

import pytest

from specstrat import (
    NGRAM,
    ConformanceError,
    DrafterContext,
    DraftStep,
    DraftTree,
    InvalidStrategy,
    VerifyInputs,
)
from specstrat.drafting import Acceptance
from specstrat.strategies import (
    GreedyAcceptance,
    NoDrafter,
    NoDrafterFactory,
    OffsetVerifyPolicy,
    SlotFutureMapFactory,
)
from specstrat.testing import check_acceptance_rule, check_target_verify_policy, run_conformance


class IndexingDrafter(NoDrafter):
    def propose(self, step: DraftStep) -> DraftTree:
        return [DraftTree.chain(step.bonus_tokens[:, None])][1]  # the user's IndexError


@dataclass(frozen=True, slots=True)
class IndexingFactory(NoDrafterFactory):
    def create_drafter(self, context: DrafterContext) -> IndexingDrafter:
        return IndexingDrafter()


class FloatAcceptance(GreedyAcceptance):
    def accept(self, inputs: VerifyInputs) -> Acceptance:
        answer = super().accept(inputs)
        return replace(answer, accept_lengths=answer.accept_lengths.float())


@dataclass(frozen=True, slots=True)
class ZeroWidth(OffsetVerifyPolicy):
    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class IntSupport(OffsetVerifyPolicy):
    def supports_target_verify_for_draft(self) -> bool:
        return 1  # type: ignore[return-value]


def failures(algo: object) -> dict[str, str]:
    """The failed checks of ``run_conformance``, by name."""
    return {r.name: r.message for r in run_conformance(algo) if not r.passed}


def test_a_failing_drafter_is_named_by_the_users_algorithm() -> None:
    """A drafter's error names BUGGY.drafter and its factory, never the kit's own algorithm."""
    found = failures(replace(NGRAM, name="BUGGY", drafter=IndexingFactory()))
    assert list(found) == ["drafter"]
    assert found["drafter"].startswith("BUGGY.drafter (IndexingFactory) broke the obligation")
    assert "BUGGY.drafter.propose: raised IndexError" in found["drafter"]
    assert "CONFORMANCE" not in found["drafter"]


def test_a_failing_rule_is_named_by_the_users_algorithm() -> None:
    """A float accept_lengths names FLOATY.acceptance (FloatAcceptance) and the field's dtype."""
    found = failures(replace(NGRAM, name="FLOATY", acceptance=FloatAcceptance()))
    assert list(found) == ["acceptance"]
    assert found["acceptance"].startswith("FLOATY.acceptance (FloatAcceptance) broke")
    assert "FLOATY.acceptance.accept: accept_lengths is torch.float32" in found["acceptance"]


def test_a_lone_rule_is_named_by_its_class() -> None:
    """Checked alone, the rule is named by its protocol and class, once."""
    with pytest.raises(
        ConformanceError,
        match=r"^AcceptanceRule FloatAcceptance broke .*: FloatAcceptance\.acceptance\.accept: "
        r"accept_lengths is torch\.float32",
    ):
        check_acceptance_rule(FloatAcceptance())


def test_an_out_of_range_width_says_out_of_range() -> None:
    """T = 0 is reported as outside 1..D+1, not as an impure answer."""
    with pytest.raises(
        ConformanceError,
        match=r"^ZERO\.target_verify \(ZeroWidth\) broke .*num_draft_tokens=1, "
        r"is_draft_worker=False\) returned 0, outside 1\.\.2 \(T counts the root",
    ):
        check_target_verify_policy(ZeroWidth(), algorithm="ZERO")


def test_engine_methods_report_the_policys_error_not_aliasing() -> None:
    """The algorithm's engine methods pass on the policy's named error, not an alias complaint."""
    found = failures(replace(NGRAM, name="ZERO", target_verify=ZeroWidth()))
    assert found["engine methods"].startswith(
        "ZERO (SpecAlgorithm) broke the obligation 'answers T for num_draft_tokens 1..8': "
        "ZERO.target_verify.get_num_tokens_per_req_for_target_verify: returned tokens per "
        "request=0"
    )
    assert "aliases" not in found["engine methods"]


def test_a_non_bool_support_answer_names_its_type() -> None:
    """supports_target_verify_for_draft answering 1 is 'not a bool', not '1 then 1'."""
    with pytest.raises(ConformanceError, match=r"returned 1 \(int\), not a bool"):
        check_target_verify_policy(IntSupport())


class MaybeLossless(GreedyAcceptance):
    @property
    def lossless(self) -> bool:
        return "yes"  # type: ignore[return-value]


def test_a_wrong_strategy_in_a_composition_names_the_algorithm() -> None:
    """A FutureMapFactory passed as target_verify is refused naming MINE and the field."""
    with pytest.raises(
        InvalidStrategy,
        match=r"^MINE: target_verify=SlotFutureMapFactory has no method "
        r"supports_target_verify_for_draft",
    ):
        replace(NGRAM, name="MINE", target_verify=SlotFutureMapFactory())  # type: ignore[arg-type]


def test_a_non_bool_lossless_names_the_algorithm() -> None:
    """A rule whose lossless is a str is refused naming MINE and the rule."""
    with pytest.raises(
        InvalidStrategy, match=r"^MINE: acceptance=MaybeLossless\.lossless is 'yes'; "
    ):
        replace(NGRAM, name="MINE", acceptance=MaybeLossless())
