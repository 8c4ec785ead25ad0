"""What a user tries with a wrapped Hugging Face model: calling it directly, wrapping it twice,
running the engine inside reference(), training mode, models that are not causal decoders,
many ragged requests, prompts at context_len, repeated engines. Each is pinned here; the
refusals are named errors that leave the user's model as it was."""

from collections.abc import Callable
from typing import Any

import pytest
import torch

from specstrat import EngineStateError, InvalidConfig, ModelLoadError, ModelSet
from specstrat.hf import ATTENTION_NAME, HFCausalLM, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, Request
from tests.hf import tiny


def run(lm: HFCausalLM, requests: list[Request], **config: Any) -> dict[str, list[int]]:
    """NGRAM over ``requests`` on ``lm``."""
    return Engine("NGRAM", ModelSet(target=lm), EngineConfig(**{"context_len": 64, **config})).run(
        requests
    )


def test_calling_the_wrapped_model_directly_is_refused_outside_reference(
    ids: tuple[int, ...],
) -> None:
    """After wrapping, the model's own forward raises a named error pointing at reference();
    inside reference() it is transformers' forward, equal to an unwrapped copy's."""
    model, twin = tiny.model("llama"), tiny.model("llama")
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    x = torch.tensor([ids[:7]])
    with pytest.raises(InvalidConfig, match=r"runs only inside a specstrat forward; .*reference"):
        model(x)
    with lm.reference() as ref, torch.inference_mode():
        torch.testing.assert_close(ref(x).logits, twin(x).logits, rtol=0, atol=0)
    with pytest.raises(InvalidConfig, match=r"runs only inside a specstrat forward"):
        model(x)


def test_wrapping_the_same_model_twice_keeps_transformers_attention_for_reference(
    ids: tuple[int, ...],
) -> None:
    """A second HFCausalLM over an already wrapped model still switches back to transformers'
    own attention in reference() (not to the engine's), so both check against generate."""
    model = tiny.model("gemma2")
    first = HFCausalLM(model, vocab_size=tiny.VOCAB)
    second = HFCausalLM(model, vocab_size=tiny.VOCAB)
    assert first.reference_attention == second.reference_attention != ATTENTION_NAME
    requests = [Request("r", ids[:12], 10)]
    reference = generate_reference(second, requests)
    for lm in (first, second):
        assert compare(lm, requests, run(lm, requests), reference).lossless


def test_the_engine_refuses_a_model_switched_to_transformers_attention(
    ids: tuple[int, ...],
) -> None:
    """An engine forward inside reference() (or after set_attn_implementation by hand) would
    bypass the KV cache and decode silently wrong: it is refused by name instead."""
    model = tiny.model("llama")
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB)
    requests = [Request("r", ids[:12], 6)]
    message = r"attn_implementation='sdpa', not 'specstrat_paged' \(a forward inside HFCausalLM"
    with lm.reference(), pytest.raises(EngineStateError, match=message):
        run(lm, requests)
    model.set_attn_implementation("sdpa")
    with pytest.raises(EngineStateError, match=message):
        run(lm, requests)
    model.set_attn_implementation(ATTENTION_NAME)
    assert compare(lm, requests, run(lm, requests), generate_reference(lm, requests)).lossless


def test_nested_reference_blocks_restore_the_outer_one(ids: tuple[int, ...]) -> None:
    """Leaving an inner reference() returns to the outer block's attention, not the engine's."""
    lm = HFCausalLM(tiny.model("llama"), vocab_size=tiny.VOCAB)
    x = torch.tensor([ids[:5]])
    with lm.reference() as model:
        with lm.reference():
            pass
        assert model.config._attn_implementation == lm.reference_attention
        model(x)
    assert lm.model.config._attn_implementation == ATTENTION_NAME


def test_a_model_in_training_mode_is_refused_at_wrap_and_at_run(ids: tuple[int, ...]) -> None:
    """Dropout makes every forward differ (a GPT-2 built with from_config is in training mode):
    refused when wrapped, and when switched to training after wrapping."""
    model = tiny.model("gpt2").train()
    with pytest.raises(InvalidConfig, match=r"GPT2LMHeadModel is in training mode .*model\.eval"):
        HFCausalLM(model, vocab_size=tiny.VOCAB)
    lm = HFCausalLM(model.eval(), vocab_size=tiny.VOCAB)
    model.train()
    with pytest.raises(EngineStateError, match=r"the model is in training mode"):
        run(lm, [Request("r", ids[:5], 3)])


def _bert_mlm() -> Any:
    """A BERT masked LM: an LM head over bidirectional attention."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
    )
    model: Any = BertForMaskedLM(cfg)
    return model.eval()


def _t5() -> Any:
    """A T5 encoder-decoder."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=100)
    model: Any = T5ForConditionalGeneration(cfg)
    return model.eval()


def _no_head() -> Any:
    """A llama base model, no LM head."""
    from transformers import LlamaModel

    model: Any = LlamaModel(tiny.config("llama"))
    return model.eval()


def _bloom() -> Any:
    """A BLOOM model (ALiBi, its own attention code: not on the attention interface)."""
    from transformers import BloomConfig, BloomForCausalLM

    model: Any = BloomForCausalLM(BloomConfig(hidden_size=32, n_layer=1, n_head=2, vocab_size=100))
    return model.eval()


def _bypassing(*layers: int) -> Callable[[], Any]:
    """A llama whose ``layers`` compute their attention themselves (never call the interface)."""

    def own(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return torch.zeros_like(hidden_states), None

    def build() -> Any:
        model = tiny.model("llama")
        for layer in layers:
            attention = model.model.layers[layer].self_attn
            attention.__class__ = type("OwnAttention", (type(attention),), {})
            attention.forward = own
        return model

    return build


REFUSED: list[tuple[str, Callable[[], Any], dict[str, Any], type[Exception], str]] = [
    (
        "bidirectional",
        _bert_mlm,
        {},
        ModelLoadError,
        r"BertSelfAttention attends bidirectionally \(is_causal=False\)",
    ),
    (
        "encoder-decoder",
        _t5,
        {},
        ModelLoadError,
        r"T5ForConditionalGeneration is an encoder-decoder model",
    ),
    ("no-lm-head", _no_head, {}, ModelLoadError, r"LlamaModel has no LM head; load it as a causal"),
    (
        "a-layer-bypasses-the-interface",
        _bypassing(1),
        {},
        ModelLoadError,
        r"LlamaForCausalLM's attention in layers \[1\] \(OwnAttention\) did not call "
        r"transformers' attention interface",
    ),
    (
        "every-layer-bypasses-the-interface",
        _bypassing(0, 1),
        {},
        ModelLoadError,
        r"LlamaForCausalLM's attention in none of its layers \(OwnAttention\) did not call",
    ),
    (
        "own-attention-bloom",
        _bloom,
        {},
        ModelLoadError,
        r"BloomForCausalLM: config has no max_position_embeddings; specstrat bounds context_len",
    ),
    (
        "sinks",
        lambda: tiny.model("gpt_oss"),
        {},
        ModelLoadError,
        r"GptOssAttention passes attention arguments specstrat cannot honour: s_aux "
        r"\(sinks \(attention sinks\)\); this model is not supported",
    ),
    (
        "chunked-llama4",
        lambda: tiny.model("llama4"),
        {},
        ModelLoadError,
        r"Llama4ForCausalLM: config\.attention_chunk_size=8 is not supported",
    ),
    (
        "value-width",
        lambda: tiny.model("deepseek_v3", qk_nope_head_dim=16, v_head_dim=8),
        {},
        ModelLoadError,
        r"layer 0: query, key and value heads are \(4, 24\), \(4, 24\) and "
        r"\(4, 8\) \(heads, width\)",
    ),
    (
        "chunked",
        lambda: tiny.model("llama", attention_chunk_size=4),
        {},
        ModelLoadError,
        r"config\.attention_chunk_size=4 is not supported",
    ),
    (
        "meta",
        lambda: tiny.model("llama").to("meta"),
        {},
        ModelLoadError,
        r"weights are on the meta device \(parameter model\.embed_tokens\.weight\)",
    ),
    (
        "not-a-model",
        lambda: torch.nn.Linear(2, 2),
        {},
        ModelLoadError,
        r"Linear: Linear is not a transformers PreTrainedModel",
    ),
    (
        "vocab-zero",
        lambda: tiny.model("llama"),
        {"vocab_size": 0},
        InvalidConfig,
        r"vocab_size=0 must be an int >= 1, or None",
    ),
]


def test_a_class_without_the_backend_flag_that_calls_the_interface_runs_losslessly(
    ids: tuple[int, ...],
) -> None:
    """A model class whose _supports_attention_backend is False but whose every layer calls the
    attention interface is decided by the probe: it wraps and runs equal to transformers."""
    model = tiny.model("llama")
    model.__class__ = type("FlaglessLM", (type(model),), {"_supports_attention_backend": False})
    assert not model.is_backend_compatible()
    lm = HFCausalLM(model, vocab_size=tiny.VOCAB, name="flagless")
    requests = [Request("r", list(ids[:12]), max_new_tokens=8)]
    outputs = Engine("NGRAM", ModelSet(target=lm), EngineConfig(context_len=64)).run(requests)
    check = compare(lm, requests, outputs, generate_reference(lm, requests))
    assert check.lossless, check.line()


@pytest.mark.parametrize(
    ("case", "build", "kw", "error", "message"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_what_the_engine_cannot_run_is_refused_by_name_and_left_untouched(
    case: str, build: Callable[[], Any], kw: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Each model the engine cannot run is refused naming why; the model keeps the attention
    implementation it came with."""
    model = build()
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    with pytest.raises(error, match=message):
        HFCausalLM(model, name=type(model).__name__, **kw)
    assert getattr(getattr(model, "config", None), "_attn_implementation", None) == before


def test_many_ragged_requests_beyond_the_running_limit_are_lossless(
    wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """Twenty requests of prompt lengths 1..50 and outputs 1..13, six running at a time, with
    overlap: every one equals transformers' generate."""
    lm = wrapped("qwen2")
    requests = [
        Request(f"r{i}", ids[: 1 + (7 * i) % 50], 1 + (5 * i) % 13, frozenset({0}))
        for i in range(20)
    ]
    outputs = run(lm, requests, context_len=80, max_running_requests=6, overlap=True)
    check = compare(lm, requests, outputs, generate_reference(lm, requests))
    assert check.lossless, check.line()
    assert check.requests == 20


def test_a_prompt_filling_context_len_runs_and_one_more_token_is_refused(
    wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """prompt + max_new_tokens + 2 * T == context_len runs losslessly (gemma2: 50 tokens, past
    its window of 8); one token more is refused by the engine naming the sum."""
    lm = wrapped("gemma2")
    fits = [Request("r", ids[:50], 6)]  # 50 + 6 + 2 * 4 = 64
    assert compare(lm, fits, run(lm, fits), generate_reference(lm, fits)).lossless
    with pytest.raises(
        InvalidConfig, match=r"prompt \(50\) \+ max_new_tokens \(7\) .* = 65 exceeds"
    ):
        run(lm, [Request("r", ids[:50], 7)])


def test_repeated_engines_on_one_wrapped_model_agree(
    wrapped: Callable[[str], HFCausalLM], ids: tuple[int, ...]
) -> None:
    """Engines run one after another on the same HFCausalLM (with reference runs between)
    give the same outputs: the wrapper keeps no state between forwards."""
    lm = wrapped("mistral")
    requests = [Request("a", ids[:9], 8), Request("b", ids[:17], 5)]
    first = run(lm, requests)
    generate_reference(lm, requests)
    assert Engine("NONE", ModelSet(target=lm), EngineConfig(context_len=64)).run(requests) == first
    assert run(lm, requests, overlap=True) == first
