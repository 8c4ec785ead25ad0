"""Host reads per decode step, and what freezing the hooks' answers costs per step.

Reads are counted as ``tests/runtime/syncs.py`` counts them (``_local_scalar_dense`` in a
dispatch mode, as ``bench/metadata.py`` does, plus every ``tolist()``/``cpu()`` call: on a GPU
each is a host sync). The cost is the decode time per step with the answers' copies
(:mod:`specstrat.runtime._answers`) against the same run with each copy replaced by the
object itself, interleaved, ``--repeats`` runs each, the minimum per step (preemption on a
shared machine only ever adds time).

Usage: ``python bench/step_syncs.py [--repeats N] [--threads K]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))

from specstrat import DSPARK, EAGLE, NGRAM, STANDALONE, SamplingParams
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.strategies import TopkTree
from tests.runtime.syncs import count_step_reads

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
ALGOS: list[tuple[str, Any, float]] = [
    ("NGRAM", NGRAM, 0.0),
    ("EAGLE", EAGLE, 0.0),
    ("EAGLE sampled", EAGLE, 1.0),  # a drafter q [bs, n, V] is copied each step
    ("EAGLE-tree", replace(EAGLE, tree=TopkTree(topk=2, num_steps=3)), 0.0),
    ("STANDALONE", STANDALONE, 0.0),
    ("DSPARK", DSPARK, 0.0),
]


def _same(value: Any) -> Any:
    return value


def without_copies() -> AbstractContextManager[Any]:
    """Every answer copy replaced by the answer itself (the checks still run)."""
    from contextlib import ExitStack

    stack = ExitStack()
    for target in (
        "specstrat.runtime._answers.copy_tree",
        "specstrat.runtime._answers.copy_acceptance",
        "specstrat.runtime._answers.copy_payload",
        "specstrat.runtime._step.copy_tree",
    ):
        stack.enter_context(patch(target, _same))
    return stack


def seconds_per_step(algo: Any, requests: list[Any], copies: Callable[[], Any]) -> float:
    engine = Engine(algo, MODELS, CONFIG)
    with copies():
        engine.run(requests)
    return engine.stats.decode_seconds / max(engine.stats.decode_steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    header = (
        f"{'algorithm':<14} {'steps':>5} {'reads/step':>10} "
        f"| {'copied ms/step':>14} {'uncopied':>8} {'cost':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, algo, temperature in ALGOS:
        requests = [
            replace(r, max_new_tokens=24, sampling=SamplingParams(temperature=temperature, seed=1))
            for r in workload(4, seed=3)
        ]
        with count_step_reads() as counted:
            Engine(algo, MODELS, CONFIG).run(requests)
        copied, plain = [], []
        for _ in range(args.repeats):
            copied.append(seconds_per_step(algo, requests, nullcontext))
            plain.append(seconds_per_step(algo, requests, without_copies))
        with_ms, without_ms = 1e3 * min(copied), 1e3 * min(plain)
        cost = (with_ms - without_ms) / without_ms
        print(
            f"{name:<14} {counted.steps:>5} {counted.per_step:>10.2f} | {with_ms:>14.3f} "
            f"{without_ms:>8.3f} {cost:>+6.1%}"
        )


MODELS = EmbeddedModels.load()

if __name__ == "__main__":
    main()
