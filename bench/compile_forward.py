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
matmuls (so with ``--linear-only``), packs them itself.

Usage: ``python bench/compile_forward.py [--threads 2] [--repeats 30] [--tokens 1,4]
[--mode default] [--linear-only] [--freezing]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specstrat.hf import load
from specstrat.hf.matmul_padding import MatmulPlan
from specstrat.hf.smollm2 import smollm2_path


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
    (SmolLM2 has no sliding window or softcap)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scaling
    )
    return out.transpose(0, 1)


def _median_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each call's median time in ms over ``repeats`` interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load(smollm2_path())
    forward = models.target.fast_forward
    if forward is None:
        raise SystemExit("SmolLM2 did not get the fast forward; nothing to compile")
    if args.linear_only:
        forward.plan, forward.head_plan = MatmulPlan(), MatmulPlan()
        forward.pack_weights()
    if args.freezing and args.mode != "default":
        raise SystemExit(f"--freezing with --mode {args.mode}: torch.compile takes one; drop one")
    print(
        f"torch {torch.__version__}, threads {args.threads}, mode {args.mode!r}, "
        f"freezing {args.freezing}, linear only {args.linear_only}"
    )
    print(f"matmul plan by rows, layers: {forward.plan.summary()}")
    compiled = (
        torch.compile(forward.__call__, dynamic=False, options={"freezing": True})
        if args.freezing
        else torch.compile(forward.__call__, dynamic=False, mode=args.mode)
    )
    with torch.inference_mode():
        for n in (int(x) for x in args.tokens.split(",")):
            tokens, positions = torch.arange(n) + 100, torch.arange(n) + 50
            eager_logits = forward(tokens, positions, attention)[0]
            start = time.perf_counter()
            compiled_logits = compiled(tokens, positions, attention)[0]
            compile_s = time.perf_counter() - start
            ms = _median_ms(
                {
                    "eager": functools.partial(forward, tokens, positions, attention),
                    "compiled": functools.partial(compiled, tokens, positions, attention),
                },
                args.repeats,
            )
            same = bool((eager_logits.argmax(-1) == compiled_logits.argmax(-1)).all())
            diff = float((eager_logits - compiled_logits).abs().max())
            print(
                f"{n} token(s): eager {ms['eager']:.1f} ms, compiled {ms['compiled']:.1f} ms "
                f"({ms['eager'] / ms['compiled']:.2f}x); first compiled call {compile_s:.1f} s; "
                f"same top-1 {same}, largest logit difference {diff:.2e}"
            )


if __name__ == "__main__":
    main()
