"""Self-speculation by early exit on tiny Hugging Face models: the view shares the target's
weights, drafts chains and top-k trees losslessly against generate, and refuses bad layers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specstrat import InvalidConfig, ModelSet, SpecstratError
from specstrat.hf import HFCausalLM, compare, early_exit_algorithm, generate_reference
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request
from specstrat.strategies import EarlyExitDrafterFactory, TopkTree
from specstrat.testing import check_drafter
from tests.hf import tiny


@pytest.fixture(scope="module")
def target() -> HFCausalLM:
    """A 4-layer tiny Llama with the tokenizer's vocabulary."""
    return HFCausalLM(tiny.model("llama", num_hidden_layers=4), vocab_size=tiny.VOCAB)


@pytest.fixture(scope="module")
def requests() -> list[Request]:
    """Two prompts of the shared tokenizer, 12 new tokens each."""
    tok = tiny.tokenizer()
    prompts = ["def shorten(text, width):\n    return text", "import os\nclass A:\n  pass\n"]
    return [Request(f"r{i}", tok.encode(p), 12) for i, p in enumerate(prompts)]


def test_the_view_shares_the_targets_weights(target: HFCausalLM) -> None:
    """early_exit(k) runs the first k layers of the same parameter objects; the target keeps
    all its layers."""
    view = target.early_exit(2)
    assert view.shape.layers == 2
    assert target.shape.layers == 4
    own = {id(p) for p in target.parameters()}
    assert all(id(p) in own for p in view.parameters())
    assert len(list(view.parameters())) < len(own)  # layers 2 and 3 are not in the view
    assert len(target.model.model.layers) == 4


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("tree", [None, TopkTree(topk=2, num_steps=3)], ids=["chain", "tree"])
def test_early_exit_is_lossless_against_generate(
    target: HFCausalLM, requests: list[Request], tree: TopkTree | None, overlap: bool
) -> None:
    """Chains and top-k trees drafted by the first 2 layers give generate's tokens."""
    algo = early_exit_algorithm(2)
    if tree is not None:
        algo = replace(algo, tree=tree)
    engine = Engine(algo, ModelSet(target=target), EngineConfig(context_len=96, overlap=overlap))
    out = engine.run(requests)
    check = compare(target, requests, out, generate_reference(target, requests))
    assert check.lossless, check.line()
    assert engine.stats.acceptance_length > 1.0


def test_early_exit_on_a_nested_layer_list() -> None:
    """OPT keeps its layers under decoder.layers: the view finds them there."""
    lm = HFCausalLM(tiny.model("opt"), vocab_size=tiny.VOCAB)
    view = lm.early_exit(1)
    assert view.shape.layers == 1
    assert lm.shape.layers == 2


def test_the_drafter_passes_the_conformance_kit(target: HFCausalLM) -> None:
    """EarlyExitDrafterFactory is checked like every drafter (chain and tree)."""
    algo = early_exit_algorithm(2)
    for tree in (None, TopkTree(topk=2, num_steps=2)):
        check_drafter(
            algo.drafter, models=ModelSet(target=target), capabilities=algo.capabilities, tree=tree
        )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t.early_exit(4), r"exit_layer=4 must be in 1\.\.3"),
        (lambda t: t.early_exit(0), r"exit_layer=0 must be in 1\.\.3"),
        (lambda t: EarlyExitDrafterFactory(0), r"exit_layer=0 must be an int >= 1"),
        (lambda t: EarlyExitDrafterFactory(True), r"exit_layer=True must be an int >= 1"),
    ],
)
def test_bad_exit_layers_are_refused(target: HFCausalLM, make: object, message: str) -> None:
    """An exit layer outside 1..layers-1 or not an int is refused by name."""
    with pytest.raises(InvalidConfig, match=message):
        make(target)  # type: ignore[operator]


def test_an_engine_refuses_a_layer_past_the_target(target: HFCausalLM) -> None:
    """exit_layer at or past the target's depth is refused at engine start, naming both."""
    with pytest.raises(SpecstratError, match=r"exit_layer=4 must be below the target's 4 layers"):
        Engine(early_exit_algorithm(4), ModelSet(target=target), EngineConfig(context_len=64))


def test_a_target_without_early_exit_is_refused() -> None:
    """The embedded TinyLM has no early_exit: the drafter says so at engine start."""
    with pytest.raises(SpecstratError, match=r"needs a target with early_exit\(exit_layer\)"):
        Engine(early_exit_algorithm(2), EmbeddedModels.load(), EngineConfig(context_len=64))
