"""What a target-only decode step costs on SmolLM2 beside its matmuls: the engine's floor.

Runs target-only decoding in the engine on the code-editing prompts twice per round: once as
loaded, once with every matmul of the fast forward (layers and LM head) replaced by a stub that
returns a preallocated tensor (the LM head's stub always picks one ordinary token, so the run
goes the full length). The second figure is what the step costs outside the matmuls: the
forward's small ops, attention, the staleness check, metadata, the scheduler and acceptance.
The stubbed run's tokens are meaningless; only its time is read. Medians over ``--rounds``
interleaved rounds, milliseconds per generated token.

Usage: ``python bench/step_overhead.py [--threads 2] [--rounds 4] [--requests 1]
[--max-new-tokens 64]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specstrat.hf import load
from specstrat.hf.code_workload import code_prompts
from specstrat.hf.smollm2 import smollm2_path
from specstrat.runtime import Engine, EngineConfig

#: The token the stubbed LM head always picks (an ordinary one, so no request stops early).
STUB_TOKEN = 1000


class StubPlan:
    """Stands in for a :class:`~specstrat.hf.matmul_padding.MatmulPlan`: ``linear`` returns a
    zero tensor of the product's shape (held per shape), with ``STUB_TOKEN`` the largest
    logit where ``head`` is set."""

    def __init__(self, head: bool) -> None:
        self.head = head
        self.held: dict[tuple[int, int], torch.Tensor] = {}

    def linear(self, x: torch.Tensor, weight: torch.Tensor, *args: object) -> torch.Tensor:
        """A held ``[rows, out]`` tensor in place of ``x @ weight.T``."""
        key = (x.shape[0], weight.shape[0])
        if key not in self.held:
            self.held[key] = torch.zeros(key, dtype=x.dtype)
            if self.head:
                self.held[key][:, STUB_TOKEN] = 1.0
        return self.held[key]


def main() -> None:
    """Print ms per token as loaded and with the matmuls stubbed, and their difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load(smollm2_path())
    forward = models.target.fast_forward
    if forward is None:
        raise SystemExit("SmolLM2 did not get the fast forward; nothing to measure")
    requests = [
        models.request(f"r{i}", args.max_new_tokens, messages=[{"role": "user", "content": text}])
        for i, (_, text) in enumerate(code_prompts(args.requests))
    ]
    config = EngineConfig(context_len=1024)
    plans = {
        "loaded": (forward.plan, forward.head_plan),
        "stubbed": (StubPlan(False), StubPlan(True)),
    }
    times: dict[str, list[float]] = {name: [] for name in plans}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for name, (plan, head_plan) in plans.items():
                forward.plan, forward.head_plan = plan, head_plan  # type: ignore[assignment]
                engine = Engine("NONE", models, config)
                start = time.perf_counter()
                outputs = engine.run(requests)
                seconds = time.perf_counter() - start
                tokens = sum(len(out) for out in outputs.values())  # a request may stop early
                if round_:
                    times[name].append(1000 * seconds / tokens)
    finally:
        forward.plan, forward.head_plan = plans["loaded"]  # type: ignore[assignment]
    loaded, stubbed = (statistics.median(times[name]) for name in plans)
    print(
        f"torch threads {args.threads}, {args.requests} request(s) x up to "
        f"{args.max_new_tokens} tokens, medians of {args.rounds} rounds: {loaded:.1f} ms a "
        f"token as loaded, {stubbed:.1f} ms with the matmuls stubbed (the step's floor); matmuls "
        f"{loaded - stubbed:.1f} ms ({(loaded - stubbed) / loaded:.0%})"
    )


if __name__ == "__main__":
    main()
