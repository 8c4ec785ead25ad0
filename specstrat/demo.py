"""The main job: one algorithm against target-only decoding.

Both runs decode the same workload: by default prompts cut from the Python standard library's
source (which every machine has) on the embedded models, or any requests on any loaded models
(:func:`run_comparison`; ``specstrat demo --model`` passes a Hugging Face model's). The summary
reports τ, acceptance by position (unconditional and conditional; ``docs/glossary.md`` names and
defines them), tokens/s of each, their ratio, and whether speculation was lossless
(token-for-token equal to target-only greedy output).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

import torch
from tqdm import tqdm

from specstrat._demo_summary import DemoSummary as DemoSummary
from specstrat._demo_summary import RequestRecord as RequestRecord
from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.models import LoadedModels
from specstrat.registry import get
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request, RunStats
from specstrat.runtime import workload as workload
from specstrat.timing import Contender, Timings, interleaved, ratio

if TYPE_CHECKING:
    from specstrat.runtime import ModelLoader

__all__ = [
    "DemoRun",
    "DemoSummary",
    "ProgressBar",
    "RequestRecord",
    "run_comparison",
    "run_demo",
    "workload",
]


class ProgressBar:
    """A progress bar on stderr (tqdm), advanced to the number of finished requests."""

    def __init__(self, label: str, *, stream: Any = None) -> None:
        self.bar = tqdm(
            desc=f"{label:<24}",
            unit="req",
            file=stream if stream is not None else sys.stderr,
            leave=True,
            dynamic_ncols=True,
        )

    def __call__(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` requests."""
        if self.bar.total != total:
            self.bar.total = total
        if done != self.bar.n:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        """End the bar's line."""
        self.bar.close()


@dataclass(frozen=True, slots=True)
class DemoRun:
    """A demo run: its summary, both runs' outputs by request id (the first round's), and
    whether every round of each side gave the same outputs as its first."""

    summary: DemoSummary
    spec_outputs: dict[str, list[int]]
    target_outputs: dict[str, list[int]]
    rounds_agree: bool = True


def run_demo(
    algo: SpecAlgorithm[Any] | str = "EAGLE",
    *,
    overlap: bool = True,
    num_requests: int = 16,
    num_draft_tokens: int = 4,
    progress: bool = True,
    models: EmbeddedModels | None = None,
    disagg: bool = False,
    trace: TextIO | None = None,
    sampling: SamplingParams = GREEDY,
    max_new_tokens: int | None = None,
    context_len: int = 512,
    max_running_requests: int = 16,
    prompts: Sequence[str] = (),
    rounds: int = 1,
) -> tuple[DemoSummary, dict[str, list[int]]]:
    """Run the embedded workload with ``algo`` and target-only; the summary and spec outputs.

    The workload is :func:`workload` (``num_requests`` prompts), or one request per text of
    ``prompts`` (:meth:`Request.from_text`, no stop token); ``max_new_tokens`` replaces each
    request's budget. ``context_len`` and ``max_running_requests`` go to the engines; see
    :func:`run_comparison` for the rest.
    """
    config = EngineConfig(
        num_draft_tokens=num_draft_tokens,
        overlap=overlap,
        context_len=context_len,
        max_running_requests=max_running_requests,
    )
    if prompts:
        budget = max_new_tokens or 64
        requests = [
            Request.from_text(
                f"prompt-{i}",
                text,
                budget,
                sampling=replace(sampling, seed=(sampling.seed + i) % 2**63),
            )
            for i, text in enumerate(prompts)
        ]
    else:
        requests = workload(num_requests, sampling=sampling)
        if max_new_tokens is not None:
            requests = [replace(r, max_new_tokens=max_new_tokens) for r in requests]
    run = run_comparison(
        algo,
        models or EmbeddedModels.load(),
        requests,
        config,
        progress=progress,
        disagg=disagg,
        trace=trace,
        sampling=sampling,
        rounds=rounds,
    )
    return run.summary, run.spec_outputs


def run_comparison(
    algo: SpecAlgorithm[Any] | str,
    models: LoadedModels,
    requests: list[Request],
    config: EngineConfig,
    *,
    progress: bool = True,
    disagg: bool = False,
    trace: TextIO | None = None,
    sampling: SamplingParams = GREEDY,
    model_name: str = "embedded",
    loader: ModelLoader | None = None,
    rounds: int = 1,
) -> DemoRun:
    """Run ``requests`` with ``algo`` and with target-only decoding on ``models``, ``rounds``
    interleaved rounds of each (target-only first in each round, each on a fresh engine).

    Both engines are built (and their configuration checked) before either runs. With
    ``disagg`` the speculative run prefills in a second process and decodes here
    (:func:`~specstrat.runtime.run_disaggregated`; models other than the embedded ones
    need the ``loader`` that process calls to load them). Greedy: lossless compares the outputs
    token for token with target-only's. Sampling (``sampling.temperature > 0``): outputs differ
    by design; a lossless rule is checked in distribution
    (:func:`~specstrat.lossless.check_lossless_in_distribution`), a lossy one says so.
    """
    spec_algo = get(algo) if isinstance(algo, str) else algo
    if disagg and loader is None and not isinstance(models, EmbeddedModels):
        raise InvalidConfig(
            f"disagg=True with models={type(models).__name__} and no loader: the prefill "
            "process loads the embedded models unless given a loader for these"
        )
    engines = {  # both built, so both configurations are checked, before either runs
        "target-only": Engine(get("NONE"), models, config),
        "speculative": Engine(spec_algo, models, config),
    }
    tree = engines["speculative"].tree
    torch.manual_seed(0)
    stats: list[RunStats] = [engines["speculative"].stats]
    traced = [trace]  # the first speculative round writes the trace; later rounds repeat it

    def fresh(name: str, algorithm: SpecAlgorithm[Any]) -> None:
        """Each round on a new engine: every round starts alike and counts only itself."""
        if engines[name].stats.generated_tokens:
            del engines[name]
            gc.collect()  # a used engine's KV goes before the next one's is allocated
            engines[name] = Engine(algorithm, models, config)

    def speculative() -> dict[str, list[int]]:
        if not disagg:
            out = _timed(engines["speculative"], requests, spec_algo.name, progress, traced[0])
            stats[0], traced[0] = engines["speculative"].stats, None
            return out
        from specstrat.runtime import run_disaggregated  # spawns a process

        bar = ProgressBar(spec_algo.name) if progress else None
        try:
            result = run_disaggregated(
                spec_algo, requests, config, models=models, progress=bar, loader=loader
            )
        finally:
            if bar is not None:
                bar.close()
        stats[0] = result.stats
        return result.outputs

    def target_only() -> dict[str, list[int]]:
        return _timed(engines["target-only"], requests, "target-only", progress)

    # Interleaved rounds, target-only first in each, through the bench's timing core.
    timings = interleaved(
        [
            Contender("target-only", target_only, lambda: fresh("target-only", get("NONE"))),
            Contender("speculative", speculative, lambda: fresh("speculative", spec_algo)),
        ],
        rounds=rounds,
        warmup=0,
    )
    base_out, spec_out = timings["target-only"].outputs, timings["speculative"].outputs
    spec_stats = stats[0]
    d = config.num_draft_tokens
    agree = _rounds_agree(timings)
    lossless, note = _lossless(spec_algo, agree and spec_out == base_out, sampling, models, d)
    speed = ratio(timings, "speculative", "target-only")
    summary = DemoSummary(
        algorithm=spec_algo.name,
        overlap=config.overlap,
        disagg=disagg,
        num_draft_tokens=d,
        requests=tuple(
            RequestRecord(r.rid, tuple(r.prompt), tuple(spec_out.get(r.rid, ()))) for r in requests
        ),
        num_requests=len(requests),
        tokens=spec_stats.generated_tokens,
        acceptance_length=spec_stats.acceptance_length,
        spec_tokens_per_s=timings["speculative"].tokens_per_s,
        target_tokens_per_s=timings["target-only"].tokens_per_s,
        speed_ratio=speed.median,
        speed_ratio_min=min(speed.per_round),
        speed_ratio_max=max(speed.per_round),
        rounds=rounds,
        lossless=lossless,
        acceptance_by_position=tuple(spec_stats.acceptance_by_position),
        acceptance_conditional=tuple(spec_stats.acceptance_conditional),
        acceptance_rule_lossless=spec_algo.lossless,
        temperature=sampling.temperature,
        lossless_check=note,
        topk=tree.topk,
        num_steps=tree.num_steps,
        draft_worker_verify_forwards=spec_stats.draft_worker_verify_forwards,
        draft_worker_tokens_per_req=spec_stats.draft_worker_tokens_per_req,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        model=model_name,
        verified_per_step=spec_stats.verified_per_step,
        max_running_requests=config.max_running_requests,
        context_len=config.context_len,
        width_histogram={str(w): n for w, n in spec_stats.width_histogram.items()},
        plain_step_share=spec_stats.plain_step_share,
    )
    return DemoRun(summary, spec_out, base_out, rounds_agree=agree)


def _rounds_agree(timings: Mapping[str, Timings]) -> bool:
    """Whether each contender's counted rounds all gave its first round's outputs."""
    return all(all(out == t.outputs for out in t.round_outputs) for t in timings.values())


def _lossless(
    algo: SpecAlgorithm[Any],
    same_tokens: bool,
    sampling: SamplingParams,
    models: LoadedModels,
    num_draft_tokens: int,
) -> tuple[bool, str]:
    """Whether the run was lossless, and how that was established."""
    rule = type(algo.acceptance).__name__
    if not algo.lossless:
        return False, f"rule {rule} is lossy"
    if sampling.greedy:
        return same_tokens, "token for token against target-only"
    from specstrat.errors import ConformanceError
    from specstrat.lossless import check_lossless_in_distribution

    try:
        report = check_lossless_in_distribution(
            algo,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            num_samples=2000,
            num_draft_tokens=num_draft_tokens,
            models=models,
        )
    except ConformanceError as exc:
        return False, f"in distribution: {exc}"
    return True, (
        f"in distribution, checked: chi-square p={report.p_value:.3f} over "
        f"{report.num_samples} samples"
    )


def _timed(
    engine: Engine,
    requests: list[Request],
    label: str,
    progress: bool,
    trace: TextIO | None = None,
) -> dict[str, list[int]]:
    bar = ProgressBar(label) if progress else None
    try:
        return engine.run(requests, progress=bar, trace=trace)
    finally:
        if bar is not None:
            bar.close()
