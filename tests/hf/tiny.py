"""Tiny random Hugging Face models and a tokenizer built in code: no download, seconds to build.

Each family's config is small (2-3 layers, widths 32-64) with a large ``initializer_range`` so
logits are spread (random models at the default 0.02 give near-uniform logits and ties
everywhere). The tokenizer is a byte-level BPE trained on a standard-library file.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

import torch

VOCAB = 384  # the tokenizer's vocabulary; families below pad their LM head past it

#: The issue's families (Gemma2 with a window of 8 and both soft-caps).
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gpt2", "gemma2"]
#: Further families checked against generate (OPT's head reads a projection of width 32).
MORE_FAMILIES = [
    "phi",
    "phi3",
    "gemma3",
    "olmo2",
    "granite",
    "cohere",
    "gpt_neox",
    "starcoder2",
    "qwen2-window",
    "opt",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
]

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
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    made: dict[str, Any] = {
        "llama": lambda **kw: tf.LlamaConfig(**_merged(common, decoder, kw)),
        "qwen2": lambda **kw: tf.Qwen2Config(**_merged(common, decoder, kw)),
        "qwen3": lambda **kw: tf.Qwen3Config(**_merged(common, decoder, {"head_dim": 16}, kw)),
        # mistral: its config's sliding_window defaults to 4096
        "mistral": lambda **kw: tf.MistralConfig(**_merged(common, decoder, kw)),
        "gpt2": lambda **kw: tf.GPT2Config(
            **_merged(
                common,
                {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 512, "bos_token_id": 0},
                kw,
            )
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
        # Mixture-of-experts layers pass their router flag down to attention; MLA (DeepSeek).
        "mixtral": lambda **kw: tf.MixtralConfig(**_merged(common, decoder, _MIXTRAL, kw)),
        "qwen3_moe": lambda **kw: tf.Qwen3MoeConfig(**_merged(common, decoder, _QWEN3_MOE, kw)),
        "deepseek_v3": lambda **kw: tf.DeepseekV3Config(**_merged(common, decoder, _MLA, kw)),
        # Refused: attention sinks (gpt-oss), chunked attention (Llama 4).
        "gpt_oss": lambda **kw: tf.GptOssConfig(**_merged(common, decoder, _GPT_OSS, kw)),
        "llama4": lambda **kw: tf.Llama4TextConfig(**_merged(common, decoder, _LLAMA4, kw)),
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
    head_dim=16,
    sliding_window=8,
    attn_logit_softcapping=5.0,
    final_logit_softcapping=3.0,
    query_pre_attn_scalar=16,
)
_GEMMA3: dict[str, Any] = dict(  # sliding_window_pattern=2: the layers alternate window, full
    head_dim=16, sliding_window=8, query_pre_attn_scalar=16, sliding_window_pattern=2
)
_QWEN2_WINDOW: dict[str, Any] = dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)
_MIXTRAL: dict[str, Any] = dict(num_local_experts=4, num_experts_per_tok=2)
_QWEN3_MOE: dict[str, Any] = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16
)
_MLA: dict[str, Any] = dict(  # query/key head 16 = 8 rotary + 8 plain, value head 16
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
)
_GPT_OSS: dict[str, Any] = dict(
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
)
_LLAMA4: dict[str, Any] = dict(
    head_dim=16,
    attention_chunk_size=8,
    num_local_experts=2,
    interleave_moe_layer_step=1,
    intermediate_size_mlp=96,
)
_OPT: dict[str, Any] = dict(
    eos_token_id=0,
    init_std=0.4,
    hidden_size=64,
    ffn_dim=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    word_embed_proj_dim=32,
)


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


_GGUF_NAMES = {  # llama.cpp's tensor names for one llama layer
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def save_gguf(path: Path, seed: int = 0) -> Path:
    """A float32 ``.gguf`` file of a tiny llama with the tiny tokenizer (byte-level BPE in
    GGUF's ``gpt2`` tokenizer form), written with the ``gguf`` package; its head is the
    tokenizer's width. transformers reads llama.cpp's q/k layout, so the weights it loads
    differ from this model's (a fixed permutation): tests compare with what it loaded."""
    import gguf
    import numpy as np

    tok = tokenizer()
    state = json.loads(tok.backend_tokenizer.to_str())
    tokens = [""] * len(state["model"]["vocab"])
    for text, index in state["model"]["vocab"].items():
        tokens[index] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    built = model("llama", seed)
    cfg = built.config
    weights = {k: v.detach().float().numpy() for k, v in built.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in ("<eos>", "<pad>") else 1 for t in tokens])
    writer.add_eos_token_id(0)
    writer.add_bos_token_id(0)
    writer.add_pad_token_id(1)
    rows = len(tokens)
    writer.add_tensor(
        "token_embd.weight", np.ascontiguousarray(weights["model.embed_tokens.weight"][:rows])
    )
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", np.ascontiguousarray(weights["lm_head.weight"][:rows]))
    for i in range(cfg.num_hidden_layers):
        for hf, name in _GGUF_NAMES.items():
            writer.add_tensor(f"blk.{i}.{name}", weights[f"model.layers.{i}.{hf}"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
