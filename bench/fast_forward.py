"""SmolLM2's fast Llama forward against transformers' forward, side by side in one run.

Two figures, each from interleaved rounds on the same weights (``HFCausalLM(fast=False)``
wraps the model ``load`` returned):

- the forward alone, ``n`` tokens through dense probe attention (no KV cache), median of
  ``--repeats`` calls each, the fast forward also with ``F.linear`` for every matmul (what its
  load-time matmul plan, :func:`~specstrat.hf.matmul_padding.matmul_plan`, replaces);
- target-only decoding in the engine on the code-editing prompts (``--requests``,
  ``--max-new-tokens``), median of ``--rounds`` runs each, outputs checked equal.

Usage: ``python bench/fast_forward.py [--threads 2] [--repeats 30] [--rounds 3]
[--requests 2] [--max-new-tokens 48]``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import torch
from measure import interleaved_median_ms

from specstrat.hf import HFCausalLM, load
from specstrat.hf.attention_probe import Probe
from specstrat.hf.code_workload import code_prompts
from specstrat.hf.matmul_padding import MatmulPlan
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig


def _forward_line(slow: HFCausalLM, fast: HFCausalLM, n: int, repeats: int) -> str:
    """The forward of ``n`` tokens: the fast forward with its load-time matmul plan, the same
    forward with ``F.linear`` for every matmul (an empty plan), and transformers' forward."""
    forward = fast.fast_forward
    assert forward is not None
    planned = forward.plan, forward.head_plan
    tokens, positions = torch.arange(n) + 100, torch.arange(n) + 50

    def with_plan(plans: tuple[MatmulPlan, MatmulPlan]) -> Callable[[], object]:
        def call() -> object:
            forward.plan, forward.head_plan = plans
            try:
                return fast(tokens, positions, Probe())
            finally:
                forward.plan, forward.head_plan = planned

        return call

    ms = interleaved_median_ms(
        {
            "transformers": lambda: slow(tokens, positions, Probe()),
            "fast": with_plan(planned),
            "linear": with_plan((MatmulPlan(), MatmulPlan())),
        },
        repeats,
    )
    return (
        f"forward, {n} token(s): fast {ms['fast']:.1f} ms, fast with F.linear only "
        f"{ms['linear']:.1f} ms, transformers {ms['transformers']:.1f} ms; plan "
        f"{ms['linear'] / ms['fast']:.2f}x, against transformers "
        f"{ms['transformers'] / ms['fast']:.2f}x"
    )


def main() -> None:
    """Print the forward's and the engine's times, fast against transformers'."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fast = load(smollm2_path())
    if fast.target.fast_forward is None:
        raise SystemExit("SmolLM2 did not get the fast forward; nothing to compare")
    target = HFCausalLM(fast.target.model, vocab_size=fast.target.vocab_size, fast=False)
    slow = dataclasses.replace(fast, target=target)
    print(f"torch threads {args.threads}; medians, fast forward against transformers' forward")
    assert fast.target.fast_forward is not None
    forward = fast.target.fast_forward
    print(f"matmul plan by rows, layers: {forward.plan.summary()}")
    print(f"LM head: {forward.head_plan.summary()}")
    with torch.inference_mode():
        for n in (1, 2, 3, 4, 8):
            print(_forward_line(slow.target, fast.target, n, args.repeats))
    requests = [
        fast.request(f"r{i}", args.max_new_tokens, messages=[{"role": "user", "content": text}])
        for i, (_, text) in enumerate(code_prompts(args.requests))
    ]
    config = EngineConfig(context_len=1024)
    outputs: dict[str, object] = {}

    def run(name: str, models: object) -> None:
        outputs[name] = Engine("NONE", models, config).run(requests)  # type: ignore[arg-type]

    run("fast", fast)  # warm-up
    ms = interleaved_median_ms(
        {"transformers": lambda: run("transformers", slow), "fast": lambda: run("fast", fast)},
        args.rounds,
    )
    same = "equal" if outputs["fast"] == outputs["transformers"] else "DIFFERENT"
    print(
        f"engine, target-only, {args.requests} code prompts x {args.max_new_tokens} tokens: "
        f"fast {ms['fast'] / 1000:.2f} s, transformers {ms['transformers'] / 1000:.2f} s, "
        f"{ms['transformers'] / ms['fast']:.2f}x; outputs {same}"
    )


if __name__ == "__main__":
    main()
