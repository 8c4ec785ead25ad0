"""A tree refusal names where T came from (the configured D, or the widest width a speculation
policy declares) and suggests a width that makes the engine start; a policy declaring only
D = 1 needs no tree."""

import dataclasses
from dataclasses import replace

import pytest

import specstrat
from specstrat import InvalidConfig, SpeculationObservation
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, workload
from specstrat.strategies import TopkTree


@dataclasses.dataclass(frozen=True, slots=True)
class Declares:
    """A speculation policy declaring fixed widths, each step at the widest."""

    widths: tuple[int, ...]
    per_request_acceptance: bool = False

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        """The declared widths, whatever D is configured."""
        return self.widths

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> "Declares":
        """Itself: it keeps no state."""
        return self

    def choose_width(self, observation: SpeculationObservation) -> int:
        """The widest declared width."""
        return max(self.widths)


@pytest.fixture(scope="module")
def models() -> EmbeddedModels:
    """The embedded byte models."""
    return EmbeddedModels.load()


def _short(requests: list[Request]) -> list[Request]:
    return [replace(r, max_new_tokens=6) for r in requests]


def _eagle_tree(widths: tuple[int, ...]) -> specstrat.SpecAlgorithm[object]:
    return replace(
        specstrat.EAGLE, tree=TopkTree(topk=2, num_steps=3), speculation=Declares(widths)
    )


def test_a_tree_too_deep_for_the_policys_widths_names_the_policy(models: EmbeddedModels) -> None:
    """T from a policy's narrower width is blamed on that policy, not on num_draft_tokens, and
    the width it suggests makes the engine start."""
    with pytest.raises(
        InvalidConfig,
        match=r"cannot shape T=2 tokens per request, what EAGLE\.target_verify "
        r"\(OffsetVerifyPolicy\) verifies for D=2, the widest width speculation=Declares "
        r"declares: .*; declare a width of 4 or more in Declares\.candidate_widths or pick a "
        r"tree that fits T=2",
    ):
        Engine(_eagle_tree((1, 2)), models, EngineConfig(num_draft_tokens=6))
    engine = Engine(_eagle_tree((1, 4)), models, EngineConfig(num_draft_tokens=6))
    assert engine.run(_short(workload(2)))


def test_a_policy_declaring_only_d1_needs_no_tree(models: EmbeddedModels) -> None:
    """A D = 1 step drafts nothing: a tree algorithm under a policy of D = 1 alone starts and
    decodes as target-only does."""
    requests = _short(workload(2))
    want = Engine("NONE", models, EngineConfig()).run(requests)
    got = Engine(_eagle_tree((1,)), models, EngineConfig(num_draft_tokens=4)).run(requests)
    assert got == want
