"""A saved head attached to a Hugging Face model: the target returns its layers' fused outputs,
the EAGLE drafters run the head (chains, EAGLE3, top-k trees) greedy-lossless in sync and
overlap, and a head for another target, a second head or bad layers are refused by name."""

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specstrat
from specstrat import InvalidConfig, SpecAlgorithm
from specstrat.cli import main
from specstrat.hf import HFCausalLM, HFModels, compare, generate_reference
from specstrat.hf.attention_probe import Probe
from specstrat.hf.process_loader import HFLoader
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.strategies import TopkTree
from specstrat.train import (
    HeadAttacher,
    HeadMismatch,
    attach_head,
)
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT, save_untrained_head
from tests.train.faults import assert_fault_leaks_nothing

LAYERS = (0, 1)
ALGOS = {
    "eagle": specstrat.EAGLE,
    "eagle3": specstrat.EAGLE3,
    "tree": replace(specstrat.EAGLE, tree=TopkTree(topk=2, num_steps=3)),
}


@pytest.fixture(scope="module")
def own_llama() -> Any:
    """A tiny llama of this module's own: wrapping switches a model's attention to the
    engine's, which the package's shared ``llama`` must keep for generate."""
    return tiny.model("llama", initializer_range=LEARNABLE_INIT)


@pytest.fixture(scope="module")
def head_file(own_llama: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained (seeded) head for the tiny llama, saved: losslessness needs no training."""
    return save_untrained_head(own_llama, LAYERS, tmp_path_factory.mktemp("head"))


@pytest.fixture(scope="module")
def models(own_llama: Any, tokenizer: Any, head_file: Path) -> HFModels:
    """The tiny llama with the head attached."""
    plain = HFModels(target=HFCausalLM(own_llama, vocab_size=tiny.VOCAB), tokenizer=tokenizer)
    return attach_head(plain, head_file)


def test_the_target_returns_its_layers_outputs_fused(models: HFModels) -> None:
    """The attached target's hidden state is layers 0 and 1's outputs side by side, as
    transformers' output_hidden_states gives them; its shape says 2 * H."""
    target = models.target
    assert (target.feature_layers, target.shape.hidden_size) == (LAYERS, 2 * 64)
    tokens = torch.tensor([5, 9, 11, 3])
    with target.reference() as lm, torch.inference_mode():
        want = lm(input_ids=tokens[None], output_hidden_states=True).hidden_states
    with torch.inference_mode():  # the load-time probe's backend: plain causal attention
        _, hidden = target(tokens, torch.arange(4), Probe())
    fused = torch.cat([want[1][0], want[2][0]], dim=-1)
    torch.testing.assert_close(hidden, fused, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("name", sorted(ALGOS))
def test_the_head_drafts_greedy_lossless(name: str, overlap: bool, models: HFModels) -> None:
    """EAGLE, EAGLE3 and an EAGLE top-k tree with the attached head give transformers' greedy
    generate token for token, in sync and overlap."""
    ids = models.tokenizer("def wrap(text, width=70):\n    return text")["input_ids"]
    requests = [Request("a", ids[:12], 12), Request("b", ids[:5], 9)]
    algo: SpecAlgorithm[Any] = ALGOS[name]
    engine = Engine(algo, models, EngineConfig(context_len=64, overlap=overlap))
    outputs = engine.run(requests)
    target = models.target
    check = compare(target, requests, outputs, generate_reference(target, requests))
    assert check.lossless, check.line()
    assert check.compared_tokens == 21


def test_a_head_for_another_target_is_refused(head_file: Path, tokenizer: Any) -> None:
    """A head trained for the tiny llama is refused on another model, naming both hashes."""
    other = HFCausalLM(tiny.model("llama", seed=3), vocab_size=tiny.VOCAB, name="other")
    with pytest.raises(HeadMismatch, match=r"was trained for target .* but target 'other'"):
        attach_head(HFModels(target=other, tokenizer=tokenizer), head_file)


def test_a_second_head_is_refused(models: HFModels, head_file: Path) -> None:
    """Models that already have a head get no second one."""
    with pytest.raises(InvalidConfig, match=r"the models already have a head"):
        attach_head(models, head_file)


@pytest.mark.parametrize("layers", [(), (0, 0), (2,), (-1,)])
def test_feature_layers_outside_the_model_are_refused(
    layers: tuple[int, ...], own_llama: Any
) -> None:
    """Layer indices must be distinct and inside the model's 2 layers."""
    lm = HFCausalLM(own_llama, vocab_size=tiny.VOCAB, name="tiny")
    with pytest.raises(
        InvalidConfig, match=r"tiny: layers=.* must be distinct layer indices in 0\.\.1"
    ):
        lm.with_feature_layers(layers)


def test_the_prefill_loader_carries_the_attacher(head_file: Path) -> None:
    """The disaggregation prefill process's loader pickles with the head attacher it replays."""
    loader = HFLoader("some/model", "float32", HeadAttacher(str(head_file)))
    assert pickle.loads(pickle.dumps(loader)) == loader


def test_demo_refuses_a_head_on_the_embedded_models(head_file: Path) -> None:
    """``demo --head`` without ``--model`` is refused naming the flag and the fix."""
    with pytest.raises(SystemExit, match=r"--head .* pass --model smollm2 or --model PATH"):
        main(["demo", "--head", str(head_file)])


def test_bench_refuses_a_head_on_the_embedded_models(
    head_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench --head`` without ``--model`` exits 2 naming the flag and the fix, before a run."""
    assert main(["bench", "--algo", "EAGLE", "--head", str(head_file), "--requests", "1"]) == 2
    err = capsys.readouterr().err
    assert "specstrat bench: InvalidConfig: --head" in err
    assert "pass --model smollm2 or --model PATH" in err


def test_head_for_picks_the_flag_then_the_shipped_head_for_a_head_drafter(
    head_file: Path,
) -> None:
    """--head wins; without it a head drafter on smollm2 gets the shipped head, others none."""
    from specstrat.train import head_for, shipped_head

    assert head_for("smollm2", str(head_file), ["NGRAM"]) == str(head_file)
    assert head_for("smollm2", None, ["NGRAM", specstrat.NONE]) is None
    assert head_for("/some/model", None, ["EAGLE"]) is None
    shipped = shipped_head("smollm2")
    assert head_for("smollm2", None, ["NGRAM", "EAGLE3"]) == (shipped and str(shipped))
    assert shipped_head("/some/model") is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("missing.safetensors", r"missing\.safetensors'?: no such file"),
        ("junk.safetensors", r"junk\.safetensors'? is not a readable safetensors file"),
    ],
)
def test_head_for_refuses_a_bad_head_file_before_loading(
    tmp_path: Path, text: str, match: str
) -> None:
    """A --head that is missing or not a head file is refused naming it."""
    from specstrat.errors import ModelLoadError
    from specstrat.train import head_for

    (tmp_path / "junk.safetensors").write_bytes(b"not a head")
    with pytest.raises(ModelLoadError, match=match):
        head_for("smollm2", str(tmp_path / text), ["EAGLE"])


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_head_failing_mid_run_leaks_nothing_and_a_fresh_engine_stays_lossless(
    overlap: bool, models: HFModels
) -> None:
    """A trained head that raises on its third call ends the run naming the error, frees every
    slot and KV index, and the next engine on the same models is greedy-lossless."""
    calls = [0]
    head = models.head
    assert head is not None

    def failing(hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("head fault injected")
        return head(hidden, tokens)

    ids = models.tokenizer("def wrap(text, width=70):\n    return text")["input_ids"]
    requests = [Request("a", ids[:12], 12), Request("b", ids[:5], 9)]
    config = EngineConfig(context_len=64, overlap=overlap)
    assert_fault_leaks_nothing(
        specstrat.EAGLE,
        models,
        requests,
        config,
        "head fault injected",
        broken_models=replace(models, head=failing),
    )
