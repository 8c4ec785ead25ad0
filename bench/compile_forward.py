"""SmolLM2's fast forward eager against the same forward under ``torch.compile``, one run.

The engine's step outside its matmuls (norms, RoPE, SiLU, residual adds, reshapes, Python)
costs 8-13 ms a token on this CPU (``bench/step_overhead.py``); graph capture is torch's way to
fuse those small ops and drop the Python between them. This times the fast forward alone on
``n`` tokens with dense causal attention over those tokens (no KV cache), eager and compiled
(inductor, static shapes), median of ``--repeats`` interleaved calls, and prints the compile
time of the first call and whether the compiled logits pick the same tokens (and how far they
lie from the eager ones). Both run the fast forward as loaded (its matmul plan and oneDNN-packed
weights), or with ``--linear-only`` ``F.linear`` for every matmul; ``--freezing`` compiles with
inductor's freezing option, which folds the weights in as constants and, for ``F.linear``
matmuls (so with ``--linear-only``), packs them itself. The forward as loaded is timed beside
both (the engine's own forward).

Usage: ``python bench/compile_forward.py [--threads 2] [--repeats 30] [--tokens 1,4]
[--mode default] [--linear-only] [--freezing] [--segments]``.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from measure import interleaved_median_ms

from specstrat.hf import load
from specstrat.hf.fast_llama import FastLlamaForward
from specstrat.hf.matmul_padding import MatmulPlan
from specstrat.hf.smollm2 import smollm2_path
from specstrat.models import AttentionBackend


def attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Dense causal attention over the ``n`` tokens given (``[n, heads, d]``), GQA expanded
    (SmolLM2 has no sliding window or softcap): what
    :class:`~specstrat.hf.attention_probe.Probe` computes, without its recording of each layer's
    shapes, a side effect kept out of the compiled graph."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scaling
    )
    return out.transpose(0, 1)


def _stretch_in(
    x: torch.Tensor,
    norm: torch.Tensor,
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    shape: tuple[float, int, int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer up to its attention: norm, the fused QKV matmul and RoPE on queries and keys."""
    eps, heads, kv_heads, head_dim = shape
    n, q_width, kv_width = x.shape[0], heads * head_dim, kv_heads * head_dim
    out = F.linear(F.rms_norm(x, (x.shape[-1],), norm, eps), qkv)
    qk = out[:, : q_width + kv_width].view(n, heads + kv_heads, head_dim)
    half = head_dim // 2
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    return qk[:, :heads], qk[:, heads:], out[:, q_width + kv_width :].view(n, kv_heads, head_dim)


def _stretch_out(
    x: torch.Tensor,
    attended: torch.Tensor,
    o: torch.Tensor,
    norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """A layer after its attention: the output matmul, the residual, norm and the SiLU MLP."""
    x = x + F.linear(attended.reshape(x.shape[0], -1), o)
    gate, up = F.linear(F.rms_norm(x, (x.shape[-1],), norm, eps), gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down)


def _segmented(forward: FastLlamaForward, options: dict[str, Any]) -> Callable[..., Any]:
    """The fast forward's arithmetic with each layer's two stretches compiled (SmolLM2: no
    biases, SiLU); returns ``(logits,)``."""
    stretch_in = torch.compile(_stretch_in, dynamic=False, **options)
    stretch_out = torch.compile(_stretch_out, dynamic=False, **options)
    model = forward._model  # the bench reads the forward's own weights, as it runs them
    base, layers = model.model, forward._layers

    def run(
        tokens: torch.Tensor, positions: torch.Tensor, attend: AttentionBackend
    ) -> tuple[torch.Tensor]:
        x = F.embedding(tokens, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(x, positions[None])
        cos, sin = cos[0, :, None], sin[0, :, None]
        for w in layers:
            shape = (w.eps_in, w.heads, w.kv_heads, w.head_dim)
            q, k, v = stretch_in(x, w.norm_in, w.qkv, cos, sin, shape)
            out = attend(w.layer_idx, q, k, v, scaling=w.scaling)
            x = stretch_out(x, out, w.o, w.norm_post, w.gate_up, w.down, w.eps_post)
        final = F.rms_norm(x, (x.shape[-1],), base.norm.weight, base.norm.variance_epsilon)
        return (F.linear(final, model.lm_head.weight),)

    return run


def main() -> None:
    """Print one line per token count: eager and compiled times, compile time, agreement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tokens", default="1,4")
    parser.add_argument("--mode", default="default")
    parser.add_argument(
        "--linear-only",
        action="store_true",
        help="F.linear for every matmul (no plan, no packed weights) in both forwards",
    )
    parser.add_argument(
        "--freezing",
        action="store_true",
        help="inductor's freezing option: weights folded in as constants (and, with "
        "--linear-only, packed by inductor itself); not with --mode",
    )
    parser.add_argument(
        "--segments",
        action="store_true",
        help="compile the stretches between two layers' attention as functions of the layer's "
        "weights (one graph serves every layer; attention, as the engine's paged attention "
        "would be, and the loop over layers stay eager) instead of the whole forward",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load(smollm2_path())
    forward = models.target.fast_forward
    if forward is None:
        raise SystemExit("SmolLM2 did not get the fast forward; nothing to compile")
    loaded = forward.plan, forward.head_plan
    if args.linear_only:  # an empty plan runs F.linear whatever packed copies it is handed
        forward.plan, forward.head_plan = MatmulPlan(), MatmulPlan()
    plans = forward.plan, forward.head_plan

    def as_loaded(tokens: torch.Tensor, positions: torch.Tensor) -> object:
        """The eager forward with the plan it was loaded with (the engine's forward)."""
        forward.plan, forward.head_plan = loaded
        try:
            return forward(tokens, positions, attention)
        finally:
            forward.plan, forward.head_plan = plans

    if args.freezing and args.mode != "default":
        raise SystemExit(f"--freezing with --mode {args.mode}: torch.compile takes one; drop one")
    print(
        f"torch {torch.__version__}, threads {args.threads}, mode {args.mode!r}, "
        f"freezing {args.freezing}, linear only {args.linear_only}, "
        f"segments {args.segments}"
    )
    print(f"matmul plan by rows, layers, as loaded: {loaded[0].summary()}")
    options: dict[str, Any] = (
        {"options": {"freezing": True}} if args.freezing else {"mode": args.mode}
    )
    compiled: Callable[..., Any] = (
        _segmented(forward, options)
        if args.segments
        else torch.compile(forward.__call__, dynamic=False, **options)
    )
    with torch.inference_mode():
        for n in (int(x) for x in args.tokens.split(",")):
            tokens, positions = torch.arange(n) + 100, torch.arange(n) + 50
            eager_logits = forward(tokens, positions, attention)[0]
            start = time.perf_counter()
            compiled_logits = compiled(tokens, positions, attention)[0]
            compile_s = time.perf_counter() - start
            ms = interleaved_median_ms(
                {
                    "eager": functools.partial(forward, tokens, positions, attention),
                    "compiled": functools.partial(compiled, tokens, positions, attention),
                    "loaded": functools.partial(as_loaded, tokens, positions),
                },
                args.repeats,
            )
            same = bool((eager_logits.argmax(-1) == compiled_logits.argmax(-1)).all())
            diff = float((eager_logits - compiled_logits).abs().max())
            print(
                f"{n} token(s): eager {ms['eager']:.1f} ms, compiled {ms['compiled']:.1f} ms "
                f"({ms['eager'] / ms['compiled']:.2f}x), eager as loaded {ms['loaded']:.1f} ms "
                f"({ms['loaded'] / ms['compiled']:.2f}x); first compiled call {compile_s:.1f} s; "
                f"same top-1 {same}, largest logit difference {diff:.2e}"
            )


if __name__ == "__main__":
    main()
