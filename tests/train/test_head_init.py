"""A fresh head started from the target's own decoder layer (specstrat.train.start_from_target)."""

from typing import Any

import pytest
import torch

from specstrat.errors import InvalidConfig
from specstrat.train import Eagle3Head, HeadConfig, start_from_target
from tests.hf import tiny


def _fresh(llama: Any, **kwargs: Any) -> Eagle3Head:
    torch.manual_seed(0)
    return Eagle3Head.from_target(llama, layers=(0, 1), d2t=torch.arange(200), **kwargs)


def test_the_head_starts_as_the_layer_after_the_highest_fused_one(llama: Any) -> None:
    """Layers (0, 1) of a 2-layer llama: the head starts from layer 1 (the last), its feature
    half of q/k/v, o, MLP and norms the target's, its fusing linear passing layer 1 through."""
    head = _fresh(llama)
    before = head.q_proj.weight[:, :64].clone()
    assert start_from_target(head, llama) == "layer 1 (attention, MLP, norms)"
    layer, h = llama.model.layers[1], 64
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(head, name).weight[:, h:], getattr(layer.self_attn, name).weight)
    assert torch.equal(head.q_proj.weight[:, :h], before)  # the embedding half stays random
    assert torch.equal(head.o_proj.weight, layer.self_attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert torch.equal(getattr(head, name).weight, getattr(layer.mlp, name).weight)
    assert torch.equal(head.hidden_norm.weight, layer.input_layernorm.weight)
    assert torch.equal(head.post_norm.weight, layer.post_attention_layernorm.weight)
    assert torch.equal(head.norm.weight, llama.model.norm.weight)
    noise = head.fc.weight.detach() - torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    assert 0.005 < float(noise.std()) < 0.02  # identity on layer 1's block, and a little noise


def test_the_lower_layer_is_started_from_the_one_after_it(llama: Any) -> None:
    """Fusing layers (0, 0) the head starts from layer 1, the one after the highest fused."""
    torch.manual_seed(0)
    head = Eagle3Head.from_target(llama, layers=(0, 0), d2t=torch.arange(200))
    assert start_from_target(head, llama).startswith("layer 1 ")


def test_a_wider_mlp_keeps_its_random_start(llama: Any) -> None:
    """A head MLP wider than the target's is not copied, and the record says so."""
    head = _fresh(llama, intermediate_size=512)
    gate = head.gate_proj.weight.clone()
    assert start_from_target(head, llama) == "layer 1 (attention, norms)"
    assert torch.equal(head.gate_proj.weight, gate)


@pytest.mark.parametrize("family", ["phi", "gemma2"])
def test_a_target_not_llama_style_leaves_the_head_random(family: str) -> None:
    """Phi (another attention) and Gemma (norms that scale by 1 + weight) leave every weight as
    it was, and the record names the model type."""
    target = tiny.model(family)
    torch.manual_seed(0)
    head = Eagle3Head.from_target(target, layers=(0, 1), d2t=torch.arange(200))
    before = {k: v.clone() for k, v in head.state_dict().items()}
    assert start_from_target(head, target).startswith(f"random (model_type='{family}' is not ")
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())


def test_attention_of_another_shape_leaves_the_head_random(llama: Any) -> None:
    """A head whose attention is not the target layer's shape is left as it was."""
    head = _fresh(llama)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    wider = tiny.model("llama", num_attention_heads=8, num_key_value_heads=8)
    assert start_from_target(head, wider) == "random (layer 1's attention is not the head's shape)"
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())


def test_unsorted_layers_pass_the_highest_layers_block_through(llama: Any) -> None:
    """Layers given as (1, 0): the identity sits on the first block, layer 1's."""
    torch.manual_seed(0)
    head = Eagle3Head.from_target(llama, layers=(1, 0), d2t=torch.arange(200))
    start_from_target(head, llama)
    h = 64
    eye = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    assert float((head.fc.weight.detach() - eye).abs().max()) < 0.1


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"init": "zeros"}, r"HeadConfig\.init='zeros' \(--init\) must be one of 'target', "),
        ({"init": "target", "kind": "draft-lm"}, r"init='target' \(--init\) .* kind='draft-lm'"),
    ],
)
def test_bad_inits_are_refused(change: dict[str, Any], match: str) -> None:
    """An unknown start, or a start for a kind that trains no head, is refused by name."""
    with pytest.raises(InvalidConfig, match=match):
        HeadConfig(**change)
