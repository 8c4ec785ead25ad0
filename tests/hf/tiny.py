"""Tiny random Hugging Face models and a tokenizer built in code: no download, seconds to build.

Each family's config is small (2-3 layers, widths 32-64) with a large ``initializer_range`` so
logits are spread (random models at the default 0.02 give near-uniform logits and ties
everywhere). The tokenizer is a byte-level BPE trained on a standard-library file.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import torch

VOCAB = 384  # the tokenizer's vocabulary; families below pad their LM head past it

#: The issue's families (Gemma2 with a window of 8 and both soft-caps).
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2", "gemma2"]
#: Further families checked against generate (OPT's head reads a projection of width 32).
MORE_FAMILIES = [
    "phi", "phi3", "gemma3", "olmo2", "granite", "cohere", "gpt_neox", "starcoder2",
    "qwen2-window", "opt",
]  # fmt: skip

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tokenizer() -> Any:
    """A byte-level BPE tokenizer of ``VOCAB`` ids with ``<eos>`` and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<eos>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([inspect.getsource(textwrap)], trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def config(family: str, **overrides: Any) -> Any:
    """A tiny config of ``family`` (one of ``FAMILIES`` or ``MORE_FAMILIES``); the LM head is
    ``VOCAB + 16`` wide (padded past the tokenizer)."""
    import transformers as tf

    vocab = VOCAB + 16
    common: dict[str, Any] = {"vocab_size": vocab, "initializer_range": 0.4, "eos_token_id": 0}
    decoder: dict[str, Any] = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    made: dict[str, Any] = {
        "llama": lambda **kw: tf.LlamaConfig(**_merged(common, decoder, kw)),
        "qwen2": lambda **kw: tf.Qwen2Config(**_merged(common, decoder, kw)),
        "qwen3": lambda **kw: tf.Qwen3Config(**_merged(common, decoder, {"head_dim": 16}, kw)),
        # mistral: its config's sliding_window defaults to 4096
        "mistral": lambda **kw: tf.MistralConfig(**_merged(common, decoder, kw)),
        "gpt2": lambda **kw: tf.GPT2Config(
            **_merged(common, {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512}, kw)
        ),
        "gemma2": lambda **kw: tf.Gemma2Config(**_merged(common, decoder, _GEMMA2, kw)),
        # Beyond the list: partial rotary, QK norms, per-layer windows, logit scaling,
        # parallel blocks, learned positions with an offset and a projected head input (OPT).
        "phi": lambda **kw: tf.PhiConfig(**_merged(common, decoder, kw)),
        "phi3": lambda **kw: tf.Phi3Config(**_merged(common, decoder, {"pad_token_id": 0}, kw)),
        "gemma3": lambda **kw: tf.Gemma3TextConfig(**_merged(common, decoder, _GEMMA3, kw)),
        "olmo2": lambda **kw: tf.Olmo2Config(**_merged(common, decoder, kw)),
        "granite": lambda **kw: tf.GraniteConfig(**_merged(common, decoder, kw)),
        "cohere": lambda **kw: tf.CohereConfig(**_merged(common, decoder, kw)),
        "gpt_neox": lambda **kw: tf.GPTNeoXConfig(**_merged(common, decoder, kw)),
        "starcoder2": lambda **kw: tf.Starcoder2Config(
            **_merged(common, decoder, {"sliding_window": 6}, kw)
        ),
        "qwen2-window": lambda **kw: tf.Qwen2Config(**_merged(common, decoder, _QWEN2_WINDOW, kw)),
        "opt": lambda **kw: tf.OPTConfig(**_merged(_OPT, {"vocab_size": vocab}, kw)),
    }
    return made[family](**overrides)


def _merged(*parts: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``parts``, later ones overriding (overrides go to the
    constructor, so derived fields such as Gemma's per-layer ``layer_types`` follow them)."""
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part)
    return out


_GEMMA2: dict[str, Any] = dict(
    head_dim=16, sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
    query_pre_attn_scalar=16,
)  # fmt: skip
_GEMMA3: dict[str, Any] = dict(  # sliding_window_pattern=2: the layers alternate window, full
    head_dim=16, sliding_window=8, query_pre_attn_scalar=16, sliding_window_pattern=2
)
_QWEN2_WINDOW: dict[str, Any] = dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)
_OPT: dict[str, Any] = dict(
    eos_token_id=0, init_std=0.4, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=32,
)  # fmt: skip


def model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random causal LM of ``family`` in float32, eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    built = AutoModelForCausalLM.from_config(config(family, **overrides))  # type: ignore[no-untyped-call]
    return built.eval()


def save(family: str, directory: Path, seed: int = 0) -> Path:
    """A model directory (config, weights, tokenizer) of a tiny ``family`` model."""
    return save_model(model(family, seed), directory)


def save_model(built: Any, directory: Path) -> Path:
    """A model directory of ``built`` (a tiny model) with the tiny tokenizer."""
    built.save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory
