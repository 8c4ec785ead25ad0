"""The roofline of ``specstrat bench``: the machine's measured limits, the weight bytes a forward
reads, each row's limit by the documented formulas, and the fields every bench row carries."""

from dataclasses import replace

import pytest
import torch

from specstrat import NGRAM
from specstrat.bench.roofline import (
    Machine,
    Roofline,
    TargetWeights,
    measure_machine,
    roofline,
    weight_bytes,
    with_roofline,
)
from specstrat.bench.run import BenchConfig, run_bench
from specstrat.errors import InvalidConfig
from specstrat.runtime import EmbeddedModels

MACHINE = Machine(memory_bandwidth_gbs=10.0, matmul_gflops=100.0, threads=1)


def _limit(
    *, batch: int, tokens_per_forward: float, verified: float, tokens_per_s: float
) -> Roofline:
    """The roofline on MACHINE of a 1 GB float32 target at this batch and these tokens."""
    return roofline(
        MACHINE,
        weights=10**9,
        element_size=4,
        batch=batch,
        tokens_per_forward=tokens_per_forward,
        verified=verified,
        tokens_per_s=tokens_per_s,
    )


def test_measure_machine_gives_positive_rates_on_torch_threads() -> None:
    """Bandwidth and matmul rate are measured, positive, on torch's thread count."""
    machine = measure_machine(repeats=1)
    assert machine.memory_bandwidth_gbs > 0
    assert machine.matmul_gflops > 0
    assert machine.threads == torch.get_num_threads()
    assert set(machine.as_dict()) >= {"memory_bandwidth_gbs", "matmul_gflops"}


def test_measure_machine_refuses_a_bad_repeat_count() -> None:
    """A repeat count below 1 is refused naming it."""
    with pytest.raises(InvalidConfig, match=r"repeats=0 must be an int >= 1"):
        measure_machine(repeats=0)


def test_plain_decode_is_memory_bound_at_bandwidth_over_bytes() -> None:
    """Batch 1, one token a forward: the limit is bandwidth over the weight bytes."""
    limit = _limit(batch=1, tokens_per_forward=1.0, verified=1.0, tokens_per_s=5.0)
    assert limit.weight_bytes_per_token == 10**9
    assert limit.roofline_tokens_per_s == pytest.approx(10.0)
    assert limit.roofline_fraction == pytest.approx(0.5)
    assert limit.bound == "memory"


def test_speculation_and_batching_divide_the_bytes_per_token() -> None:
    """τ 2.5 at batch 4 divides the bytes a token costs by 10 and multiplies the limit by 10."""
    limit = _limit(batch=4, tokens_per_forward=2.5, verified=4.0, tokens_per_s=50.0)
    assert limit.weight_bytes_per_token == pytest.approx(10**8)
    assert limit.roofline_tokens_per_s == pytest.approx(100.0)


def test_a_wide_verify_is_compute_bound() -> None:
    """Verifying many tokens per accepted one makes the matmul rate the lower limit."""
    # 2.5e8 weights: 5e8 flops a verified token; 100 GFLOPS -> 200 verified tokens/s, and
    # one of every 50 verified is kept: 4 tokens/s, below memory's 64 * 10 = 640.
    limit = _limit(batch=64, tokens_per_forward=1.0, verified=50.0, tokens_per_s=2.0)
    assert limit.bound == "compute"
    assert limit.roofline_tokens_per_s == pytest.approx(4.0)
    assert limit.roofline_fraction == pytest.approx(0.5)


def test_roofline_refuses_values_that_are_not_positive() -> None:
    """A zero batch or negative τ is refused naming every input."""
    with pytest.raises(InvalidConfig, match=r"batch=0.*all > 0"):
        roofline(
            MACHINE,
            weights=1,
            element_size=4,
            batch=0,
            tokens_per_forward=1.0,
            verified=1.0,
            tokens_per_s=1.0,
        )


class _Embedded(torch.nn.Module):
    """A transformers-shaped module: input embedding, a layer, an LM head (tied or not)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)
        self.layer = torch.nn.Linear(8, 8, bias=False)
        self.head = torch.nn.Linear(8, 100, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> torch.nn.Module:
        """The input embedding."""
        return self.embed

    def get_output_embeddings(self) -> torch.nn.Module:
        """The LM head."""
        return self.head


class _Wrapper:
    """What the HF adapter looks like to the roofline: ``parameters()`` and ``model``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def parameters(self) -> object:
        """The wrapped model's parameters."""
        return self.model.parameters()


def test_weight_bytes_count_a_tied_table_once_and_skip_an_untied_input_embedding() -> None:
    """Tied: the table (read as the LM head) and the layer; untied: the head and the layer."""
    table, layer = 100 * 8 * 4, 8 * 8 * 4
    assert weight_bytes(_Wrapper(_Embedded(tied=True))) == table + layer
    assert weight_bytes(_Wrapper(_Embedded(tied=False))) == table + layer
    assert weight_bytes(torch.nn.Linear(8, 8, bias=False)) == layer


def test_every_bench_row_carries_its_roofline_and_the_run_its_machine() -> None:
    """The JSON has the machine's two rates once and each row's limit, consistent with them,
    and the decode steps' own fraction of it from the median TPOT."""
    config = BenchConfig(algorithms=(NGRAM,), requests=2, max_new_tokens=8, repeats=1, warmup=0)
    models = EmbeddedModels.load()
    result = run_bench(config, models)
    env = result.as_dict()["environment"]
    assert env["memory_bandwidth_gbs"] > 0
    assert env["matmul_gflops"] > 0
    for row in result.rows:
        assert row.weight_bytes_per_token is not None
        assert row.roofline_tokens_per_s is not None
        assert row.roofline_fraction == pytest.approx(row.tokens_per_s / row.roofline_tokens_per_s)
        tpot = row.tpot_ms["median"]
        assert tpot is not None
        decode = min(row.batch_size, 2) * 1000 / tpot / row.roofline_tokens_per_s
        assert row.decode_roofline_fraction == pytest.approx(decode)
        assert row.roofline_bound in ("memory", "compute")
    none = result.rows[0]
    assert none.weight_bytes_per_token == weight_bytes(models.target)
    machine = Machine(env["memory_bandwidth_gbs"], env["matmul_gflops"], 1)
    weights = TargetWeights.of(models.target)
    again = with_roofline(replace(none, roofline_fraction=None), machine, weights, 2)
    assert again.roofline_tokens_per_s == pytest.approx(none.roofline_tokens_per_s)
    single = with_roofline(
        replace(none, tpot_ms={"median": None, "p90": None}), machine, weights, 2
    )
    assert single.decode_roofline_fraction is None  # no request had two tokens
