"""SpecAlgorithm: eager validation of strategies, delegation, and checked policy results."""

from dataclasses import FrozenInstanceError
from typing import Any

import pytest
import torch

from specstrat import EAGLE, Capabilities, InvalidStrategy, SpecAlgorithm, StrategyError
from specstrat.strategies import (
    GreedyAcceptance,
    NgramDrafterFactory,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    SlotFutureMap,
    SlotFutureMapFactory,
)


def compose(**overrides: Any) -> SpecAlgorithm[Any]:
    """An algorithm from default strategies, with some replaced."""
    fields: dict[str, Any] = {
        "name": "CUSTOM",
        "capabilities": Capabilities(),
        "target_verify": OffsetVerifyPolicy(),
        "future_map": SlotFutureMapFactory(),
        "disagg": NoDraftStateDisaggDraftBuilder(),
        "drafter": NgramDrafterFactory(),
        "acceptance": GreedyAcceptance(),
    }
    fields.update(overrides)
    return SpecAlgorithm(**fields)


class OnlySupports:
    def supports_target_verify_for_draft(self) -> bool:
        return False


class AttributeNotMethod:
    supports_target_verify_for_draft = True

    def get_num_tokens_per_req_for_target_verify(self, d: int, w: bool) -> int:
        return d


class TooFewParams:
    def supports_target_verify_for_draft(self) -> bool:
        return False

    def get_num_tokens_per_req_for_target_verify(self, d: int) -> int:
        return d


class ExtraRequiredParam:
    def build_disagg_draft_input(self, batch: object, last: object, fm: object, extra: int) -> None:
        return None


class Returns:
    """A policy returning a fixed value from both methods."""

    def __init__(self, tokens: object, allowed: object = False) -> None:
        self.tokens, self.allowed = tokens, allowed

    def supports_target_verify_for_draft(self) -> Any:
        return self.allowed

    def get_num_tokens_per_req_for_target_verify(self, d: int, w: bool) -> Any:
        return self.tokens


def test_missing_method_is_refused_naming_hook_and_method() -> None:
    """A policy without get_num_tokens_per_req_for_target_verify is refused at construction."""
    with pytest.raises(
        InvalidStrategy,
        match=r"target_verify=OnlySupports has no method get_num_tokens_per_req_for_target_verify",
    ):
        compose(target_verify=OnlySupports())


def test_non_callable_member_is_refused() -> None:
    """A hook 'method' that is a plain attribute is refused, saying what was found."""
    with pytest.raises(InvalidStrategy, match=r"supports_target_verify_for_draft is a bool"):
        compose(target_verify=AttributeNotMethod())


def test_wrong_arity_is_refused() -> None:
    """A method taking fewer positional arguments than the Protocol passes is refused."""
    with pytest.raises(InvalidStrategy, match=r"cannot take the 2 positional arguments"):
        compose(target_verify=TooFewParams())


def test_extra_required_parameter_is_refused() -> None:
    """A builder needing a 4th required argument is refused (the scheduler passes 3)."""
    with pytest.raises(InvalidStrategy, match=r"disagg=ExtraRequiredParam.*cannot take the 3"):
        compose(disagg=ExtraRequiredParam())


def test_swapped_strategy_is_refused() -> None:
    """A future-map factory given as the verify policy is refused naming the hook."""
    with pytest.raises(InvalidStrategy, match=r"target_verify=SlotFutureMapFactory has no method"):
        compose(target_verify=SlotFutureMapFactory())


def test_algorithm_is_frozen() -> None:
    """Fields of a composed algorithm cannot be reassigned."""
    algo = compose()
    with pytest.raises(FrozenInstanceError, match=r"cannot assign to field 'name'"):
        algo.name = "OTHER"  # type: ignore[misc]


@pytest.mark.parametrize("tokens", [0, 6, -1])
def test_policy_result_out_of_range_is_a_strategy_error(tokens: int) -> None:
    """T outside 1..D+1 from a policy is refused where it is used."""
    algo = compose(target_verify=Returns(tokens))
    with pytest.raises(StrategyError, match=rf"tokens per request={tokens} .* outside 1\.\.5"):
        algo.get_num_tokens_per_req_for_target_verify(4, False)


@pytest.mark.parametrize("tokens", [2.0, True, "3", None])
def test_policy_result_not_int_is_a_strategy_error(tokens: object) -> None:
    """A float, bool, str or None T is refused naming its type."""
    algo = compose(target_verify=Returns(tokens))
    with pytest.raises(StrategyError, match=rf"\({type(tokens).__name__}\).*must return an int"):
        algo.get_num_tokens_per_req_for_target_verify(4, False)


def test_supports_result_not_bool_is_a_strategy_error() -> None:
    """A policy answering 'yes' instead of True is refused."""
    algo = compose(target_verify=Returns(4, allowed="yes"))
    with pytest.raises(
        StrategyError, match=r"returned 'yes'; the policy must return True or False"
    ):
        algo.supports_target_verify_for_draft()


def test_alias_delegates_to_per_req() -> None:
    """get_num_tokens_per_bs_for_target_verify returns the per-request value."""
    algo = compose(target_verify=OffsetVerifyPolicy(draft_worker_offset=-1))
    for d in range(1, 10):
        for worker in (False, True):
            assert algo.get_num_tokens_per_bs_for_target_verify(
                d, worker
            ) == algo.get_num_tokens_per_req_for_target_verify(d, worker)


def test_create_future_map_delegates_and_checks_result() -> None:
    """create_future_map returns the factory's relay, sized mrr + 1."""
    relay = EAGLE.create_future_map(8, 64, 512, torch.device("cpu"))
    assert isinstance(relay, SlotFutureMap)
    assert relay.num_rows == 9


def test_create_future_map_refuses_non_relay() -> None:
    """A factory whose map lacks resolve is refused when the relay is created."""

    class Partial:
        def publish(self, slots: object, seq: object) -> None: ...

        def stash(self, slots: object, payload: object) -> None: ...

    class Factory:
        def create_future_map(self, a: int, b: int, c: int, d: object) -> Partial:
            return Partial()

    algo = compose(future_map=Factory())
    with pytest.raises(
        InvalidStrategy, match=r"create_future_map\(\) result=Partial has no method resolve"
    ):
        algo.create_future_map(4, 8, 16, torch.device("cpu"))


def test_describe_lists_strategies_and_capabilities() -> None:
    """describe() names each hook's strategy class and every capability."""
    info = EAGLE.describe()
    assert info["strategies"] == {
        "target_verify": "OffsetVerifyPolicy",
        "future_map": "SlotFutureMapFactory",
        "disagg": "EagleDisaggDraftBuilder",
        "drafter": "EagleHeadDrafterFactory",
        "acceptance": "RejectionSamplingAcceptance",
        "tree": "ChainTree",
        "speculation": "FixedSpeculationPolicy",
    }
    assert info["capabilities"]["carries_draft_hidden_states"] is True


def test_no_identity_predicates() -> None:
    """The algorithm exposes no is_<name>() identity predicates."""
    predicates = {n for n in dir(EAGLE) if n.startswith("is_")}
    assert predicates == {"is_none", "is_speculative"}
