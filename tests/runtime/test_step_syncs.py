"""Freezing hook answers adds no host sync: a decode step reads the host no more than before."""

from dataclasses import replace
from typing import Any

import pytest

from specstrat import DSPARK, EAGLE, STANDALONE
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, workload
from specstrat.strategies import TopkTree
from tests.runtime.syncs import count_step_reads

CONFIG = EngineConfig(context_len=512, max_running_requests=4)
REQUESTS = [replace(r, max_new_tokens=16) for r in workload(2, seed=3)]

# Host reads per decode step on this workload before the answers were frozen (commit 82330fa,
# counted by tests/runtime/syncs.py: decode steps, reads): EAGLE 7, 315; EAGLE + TopkTree(2, 3)
# 5, 247; STANDALONE 6, 509; DSPARK 11, 896. Frozen (this code): 245, 182, 449, 786.
BEFORE: list[tuple[str, Any, int, int]] = [
    ("EAGLE", EAGLE, 7, 315),
    ("EAGLE-tree", replace(EAGLE, tree=TopkTree(topk=2, num_steps=3)), 5, 247),
    ("STANDALONE", STANDALONE, 6, 509),
    ("DSPARK", DSPARK, 11, 896),
]


@pytest.mark.parametrize(("case", "algo", "steps", "reads"), BEFORE, ids=[c[0] for c in BEFORE])
def test_a_step_reads_the_host_no_more_than_before(
    case: str, algo: Any, steps: int, reads: int, models: EmbeddedModels
) -> None:
    """The same run takes the same decode steps and at most the host reads it took before."""
    engine = Engine(algo, models, CONFIG)
    with count_step_reads() as counted:
        engine.run(REQUESTS)
    assert counted.steps == steps
    assert counted.reads <= reads
