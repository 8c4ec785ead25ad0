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
    """A tiny config of ``family`` (llama, qwen2, qwen3, mistral, gpt2, gemma2); the LM head is
    ``VOCAB + 16`` wide (padded past the tokenizer)."""
    import transformers as tf

    vocab = VOCAB + 16
    common: dict[str, Any] = {"vocab_size": vocab, "initializer_range": 0.4, "eos_token_id": 0}
    decoder: dict[str, Any] = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    made: dict[str, Any] = {
        "llama": lambda: tf.LlamaConfig(**common, **decoder),
        "qwen2": lambda: tf.Qwen2Config(**common, **decoder),
        "qwen3": lambda: tf.Qwen3Config(**common, **decoder, head_dim=16),
        "mistral": lambda: tf.MistralConfig(**common, **decoder),  # sliding_window 4096 default
        "gpt2": lambda: tf.GPT2Config(**common, n_embd=64, n_layer=2, n_head=4, n_positions=512),
        "gemma2": lambda: tf.Gemma2Config(
            **common,
            **decoder,
            head_dim=16,
            sliding_window=8,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=16,
        ),
    }
    cfg = made[family]()
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


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
