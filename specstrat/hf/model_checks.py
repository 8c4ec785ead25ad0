"""What :class:`~specstrat.hf.HFCausalLM` requires of the transformers model it wraps, checked
before anything is patched: a decoder-only causal LM with an LM head, its weights loaded, in
evaluation mode, and no attention mask specstrat's attention cannot build."""

from __future__ import annotations

from typing import Any

from specstrat.errors import InvalidConfig, ModelLoadError

__all__ = ["check_model"]


def check_model(model: Any, name: str) -> None:
    """Refuse, by name, what is not a decoder-only causal LM on the attention interface."""
    kind = type(model).__name__
    if not callable(getattr(model, "get_output_embeddings", None)) or not hasattr(model, "config"):
        raise ModelLoadError(f"{name}: {kind} is not a transformers PreTrainedModel")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{name}: {kind} is an encoder-decoder model; specstrat runs decoders")
    for field in ("attention_chunk_size", "use_alibi", "alibi"):
        if getattr(model.config, field, None):
            raise ModelLoadError(
                f"{name}: config.{field}={getattr(model.config, field)!r} is not supported "
                "(specstrat's attention has no chunked or ALiBi masks)"
            )
    # (not `base_model is model`: Llama 4's prefix names no child, so its base_model is itself)
    if model.get_output_embeddings() is None:
        raise ModelLoadError(f"{name}: {kind} has no LM head; load it as a causal LM")
    if model.training:
        raise InvalidConfig(
            f"{name}: {kind} is in training mode (dropout would make every forward differ); "
            "call model.eval() first"
        )
    meta = next((n for n, p in model.named_parameters() if p.device.type == "meta"), None)
    if meta is not None:
        raise ModelLoadError(
            f"{name}: {kind}'s weights are on the meta device (parameter {meta}): they were "
            "never loaded; load them (from_pretrained, load_state_dict) or move the model to a "
            "real device"
        )
