"""The probe forward :class:`~specstrat.hf.HFCausalLM` runs at construction: an attention
backend that records each layer's head shapes (and so which layers called transformers'
attention interface at all) and computes dense causal attention with the layer's arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specstrat.errors import ModelLoadError

__all__ = ["LayerShape", "Probe", "attention_class", "attention_layers"]


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One layer's attention heads as the probe saw them: query heads, key/value heads, and
    the head width."""

    heads: int
    kv_heads: int
    head_dim: int


class Probe:
    """An attention backend that records each layer's head shapes and runs dense causal
    attention with the layer's arguments (one probe forward at load)."""

    def __init__(self) -> None:
        self.layers: dict[int, LayerShape] = {}

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scaling: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        if not (q.shape[2] == k.shape[2] == v.shape[2]) or k.shape[1] != v.shape[1]:
            raise ModelLoadError(
                f"layer {layer}: query, key and value heads are {tuple(q.shape[1:])}, "
                f"{tuple(k.shape[1:])} and {tuple(v.shape[1:])} (heads, width): specstrat's KV "
                "cache holds key and value heads of the query's width (a value head width such "
                "as v_head_dim that differs is not supported)"
            )
        if q.shape[1] % k.shape[1]:
            raise ModelLoadError(
                f"layer {layer}: {q.shape[1]} query heads are not a multiple of {k.shape[1]} "
                "key/value heads"
            )
        self.layers[layer] = LayerShape(q.shape[1], k.shape[1], q.shape[2])
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * (scaling or q.shape[2] ** -0.5)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        n = q.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        return torch.einsum("hqk,khd->qhd", F.softmax(scores, dim=-1), v)


def _is_attention(name: str) -> bool:
    return "attn" in name.rsplit(".", 1)[-1] or "attention" in name


def attention_layers(model: Any) -> set[int]:
    """The ``layer_idx`` of every attention module the model holds (by module name): the
    layers its forward runs, which an early-exit view cuts short; empty where attention
    modules carry no ``layer_idx``."""
    return {
        m.layer_idx
        for n, m in model.named_modules()
        if isinstance(getattr(m, "layer_idx", None), int) and _is_attention(n)
    }


def attention_class(model: Any, layer: int) -> str:
    """The class name of layer ``layer``'s attention module (the module carrying that
    ``layer_idx`` whose name says attention; else any module carrying it)."""
    carriers = [(n, m) for n, m in model.named_modules() if getattr(m, "layer_idx", None) == layer]
    named = [m for n, m in carriers if _is_attention(n)]
    found = named or [m for _, m in carriers]
    return type(found[0]).__name__ if found else f"layer {layer}"
