"""Ragged TARGET_VERIFY replayed through the graph runner's token buckets equals the eager
forward."""

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

import specstrat
from specstrat import InvalidConfig
from specstrat.runtime import EmbeddedModels, ForwardMode
from specstrat.runtime._graph_runner import GraphRunner
from specstrat.runtime._models.model import ModelConfig, TinyLM
from specstrat.runtime._worker import ModelWorker
from tests.runtime.conftest import make_worker

PROMPTS = [
    [5, 6, 7, 8, 9, 10, 11],
    [200, 3, 3, 3, 40, 41, 42, 43, 44, 45],
    [1, 2, 3, 4],
    [17] * 12,
    [90, 91, 92],
    [7, 7, 8, 8, 9, 9],
    [33, 34],
    [120, 121, 122, 123, 124],
    [60, 61, 62, 63],
]
BUCKETS = (1, 2, 4, 8)
D = 3  # DSPARK on the target worker: T = D = 3


def prepared(models: EmbeddedModels, bs: int) -> tuple[ModelWorker, list[int]]:
    """A worker over the embedded target with the first ``bs`` prompts prefilled."""
    worker = make_worker(models.target, tokens=800, requests=10)
    slots = [worker.alloc_request() for _ in range(bs)]
    worker.forward(ForwardMode.EXTEND, slots, PROMPTS[:bs])
    return worker, slots


def rows(counts: list[int], seed: int) -> list[list[int]]:
    """Verify rows of the given widths, random token ids."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (c,), generator=gen).tolist() for c in counts]


# (counts, bucket): leftover on one padding row wider than T, an exact fit with no padding row,
# leftover split unevenly over four padding rows, a full bucket, and bs=1. With token buckets
# B * T and rows of at most T tokens each padding row gets >= T tokens (never 0 here; the kernel
# tests cover width 0).
CASES: list[tuple[list[int], int]] = [
    ([1, 3, 2], 4),
    ([3, 3], 2),
    ([1, 1, 1, 1], 8),
    ([2, 3, 3, 3, 3, 3, 3], 8),
    ([3, 3, 3, 3, 3, 3, 3, 3], 8),
    ([2], 2),
]


class Replay(NamedTuple):
    """One ragged step run eagerly and through the runner, on two identical workers."""

    eager: torch.Tensor
    eager_hidden: torch.Tensor
    replayed: torch.Tensor
    replayed_hidden: torch.Tensor
    eager_worker: ModelWorker
    graph_worker: ModelWorker
    runner: GraphRunner


def ragged_replay(
    models: EmbeddedModels,
    counts: list[int],
    *,
    patch: Callable[[GraphRunner], None] | None = None,
) -> Replay:
    """Eager ragged forward and bucketed replay of the same step on two identical workers."""
    bs = len(counts)
    tokens = rows(counts, seed=sum(counts) * 31 + bs)
    eager_worker, e_slots = prepared(models, bs)
    graph_worker, g_slots = prepared(models, bs)
    runner = GraphRunner(graph_worker, specstrat.DSPARK, D, buckets=BUCKETS)
    if patch is not None:
        patch(runner)
    eager, e_hidden = eager_worker.forward(ForwardMode.TARGET_VERIFY, e_slots, tokens)
    assert runner.can_run_ragged(bs, sum(counts))
    replayed, r_hidden = runner.replay_ragged(g_slots, tokens)
    return Replay(eager, e_hidden, replayed, r_hidden, eager_worker, graph_worker, runner)


@pytest.mark.parametrize(("counts", "bucket"), CASES, ids=[str(c[0]) for c in CASES])
def test_ragged_replay_equals_eager(models: EmbeddedModels, counts: list[int], bucket: int) -> None:
    """Logits and hidden of every real token equal the eager ragged forward's (float64)."""
    run = ragged_replay(models, counts)
    assert run.runner.ragged_bucket(len(counts), sum(counts)) == bucket
    assert run.replayed.shape == (sum(counts), run.eager.shape[-1])
    torch.testing.assert_close(run.replayed, run.eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(run.replayed_hidden, run.eager_hidden, rtol=1e-12, atol=1e-12)
    assert torch.equal(run.replayed.argmax(-1), run.eager.argmax(-1))


def test_padding_rows_touch_only_slot_0(models: EmbeddedModels) -> None:
    """After a padded replay every real KV index and request row equals the eager worker's
    (to float64 rounding: the two forwards batch the same tokens in different shapes)."""
    run = ragged_replay(models, [1, 3, 2])
    eager_worker, graph_worker = run.eager_worker, run.graph_worker
    for got, want in (
        (graph_worker.kv.k, eager_worker.kv.k),
        (graph_worker.kv.v, eager_worker.kv.v),
    ):
        torch.testing.assert_close(got[:, 1:], want[:, 1:], rtol=1e-12, atol=1e-12)
    assert graph_worker.kv.k[:, 0].abs().sum() > 0  # the padding tokens wrote slot 0
    assert eager_worker.kv.k[:, 0].abs().sum() == 0
    assert torch.equal(graph_worker.requests.req_to_token, eager_worker.requests.req_to_token)
    for slot in (1, 2, 3):
        assert graph_worker.cached([slot])[0] == eager_worker.cached([slot])[0]


def test_capture_bounds_give_the_same_logits(models: EmbeddedModels) -> None:
    """With the bounds a CUDA graph captures (B*(T-1)+1 query rows, context_len keys), run
    eagerly here, a replay still equals the eager forward."""

    def as_if_captured(runner: GraphRunner) -> None:
        runner.use_cuda_graph = True

        def run(bucket: Any, forward: Callable[[], Any], shape: str) -> Any:
            return forward()

        runner._run = run  # type: ignore[method-assign]

    run = ragged_replay(models, [1, 1, 1], patch=as_if_captured)
    torch.testing.assert_close(run.replayed, run.eager, rtol=1e-12, atol=1e-12)


def test_bucket_rule() -> None:
    """Token buckets are batch buckets times T; leftover tokens need a padding row."""
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(dim=16, layers=1, heads=2, mlp=32, max_positions=64)).double()
    worker = ModelWorker(model, max_running_requests=4, context_len=64, max_total_tokens=64)
    runner = GraphRunner(worker, specstrat.DSPARK, D, buckets=BUCKETS)
    assert runner.ragged_buckets == ((1, 3), (2, 6), (4, 12), (8, 24))
    assert runner.ragged_bucket(1, 3) == 1  # exact fit, no padding row needed
    assert runner.ragged_bucket(1, 2) == 2  # leftover 4 goes to the one padding row
    assert runner.ragged_bucket(4, 12) == 4
    assert runner.ragged_bucket(4, 11) == 8
    assert runner.ragged_bucket(8, 23) is None  # largest bucket full, leftover has no row
    assert runner.ragged_bucket(8, 24) == 8
    assert not runner.can_run_ragged(9, 9)
    assert not runner.can_run_ragged(0, 0)
    assert not runner.can_run_ragged(2, 7)  # more than T tokens per request


def test_replay_errors(models: EmbeddedModels) -> None:
    """Rows outside 1..T, mismatched slots and batches no bucket holds are refused by name,
    before anything is placed in the KV cache."""
    worker, slots = prepared(models, 9)
    runner = GraphRunner(worker, specstrat.DSPARK, D, buckets=BUCKETS)
    free = worker.kv.available
    with pytest.raises(InvalidConfig, match=r"a ragged row has 4 tokens; each verifies 1\.\.T=3"):
        runner.replay_ragged(slots[:2], [[1], [1, 2, 3, 4]])
    with pytest.raises(InvalidConfig, match=r"a ragged row has 0 tokens"):
        runner.replay_ragged(slots[:2], [[1], []])
    with pytest.raises(InvalidConfig, match=r"2 slots but 1 token rows"):
        runner.replay_ragged(slots[:2], [[1]])
    with pytest.raises(InvalidConfig, match=r"no bucket holds a ragged step of bs=9 and 9 tokens"):
        runner.replay_ragged(slots, [[1]] * 9)
    assert worker.kv.available == free
