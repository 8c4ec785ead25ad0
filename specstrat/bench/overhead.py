"""The engine's own host cost per decode step, split by who spends it, on a zero-cost model.

A run decodes ``bs`` requests with a target that computes nothing (fixed logits), in sync mode,
and times, inside decode steps only (prefill is excluded): the drafter (``propose`` and
``commit``), the acceptance rule, the metadata kernels and the relay (``publish``, ``stash``,
``resolve``: on a GPU, device work; here their CPU twins), and the model's forward with its
attention backend (the worker's forward). The strategies are wrapped here; the engine's own
parts report through :func:`~specstrat.runtime.timed_decode_steps`. ``scheduler_us`` is what
remains of the measured wall time per decode step (the step, plus the scheduler's plan and
absorb): the engine's own work, which a GPU would feel as host overhead.
``bench/e2e.py --section overhead --json FILE`` prints and writes it for NONE and NGRAM at
batch sizes 1, 16, 64 and 256 (median of 5 runs each).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import (
    Acceptance,
    DraftAdmission,
    DrafterContext,
    DrafterNeeds,
    DraftStep,
    DraftTree,
    StepOutcome,
    VerifyInputs,
)
from specstrat.models import AttentionBackend, LoadedModels, ModelSet, ModelShape
from specstrat.protocols import AcceptanceRule, Drafter, DrafterFactory, FutureMap, FutureMapFactory
from specstrat.relay import RelayPayload
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, timed_decode_steps

__all__ = [
    "PARTS",
    "SIZES",
    "Clock",
    "StepCost",
    "ZeroCostLM",
    "measure",
    "overhead_table",
    "per_step",
    "timed_algorithm",
]

#: The batch sizes ``bench/e2e.py --section overhead`` measures.
SIZES = (1, 16, 64, 256)

#: The parts of a decode step, in the JSON's key order; ``total_us`` is their sum.
PARTS = ("scheduler_us", "drafter_us", "acceptance_us", "metadata_us", "model_us", "total_us")


class ZeroCostLM(torch.nn.Module):
    """A :class:`~specstrat.models.CausalLM` of ``shape`` (float64, so its KV cache is) that
    returns fixed logits (always token 65) without computing anything."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        # The engine reads the KV cache's dtype and device from the first parameter.
        self.anchor = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64), requires_grad=False)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits favouring token 65 and zero hidden states, one row per token."""
        n = tokens.shape[0]
        logits = torch.zeros(n, self.shape.vocab_size, dtype=torch.float64)
        logits[:, 65] = 1.0
        return logits, torch.zeros(n, self.shape.hidden_size, dtype=torch.float64)


@dataclass(frozen=False, slots=True)
class Clock:
    """Seconds spent per part, counted only while a decode step runs (the
    :class:`~specstrat.runtime.StepTimer` the engine's decode steps report to)."""

    decoding: bool = False
    active: str | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, adding its wall time to ``part`` when called inside a decode step and
        outside any other timed part (a drafter's own model forwards are the drafter's)."""

        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.decoding or self.active is not None:
                return fn(*args, **kwargs)
            start, self.active = time.perf_counter(), part
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.active = None

        return run


@dataclass(frozen=True, slots=True)
class _TimedDrafter:
    inner: Drafter[Any]
    clock: Clock

    def admit(self, admission: DraftAdmission[Any]) -> RelayPayload:
        return self.inner.admit(admission)

    def release(self, slots: Sequence[int]) -> None:
        self.inner.release(slots)

    def propose(self, step: DraftStep) -> DraftTree:
        result: DraftTree = self.clock.timed("drafter_us", self.inner.propose)(step)
        return result

    def commit(self, outcome: StepOutcome) -> RelayPayload:
        result: RelayPayload = self.clock.timed("drafter_us", self.inner.commit)(outcome)
        return result


@dataclass(frozen=True, slots=True)
class _TimedFactory:
    inner: DrafterFactory[Any]
    clock: Clock

    @property
    def needs(self) -> DrafterNeeds:
        return self.inner.needs

    def create_drafter(self, context: DrafterContext) -> _TimedDrafter:
        return _TimedDrafter(self.inner.create_drafter(context), self.clock)

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        return self.inner.prefill_payload(models, bonus_tokens, hidden)


@dataclass(frozen=True, slots=True)
class _TimedRelay:
    inner: FutureMap
    clock: Clock

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.clock.timed("metadata_us", self.inner.publish)(slots, new_seq_lens)

    def stash(self, slots: torch.Tensor, payload: RelayPayload) -> None:
        self.clock.timed("metadata_us", self.inner.stash)(slots, payload)

    def resolve(self, slots: torch.Tensor) -> RelayPayload:
        result: RelayPayload = self.clock.timed("metadata_us", self.inner.resolve)(slots)
        return result


@dataclass(frozen=True, slots=True)
class _TimedRelayFactory:
    inner: FutureMapFactory
    clock: Clock

    def create_future_map(
        self,
        max_running_requests: int,
        chunked_prefill_size: int,
        context_len: int,
        device: torch.device,
    ) -> FutureMap:
        relay = self.inner.create_future_map(
            max_running_requests, chunked_prefill_size, context_len, device
        )
        return _TimedRelay(relay, self.clock)


@dataclass(frozen=True, slots=True)
class _TimedRule:
    inner: AcceptanceRule
    clock: Clock

    @property
    def lossless(self) -> bool:
        return self.inner.lossless

    def accept(self, inputs: VerifyInputs) -> Acceptance:
        result: Acceptance = self.clock.timed("acceptance_us", self.inner.accept)(inputs)
        return result


def timed_algorithm(algo: SpecAlgorithm[Any], clock: Clock) -> SpecAlgorithm[Any]:
    """``algo`` with its drafter, acceptance rule and relay reporting to ``clock``."""
    return replace(
        algo,
        drafter=_TimedFactory(algo.drafter, clock),
        acceptance=_TimedRule(algo.acceptance, clock),
        future_map=_TimedRelayFactory(algo.future_map, clock),
    )


def per_step(clock: Clock, steps: int) -> dict[str, float]:
    """``clock``'s seconds as microseconds per decode step (``steps`` of them), by part of
    :data:`PARTS`: ``scheduler_us`` is what the step's wall time leaves after the others."""
    per = {k: v / max(steps, 1) * 1e6 for k, v in clock.seconds.items()}
    inner = per["drafter_us"] + per["acceptance_us"] + per["metadata_us"] + per["model_us"]
    per["scheduler_us"] = per["total_us"] - inner
    return per


@dataclass(frozen=True, slots=True)
class StepCost:
    """Microseconds per decode step, by part (:data:`PARTS`), median over the runs."""

    parts: dict[str, float]

    def as_json(self) -> dict[str, float]:
        """The parts by name, rounded to 0.1 µs."""
        return {k: round(self.parts[k], 1) for k in PARTS}


def measure(
    algo: SpecAlgorithm[Any],
    bs: int,
    *,
    runs: int = 5,
    new_tokens: int = 64,
    models: EmbeddedModels | None = None,
) -> StepCost:
    """The host cost per decode step of ``algo`` at batch size ``bs`` on a zero-cost target,
    median of ``runs`` runs (sync mode, every request admitted at once)."""
    base = models or EmbeddedModels.load()
    fake = ModelSet(target=ZeroCostLM(base.target.shape), draft=base.draft, head=base.head)
    config = EngineConfig(
        context_len=512, max_running_requests=bs, overlap=False, graph_buckets=(1, 16, 64, 256)
    )
    samples: list[dict[str, float]] = []
    for _ in range(runs):
        clock = Clock()
        engine = Engine(timed_algorithm(algo, clock), fake, config)
        requests = [Request(f"r{i}", (65, 66, 67), new_tokens) for i in range(bs)]
        with timed_decode_steps(clock):
            engine.run(requests)
        samples.append(per_step(clock, engine.stats.decode_steps))
    return StepCost({k: statistics.median(s[k] for s in samples) for k in PARTS})


def overhead_table(
    algos: Sequence[SpecAlgorithm[Any]], sizes: Sequence[int], *, runs: int = 5
) -> dict[str, dict[str, dict[str, float]]]:
    """``{algorithm: {bs: {part: µs}}}`` for every algorithm and batch size."""
    models = EmbeddedModels.load()
    return {
        algo.name: {str(bs): measure(algo, bs, runs=runs, models=models).as_json() for bs in sizes}
        for algo in algos
    }
