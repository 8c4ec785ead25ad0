"""verify(T) / decode as ``specstrat bench`` reports it: every T from 2 to 9, specstrat's side on
any model, transformers' beside it on a Hugging Face one, and bad arguments refused by name."""

from collections.abc import Callable

import pytest

from specstrat.bench.verify_cost import VERIFY_TOKENS, VerifyCost, measure_verify_cost
from specstrat.errors import InvalidConfig
from specstrat.hf import HFCausalLM
from specstrat.runtime import EmbeddedModels

PROMPT = list(range(1, 40))


@pytest.fixture(scope="module")
def embedded() -> EmbeddedModels:
    """The embedded byte models."""
    return EmbeddedModels.load()


def test_every_width_gets_a_positive_ratio_on_the_embedded_model(embedded: EmbeddedModels) -> None:
    """T = 2..9 each map to a ratio of medians; there is no transformers side to compare."""
    cost = measure_verify_cost(embedded.target, PROMPT, samples=1)
    assert list(cost.specstrat) == [str(t) for t in VERIFY_TOKENS]
    assert all(r > 0 for r in cost.specstrat.values())
    assert cost.transformers is None
    doc = cost.as_dict()
    assert doc["verify_cost"] == cost.specstrat
    assert doc["verify_cost_vs_transformers"] is None


def test_a_hugging_face_target_is_measured_on_both_sides(
    wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """On a tiny HF model, transformers' own forward over T tokens is timed beside ours."""
    cost = measure_verify_cost(wrapped("llama"), ids[:12], tokens_per_req=(2, 4), samples=1)
    assert cost.transformers is not None
    assert list(cost.transformers) == ["2", "4"]
    versus = cost.as_dict()["verify_cost_vs_transformers"]
    assert versus == {t: cost.specstrat[t] / cost.transformers[t] for t in ("2", "4")}


def test_the_ratio_is_of_medians() -> None:
    """The JSON's comparison divides specstrat's ratio by transformers', per T."""
    cost = VerifyCost({"2": 1.5}, {"2": 1.25}, 3)
    assert cost.as_dict()["verify_cost_vs_transformers"] == {"2": 1.2}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples": 0}, r"samples=0 must be an int >= 1"),
        ({"tokens_per_req": (1, 4)}, r"tokens_per_req=\(1, 4\) must be ints >= 2"),
        ({"tokens_per_req": ()}, r"tokens_per_req=\(\) must be ints >= 2"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    embedded: EmbeddedModels, kwargs: dict[str, object], message: str
) -> None:
    """A sample count, a width below 2 or no tokens_per_req is refused naming the value."""
    with pytest.raises(InvalidConfig, match=message):
        measure_verify_cost(embedded.target, PROMPT, **kwargs)  # type: ignore[arg-type]


def test_an_empty_prompt_is_refused(embedded: EmbeddedModels) -> None:
    """A verify needs a prefix: an empty prompt is refused saying so."""
    with pytest.raises(InvalidConfig, match=r"prompt is empty"):
        measure_verify_cost(embedded.target, [])


def test_a_prompt_past_the_models_positions_is_cut_to_its_end(embedded: EmbeddedModels) -> None:
    """A prompt as long as the model's context is measured on its end, not refused."""
    longest = embedded.target.shape.max_positions
    cost = measure_verify_cost(embedded.target, [1 + i % 200 for i in range(longest)], samples=1)
    assert list(cost.specstrat) == [str(t) for t in VERIFY_TOKENS]


def test_a_verify_as_wide_as_the_context_is_refused(embedded: EmbeddedModels) -> None:
    """A verify width that leaves no position for a prompt is refused naming it."""
    wide = embedded.target.shape.max_positions
    with pytest.raises(InvalidConfig, match=rf"tokens_per_req up to {wide} leave no room"):
        measure_verify_cost(embedded.target, PROMPT, tokens_per_req=(wide,))
