"""A statistical check that an algorithm is lossless *in distribution* under sampling.

The first generated token comes from prefill, the second from the first speculative step. For a
fixed prompt, the exact joint distribution of the first two tokens is the target's own:
``P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1)`` (after temperature, top-k and top-p),
computed from the target's probabilities with one batched forward. The check runs the algorithm
on ``num_samples`` copies of the prompt, each with its own seed (derived from the master
``seed``, so the check is deterministic), and compares the observed pairs with that
distribution by a chi-square test: pairs expected fewer than five times are pooled into one
bin. A rule that keeps the target's distribution passes at the stated significance; a biased
one (that accepts every draft, or samples from ``p`` instead of the residual on rejection)
fails at the default sample size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import SamplingParams
from specstrat.errors import ConformanceError, InvalidConfig
from specstrat.models import LoadedModels
from specstrat.sampling import SamplingBatch

__all__ = ["LosslessReport", "check_lossless_in_distribution"]

#: A fixed prompt from the embedded models' domain (Python source) whose end repeats earlier
#: text, so prompt lookup drafts too.
DEFAULT_PROMPT = tuple(b"x = parse(text, 1)\ny = parse(text, 2)\nz = parse(")


@dataclass(frozen=True, slots=True, kw_only=True)
class LosslessReport:
    """What the check measured: the chi-square statistic, its degrees of freedom and p-value,
    the total-variation distance between observed and exact pair frequencies, the samples, and
    the algorithm's mean acceptance length under these parameters."""

    algorithm: str
    statistic: float
    dof: int
    p_value: float
    total_variation: float
    num_samples: int
    acceptance_length: float
    significance: float


def _exact_pairs(
    models: LoadedModels, prompt: tuple[int, ...], params: SamplingParams
) -> torch.Tensor:
    """``P(t1, t2)`` ``[V, V]`` under the target and ``params`` (float64)."""
    from specstrat.runtime import ForwardMode, ModelWorker  # the runtime runs the target

    vocab = models.target.shape.vocab_size
    sampling = SamplingBatch.of([params])
    worker = ModelWorker(
        models.target,
        max_running_requests=vocab + 1,
        context_len=len(prompt) + 2,
        max_total_tokens=(vocab + 1) * (len(prompt) + 1),
    )
    slot = worker.alloc_request()
    logits, _ = worker.forward(ForwardMode.EXTEND, [slot], [list(prompt)])
    p1 = sampling.probs(logits[-1:].to(torch.float64))[0]
    firsts = p1.nonzero().flatten().tolist()
    slots = [worker.alloc_request() for _ in firsts]
    rows = [[*prompt, t] for t in firsts]
    logits, _ = worker.forward(ForwardMode.EXTEND, slots, rows)
    ends = torch.tensor([len(r) for r in rows]).cumsum(0) - 1
    p2 = SamplingBatch.of([params] * len(firsts)).probs(logits[ends].to(torch.float64))
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    joint[firsts] = p1[firsts, None] * p2
    return joint


def _chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float] | None:
    """Pearson's statistic over bins expected at least 5 times (the rest pooled), its degrees
    of freedom and upper-tail p-value; ``None`` when fewer than two bins remain."""
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    if int(keep.sum()) < 2:
        return None
    obs, exp = obs[keep], exp[keep]
    statistic = float(((obs - exp) ** 2 / exp).sum())
    dof = int(keep.sum()) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))
    return statistic, dof, p_value


def check_lossless_in_distribution(
    algo: SpecAlgorithm[Any],
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    num_samples: int = 4000,
    seed: int = 0,
    num_draft_tokens: int = 4,
    significance: float = 1e-3,
    prompt: tuple[int, ...] = DEFAULT_PROMPT,
    models: LoadedModels | None = None,
    overlap: bool = False,
) -> LosslessReport:
    """Sample the first two tokens ``num_samples`` times with ``algo`` and test them against the
    target's exact joint distribution; raises :class:`~specstrat.errors.ConformanceError` with
    the statistic when the p-value falls below ``significance``, returns the report otherwise.
    """
    from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request

    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 100:
        raise InvalidConfig(f"num_samples={num_samples!r} must be an int >= 100")
    if (
        isinstance(significance, bool)
        or not isinstance(significance, int | float)
        or not 0 < significance < 1
    ):
        raise InvalidConfig(f"significance={significance!r} must be a number in (0, 1)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        raise InvalidConfig(f"seed={seed!r} must be an int in -2**63..2**63-1")
    base = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=0)
    loaded: LoadedModels = models or EmbeddedModels.load()
    vocab = loaded.target.shape.vocab_size
    if not prompt or any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
        raise InvalidConfig(
            f"prompt={prompt!r} must be a non-empty tuple of token ids in 0..{vocab - 1}"
        )
    joint = _exact_pairs(loaded, prompt, base)
    master = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (num_samples,), generator=master).tolist()
    requests = [
        Request(f"s{i}", prompt, 2, sampling=replace(base, seed=s)) for i, s in enumerate(seeds)
    ]
    config = EngineConfig(
        num_draft_tokens=num_draft_tokens,
        context_len=max(64, 2 * len(prompt)),
        max_running_requests=64,
        overlap=overlap,
    )
    engine = Engine(algo, loaded, config)
    outputs = engine.run(requests)
    observed = torch.zeros(vocab * vocab, dtype=torch.float64)
    pairs = torch.tensor([outputs[r.rid][0] * vocab + outputs[r.rid][1] for r in requests])
    observed.index_add_(0, pairs, torch.ones(len(requests), dtype=torch.float64))
    # Two tests, each at half the significance: the joint of (t1, t2), and the marginal of t2
    # (which keeps its power when the joint is too spread out to bin).
    tests = [
        _chi_square(observed, joint.flatten() * num_samples),
        _chi_square(observed.view(vocab, vocab).sum(0), joint.sum(0) * num_samples),
    ]
    usable = [t for t in tests if t is not None]
    if not usable:
        raise InvalidConfig(
            f"num_samples={num_samples} is too few for this distribution: no two outcomes are "
            "expected 5 times each; raise num_samples"
        )
    statistic, dof, p_value = min(usable, key=lambda t: t[2])
    p_value = min(1.0, p_value * len(usable))  # Bonferroni over the tests that ran
    report = LosslessReport(
        algorithm=algo.name,
        statistic=statistic,
        dof=dof,
        p_value=p_value,
        total_variation=0.5 * float((observed / num_samples - joint.flatten()).abs().sum()),
        num_samples=num_samples,
        acceptance_length=engine.stats.acceptance_length,
        significance=significance,
    )
    if not p_value >= significance or math.isnan(p_value):
        raise ConformanceError(
            f"{algo.name} is not lossless in distribution at temperature={temperature}, "
            f"top_p={top_p}, top_k={top_k}: chi-square={statistic:.1f} with {dof} degrees of "
            f"freedom, p={p_value:.2e} < {significance} over {num_samples} samples "
            f"(total variation {report.total_variation:.3f})"
        )
    return report
