"""The fast Llama forward: taken only for a plain transformers Llama whose probe agrees, equal to
transformers' forward (logits, hidden state, layer features, early exit), weights held once,
and re-stacked when the model is cast after wrapping."""

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from specstrat.hf import HFCausalLM
from specstrat.hf.attention_probe import Probe
from specstrat.hf.fast_llama import PROBE_TOLERANCE, FastLlamaForward
from specstrat.hf.fast_llama_weights import activation
from specstrat.hf.matmul_padding import MatmulPlan
from specstrat.models import RowLogitsLM
from tests.hf import tiny

TOKENS = torch.tensor([5, 17, 200, 3, 99, 42])
POSITIONS = torch.arange(6) + 10


def _both(model: Any) -> tuple[HFCausalLM, HFCausalLM]:
    return (
        HFCausalLM(model, vocab_size=tiny.VOCAB, fast=False),
        HFCausalLM(model, vocab_size=tiny.VOCAB),
    )


def _outputs(lm: HFCausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return lm(TOKENS, POSITIONS, Probe())


def test_a_plain_llama_runs_the_fast_forward_and_other_families_do_not() -> None:
    """A transformers Llama gets the fast forward; Qwen2 and Mistral (other classes) keep
    transformers' forward, as does a Llama wrapped with fast=False."""
    slow, fast = _both(tiny.model("llama"))
    assert fast.fast_forward is not None
    assert slow.fast_forward is None
    for family in ("qwen2", "mistral"):
        assert HFCausalLM(tiny.model(family), vocab_size=tiny.VOCAB).fast_forward is None


def _randomised(model: Any) -> Any:
    """``model`` with every parameter random, biases and norm weights included (transformers
    starts those at 0 and 1, where a dropped bias or a swapped norm would go unseen)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + (p.dim() == 1))
    return model


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attention_bias": True, "mlp_bias": True},
        {"head_dim": 24},
        {"tie_word_embeddings": True},
        {"rope_parameters": LLAMA3_ROPE},
    ],
    ids=["plain", "biases", "head-dim-24", "tied-head", "llama3-rope"],
)
def test_the_fast_forward_equals_transformers_forward(overrides: dict[str, Any]) -> None:
    """With every weight random, logits, the final hidden state, fused layer features and an
    early-exit view are those transformers' forward gives, whatever the biases, head width,
    tied head or RoPE scaling."""
    slow, fast = _both(_randomised(tiny.model("llama", **overrides)))
    assert fast.fast_forward is not None
    for a, b in zip(_outputs(slow), _outputs(fast), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)  # fused matmuls sum in another order
    for a, b in zip(
        _outputs(slow.with_feature_layers([0, 1])),
        _outputs(fast.with_feature_layers([0, 1])),
        strict=True,
    ):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    exit_slow, exit_fast = slow.early_exit(1), fast.early_exit(1)
    assert exit_slow.fast_forward is None
    assert exit_fast.fast_forward is not None
    for a, b in zip(_outputs(exit_slow), _outputs(exit_fast), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_a_feature_layers_view_runs_the_fast_forward_it_shares() -> None:
    """A view returning fused layer features runs the fast forward of the model it views (the
    same one: no second proof), and proves its own after the weights change, its features
    still transformers'."""
    model = _randomised(tiny.model("llama"))
    slow, fast = _both(model)
    view, slow_view = fast.with_feature_layers([0, 1]), slow.with_feature_layers([0, 1])
    _outputs(view)
    assert view.fast_forward is not None
    assert view.fast_forward is fast.fast_forward
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(2)
    got, want = _outputs(view), _outputs(slow_view)
    assert view.fast_forward is not None
    assert view.fast_forward is not fast.fast_forward
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=PROBE_TOLERANCE * float(w.abs().max()))


def test_the_weights_are_held_once_and_the_state_dict_is_unchanged() -> None:
    """Wrapping makes q/k/v and gate/up views into one stack each: the parameter count, names
    and values of the model are what they were."""
    model = tiny.model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    HFCausalLM(model, vocab_size=tiny.VOCAB)
    after = model.state_dict()
    assert list(after) == list(before)
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    attn = model.model.layers[0].self_attn
    q = attn.q_proj.weight
    assert attn.k_proj.weight.data_ptr() == q.data_ptr() + q.numel() * q.element_size()


def test_a_model_cast_after_wrapping_is_proven_and_adopted_anew() -> None:
    """model.double() after wrapping replaces the weights: the fast forward is built, checked
    and adopted again on the new ones and still equals transformers' forward."""
    model = tiny.model("llama")
    slow, fast = _both(model)
    before = fast.fast_forward
    model.double()
    a, b = _outputs(slow), _outputs(fast)
    assert b[0].dtype == torch.float64
    assert fast.fast_forward is not None
    assert fast.fast_forward is not before
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=1e-9)


def test_weights_loaded_by_assignment_after_wrapping_are_read() -> None:
    """load_state_dict(assign=True) puts new tensors in place of the fused views: the next
    forward reads the new weights, equal to transformers' forward on them."""
    model = tiny.model("llama")
    slow, fast = _both(model)
    other = tiny.model("llama", seed=3).state_dict()
    model.load_state_dict(other, assign=True)
    for a, b in zip(_outputs(slow), _outputs(fast), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    assert fast.fast_forward is not None


class _Doubled(nn.Module):
    """A projection that is not an nn.Linear (as a quantized or adapted layer would be)."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner
        self.weight = inner.weight
        self.bias = inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x) * 2
        return out


def _not_a_linear(model: Any) -> None:
    mlp = model.model.layers[0].mlp
    mlp.up_proj = _Doubled(mlp.up_proj)


def _subclassed(model: Any) -> None:
    layer = model.model.layers[1]
    layer.__class__ = type("MyLayer", (type(layer),), {})


@pytest.mark.parametrize(
    "change",
    [
        _not_a_linear,
        lambda m: m.model.layers[0].register_forward_pre_hook(lambda mod, args: None),
        lambda m: m.model.norm.register_forward_hook(lambda mod, args, out: out * 2),
        _subclassed,
    ],
    ids=["not-a-linear", "foreign-pre-hook", "foreign-hook", "subclassed-layer"],
)
def test_what_the_fast_forward_cannot_see_keeps_transformers_forward(change: Any) -> None:
    """A projection that is not an nn.Linear, a hook specstrat did not install or a subclassed
    layer would be skipped by the fast forward, so such a model runs transformers' forward."""
    model = tiny.model("llama")
    change(model)
    assert FastLlamaForward.of(model) is None
    assert HFCausalLM(model, vocab_size=tiny.VOCAB).fast_forward is None


def test_a_projection_replaced_after_wrapping_falls_back_to_transformers_forward() -> None:
    """Swapping a projection for a module that is not an nn.Linear after wrapping is seen at
    the next forward: transformers' forward runs it, so its doubling is honoured."""
    model = tiny.model("llama")
    slow, fast = _both(model)
    _not_a_linear(model)
    a, b = _outputs(slow), _outputs(fast)
    assert fast.fast_forward is None
    torch.testing.assert_close(b[0], a[0], rtol=0, atol=0)


def test_a_fast_forward_that_cannot_be_built_leaves_the_model_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fast forward whose construction raises is dropped: the model loads and runs
    transformers' forward."""

    def broken(cls: type, model: Any) -> Any:
        raise RuntimeError("cannot read these weights")

    monkeypatch.setattr(FastLlamaForward, "of", classmethod(broken))
    model = tiny.model("llama")
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    assert lm.fast_forward is None
    monkeypatch.undo()
    torch.testing.assert_close(_outputs(lm)[0], _outputs(_both(model)[0])[0], rtol=0, atol=0)


@pytest.mark.parametrize("which", [0, 1], ids=["logits", "hidden"])
def test_a_fast_forward_that_disagrees_on_the_probe_is_not_kept(
    which: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast forward whose probe logits or hidden state differ from transformers' is dropped
    at load, and the model's weights are left where they were."""
    real = FastLlamaForward.__call__

    def off(self: FastLlamaForward, *args: Any, **kwargs: Any) -> Any:
        logits, hidden, outputs = real(self, *args, **kwargs)
        if which == 0:
            return logits + 0.01, hidden, outputs
        return logits, hidden + 0.01, outputs

    monkeypatch.setattr(FastLlamaForward, "__call__", off)
    model = tiny.model("llama")
    attn = model.model.layers[0].self_attn
    q = attn.q_proj.weight
    k_before = attn.k_proj.weight.data_ptr()
    assert HFCausalLM(model, vocab_size=tiny.VOCAB).fast_forward is None
    assert attn.k_proj.weight.data_ptr() == k_before
    assert attn.q_proj.weight is q


def test_wrapping_inside_inference_mode_leaves_the_weights_trainable() -> None:
    """Wrapped inside torch.inference_mode, the fused weights are still ordinary tensors:
    transformers' own forward under reference() backpropagates through them."""
    model = tiny.model("llama")
    with torch.inference_mode():
        lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    assert lm.fast_forward is not None
    with lm.reference():
        model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert model.model.layers[0].self_attn.k_proj.weight.grad is not None


def test_a_hook_added_after_wrapping_runs() -> None:
    """A forward hook added after wrapping is honoured: the next forward sees it and runs
    transformers' forward from then on."""
    model = tiny.model("llama")
    slow, fast = _both(model)
    seen: list[int] = []
    handle = model.model.layers[0].register_forward_hook(lambda m, a, out: seen.append(1))
    _outputs(fast)
    assert seen == [1]
    assert fast.fast_forward is None
    handle.remove()
    torch.testing.assert_close(_outputs(fast)[0], _outputs(slow)[0], rtol=0, atol=0)


def test_a_weight_written_in_place_after_wrapping_is_read() -> None:
    """Weights written in place after wrapping (as load_state_dict writes them) make the next
    forward build anew, so no packed copy goes stale: its logits stay transformers'."""
    model = _randomised(tiny.model("llama"))
    slow, fast = _both(model)
    old = fast.fast_forward
    assert old is not None
    old.plan = old.head_plan = MatmulPlan({len(TOKENS): ("packed", len(TOKENS))})
    old.pack_weights()
    torch.testing.assert_close(_outputs(fast)[0], _outputs(slow)[0], rtol=0, atol=1e-4)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3)
        model.lm_head.weight.add_(0.5)
    want, got = _outputs(slow), _outputs(fast)
    assert fast.fast_forward is not None
    assert fast.fast_forward is not old
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=PROBE_TOLERANCE * float(w.abs().max()))


def test_the_plan_takes_the_fastest_way_only_where_it_is_clearly_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """matmul_plan picks, per row count, the cheapest form on as many rows or more, only where
    it beats F.linear on the rows by PAD_GAIN (with the EPYC host's F.linear costs and a
    slower mm, 2 and 3 rows pad to 4; one row runs mv), runs a packed weight on the rows it
    has and past the last count, and measures a shape once."""
    from specstrat.hf import matmul_padding

    linear = {1: 12.4, 2: 28.3, 3: 41.1, 4: 22.9, 5: 30.0, 6: 29.4, 7: 30.0, 8: 24.2}
    linear |= {12: 40.0, 16: 50.0, 24: 60.0, 32: 70.0, 64: 100.0}
    costs = {"linear": linear, "mm": {n: 100.0 for n in linear}, "mv": {1: 9.0}}
    costs["packed"] = {n: 1000.0 for n in linear}
    timed: list[int] = []

    def seconds(weights: Any, rows: int, form: str, dtypes: Any) -> float:
        timed.append(rows)
        return costs[form][rows]

    monkeypatch.setattr(matmul_padding, "_matmul_seconds", seconds)
    monkeypatch.setattr(matmul_padding, "pack", lambda weight, dtype=None: weight)
    monkeypatch.setattr(matmul_padding, "_MEASURED", {})
    plan = matmul_padding.matmul_plan([torch.zeros(8, 4)])
    pad = {n: ("linear", m) for n, m in {2: 4, 3: 4, 5: 8, 6: 8, 7: 8}.items()}
    assert (plan.ways, plan.beyond) == ({1: ("mv", 1), **pad}, None)
    assert matmul_padding.matmul_plan([torch.zeros(8, 4)]) is plan
    forms = 2 * len(matmul_padding.PLAN_ROWS) + len([n for n in linear if n <= 16]) + 1
    assert len(timed) == 4 * forms  # a warm-up, 3 rounds
    costs["mm"] = {n: 10.0 for n in linear}
    ways = matmul_padding.matmul_plan([torch.zeros(8, 5)]).ways
    assert (ways[4], ways[9], ways[16], 17 in ways) == (("mm", 4), ("mm", 12), ("mm", 16), False)
    costs["packed"] = {n: 5.0 for n in linear}
    plan = matmul_padding.matmul_plan([torch.zeros(8, 6)])
    assert plan.ways == {n: ("packed", n) for n in range(1, 65)}
    assert (plan.beyond, plan.forms()) == ("packed", frozenset({"packed"}))


def test_a_plan_whose_way_gives_other_logits_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timed plan whose way computes another product fails the probe at load: the fast
    forward stays, with F.linear throughout."""
    from specstrat.hf import fast_llama, matmul_padding

    forms = matmul_padding.FORMS
    broken = {**forms, "mm": lambda x, w: 2 * torch.mm(w, x.t()).t()}
    monkeypatch.setattr(matmul_padding, "FORMS", broken)
    plan = MatmulPlan({1: ("mm", 1), 2: ("mm", 2)})
    monkeypatch.setattr(fast_llama, "matmul_plan", lambda weights: plan)
    lm = HFCausalLM(_randomised(tiny.model("llama")), vocab_size=tiny.VOCAB)
    assert lm.fast_forward is not None
    assert (lm.fast_forward.plan.ways, lm.fast_forward.head_plan.ways) == ({}, {})
    monkeypatch.setattr(matmul_padding, "FORMS", forms)
    kept = HFCausalLM(_randomised(tiny.model("llama")), vocab_size=tiny.VOCAB).fast_forward
    assert kept is not None
    assert kept.plan is plan


def test_weights_made_in_inference_mode_are_watched_without_a_version() -> None:
    """Parameters made inside inference mode keep no version counter: the fast forward's watch
    still adopts them and holds."""
    with torch.inference_mode():
        model = tiny.model("llama")
    fast = FastLlamaForward.of(model)
    assert fast is not None
    fast.adopt()
    assert fast.current()


def test_a_packed_plan_computes_f_linear_on_any_rows() -> None:
    """The packed form (and the plan past its last row count) gives F.linear's product with
    its bias; without the packed weight it runs F.linear itself."""
    from specstrat.hf.matmul_padding import pack

    torch.manual_seed(0)
    weight, bias = torch.randn(40, 24), torch.randn(40)
    packed = pack(weight)
    if packed is None:
        pytest.skip("this torch has no oneDNN to pack with")
    plan = MatmulPlan({1: ("packed", 1)}, "packed")
    for rows in (1, 3, 70):
        x = torch.randn(rows, 24)
        with torch.inference_mode():
            want = F.linear(x, weight, bias)
            torch.testing.assert_close(plan.linear(x, weight, bias, packed), want)
            assert torch.equal(plan.linear(x, weight, bias), want)


WAYS = [("linear", 8), ("mm", 3), ("mm", 8), ("mv", 1), ("packed", 3)]


@pytest.mark.parametrize(("form", "rows"), WAYS)
def test_every_way_of_the_plan_gives_the_forwards_logits(form: str, rows: int) -> None:
    """With every projection computed another way (another kernel, or padded to more rows),
    the forward's logits and hidden state are still those of transformers' forward."""
    slow, fast = _both(_randomised(tiny.model("llama")))
    assert fast.fast_forward is not None
    n = 1 if form == "mv" else min(rows, 3)
    fast.fast_forward.plan = fast.fast_forward.head_plan = MatmulPlan({n: (form, rows)})
    fast.fast_forward.pack_weights()
    tokens, positions = TOKENS[:n], POSITIONS[:n]
    with torch.inference_mode():
        want, got = slow(tokens, positions, Probe()), fast(tokens, positions, Probe())
    assert got[0].shape == want[0].shape
    for g, w in zip(got, want, strict=True):  # the probe's tolerance: sums in another order
        torch.testing.assert_close(g, w, rtol=0, atol=PROBE_TOLERANCE * float(w.abs().max()))


@pytest.mark.parametrize("fast_forward", [True, False])
def test_forward_rows_gives_the_asked_rows_logits_and_every_hidden_state(
    fast_forward: bool,
) -> None:
    """forward_rows returns the logits of the asked rows (those of the full forward) and every
    row's hidden state, on the fast forward and on transformers'."""
    lm = HFCausalLM(_randomised(tiny.model("llama")), vocab_size=tiny.VOCAB, fast=fast_forward)
    assert (lm.fast_forward is not None) == fast_forward
    assert isinstance(lm, RowLogitsLM)
    rows = torch.tensor([1, 5])
    with torch.inference_mode():
        logits, hidden = lm(TOKENS, POSITIONS, Probe())
        picked, every = lm.forward_rows(TOKENS, POSITIONS, Probe(), rows)
    assert picked.shape == (2, tiny.VOCAB)
    torch.testing.assert_close(picked, logits[rows], rtol=0, atol=1e-5)
    torch.testing.assert_close(every, hidden, rtol=0, atol=0)


def test_a_plans_summary_names_its_runs_of_row_counts() -> None:
    """MatmulPlan.summary joins row counts run the same way and says what runs past them."""
    ways = {1: ("mm", 2), 2: ("mm", 2), 3: ("packed", 3), 4: ("packed", 4), 5: ("linear", 8)}
    assert MatmulPlan(ways, "packed").summary() == (
        "1-2: mm on 2; 3-4: packed; 5: linear on 8; past 5: packed"
    )
    assert MatmulPlan().summary() == "F.linear throughout"


def _new_norm(model: Any) -> None:
    norm = model.model.layers[1].input_layernorm
    norm.weight = nn.Parameter(norm.weight.detach() * 2)


def _norm_in_place(model: Any) -> None:
    with torch.no_grad():
        model.model.layers[0].post_attention_layernorm.weight.mul_(-1)


def _final_norm(model: Any) -> None:
    with torch.no_grad():
        model.model.norm.weight.add_(1)


def _new_activation(model: Any) -> None:
    model.model.layers[1].mlp.act_fn = nn.GELU()


def _patched_activation(model: Any) -> None:
    model.model.layers[0].mlp.act_fn.forward = F.gelu


def _new_epsilon(model: Any) -> None:
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 0.5


def _new_scaling(model: Any) -> None:
    model.model.layers[0].self_attn.scaling = 0.01


@pytest.mark.parametrize(
    "change",
    [
        _new_norm,
        _norm_in_place,
        _final_norm,
        _new_activation,
        _patched_activation,
        _new_epsilon,
        _new_scaling,
    ],
    ids=[
        "norm-replaced",
        "norm-in-place",
        "final-norm-in-place",
        "activation-replaced",
        "activation-forward-set",
        "epsilon-changed",
        "scaling-changed",
    ],
)
def test_a_norm_or_activation_changed_after_wrapping_is_read(change: Any) -> None:
    """The fast forward holds plain references to norms' weights and epsilons, the attention's
    scaling and the activation; any of them replaced, written in place or set after wrapping
    makes the next forward build anew, so its outputs stay transformers'."""
    model = _randomised(tiny.model("llama"))
    slow, fast = _both(model)
    old = fast.fast_forward
    _outputs(fast)
    change(model)
    want, got = _outputs(slow), _outputs(fast)
    assert fast.fast_forward is not old
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=PROBE_TOLERANCE * float(w.abs().max()))


def test_a_plain_silu_runs_as_f_silu_and_any_other_activation_as_itself() -> None:
    """torch's and transformers' SiLU modules run as F.silu; another activation, or a SiLU
    whose forward an instance overrides, runs as the module itself."""
    assert activation(nn.SiLU()) is F.silu
    assert activation(ACT2FN["silu"]) is F.silu
    gelu = nn.GELU()
    assert activation(gelu) is gelu
    patched = nn.SiLU()
    patched.forward = lambda input: input  # type: ignore[method-assign]
    assert activation(patched) is patched
    subclass = type("MySiLU", (nn.SiLU,), {})()
    assert activation(subclass) is subclass
