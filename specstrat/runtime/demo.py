"""The main job: one algorithm against target-only decoding on the embedded models.

Both runs decode the same workload (prompts cut from the Python standard library's source, which
every machine has); the summary reports mean acceptance length, tokens/s of each, their ratio,
and whether speculation was lossless (token-for-token equal to target-only greedy output).
"""

from __future__ import annotations

import random
import sys
import sysconfig
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch
from tqdm import tqdm

from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.registry import get
from specstrat.runtime.engine import Engine
from specstrat.runtime.models.text import encode_indentation
from specstrat.runtime.models.weights import EmbeddedModels
from specstrat.runtime.requests import EngineConfig, Request

__all__ = ["DemoSummary", "ProgressBar", "run_demo", "workload"]

#: Stdlib files the prompts come from (not among the training files).
PROMPT_FILES = ("json/__init__.py", "glob.py", "fnmatch.py", "keyword.py", "colorsys.py", "this.py")


#: Every ``STOP_EVERY``-th request asks to finish the line it is on: it stops at a newline.
STOP_EVERY = 4
NEWLINE = 10


def workload(
    num_requests: int, *, seed: int = 0, stops: bool = True, sampling: SamplingParams = GREEDY
) -> list[Request]:
    """``num_requests`` prompts of 24..160 bytes, each asking for 48..128 tokens; with ``stops``,
    every fourth one stops at the first newline it generates; request ``i`` samples with
    ``sampling`` and seed ``sampling.seed + i``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    # Encoded like the training text (see specstrat.runtime.models.text.encode_indentation).
    texts = [
        encode_indentation((root / f).read_bytes()) for f in PROMPT_FILES if (root / f).is_file()
    ]
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        text = texts[i % len(texts)]
        length = rng.randint(24, 160)
        start = rng.randrange(0, max(1, len(text) - length))
        start = text.rfind(b"\n", 0, start) + 1  # begin at a line start
        prompt = text[start : start + length] or b"def "
        stop = frozenset({NEWLINE}) if stops and i % STOP_EVERY == STOP_EVERY - 1 else frozenset()
        params = replace(sampling, seed=(sampling.seed + i) % 2**63)
        requests.append(Request(f"req-{i}", tuple(prompt), rng.randint(48, 128), stop, params))
    return requests


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The demo's figures. ``topk``/``num_steps``: the draft tree (topk 1 is a chain);
    ``draft_worker_verify_forwards``: TARGET_VERIFY forwards the draft worker ran (a block
    drafter's); ``draft_worker_tokens_per_req``: their ``T_draft`` (0: none)."""

    algorithm: str
    overlap: bool
    disagg: bool
    num_draft_tokens: int
    requests: int
    tokens: int
    acceptance_length: float
    spec_tokens_per_s: float
    target_tokens_per_s: float
    speed_ratio: float
    lossless: bool
    acceptance_by_position: tuple[float, ...]
    acceptance_rule_lossless: bool
    temperature: float
    lossless_check: str
    topk: int
    num_steps: int
    draft_worker_verify_forwards: int = 0
    draft_worker_tokens_per_req: int = 0

    def _setup(self) -> str:
        parts = [f"D={self.num_draft_tokens}", f"overlap {'on' if self.overlap else 'off'}"]
        if self.topk > 1:
            parts.append(f"tree topk {self.topk}, {self.num_steps} steps")
        if self.temperature:
            parts.append(f"temperature {self.temperature:g}")
        if self.disagg:
            parts.append("prefill/decode in 2 processes")
        return f"{self.algorithm} ({', '.join(parts)})"

    def table(self) -> str:
        """The summary as aligned text."""
        rows = [
            ("algorithm", self._setup()),
            ("requests", str(self.requests)),
            ("tokens", str(self.tokens)),
            ("mean acceptance length", f"{self.acceptance_length:.2f}"),
            (
                "accepted by position",
                " ".join(f"{r:.2f}" for r in self.acceptance_by_position) or "-",
            ),
            ("tokens/s with speculation", f"{self.spec_tokens_per_s:.1f}"),
            ("tokens/s target-only", f"{self.target_tokens_per_s:.1f}"),
            ("speed ratio", f"{self.speed_ratio:.2f}x"),
            ("lossless", f"{'yes' if self.lossless else 'no'} ({self.lossless_check})"),
        ]
        if self.draft_worker_verify_forwards:
            forwards = f"{self.draft_worker_verify_forwards} forwards"
            rows.insert(
                -1, ("draft-worker verify", f"{forwards}, T={self.draft_worker_tokens_per_req}")
            )
        return "\n".join(f"{k:<26} {v}" for k, v in rows)

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values."""
        return asdict(self)


class ProgressBar:
    """A progress bar on stderr (tqdm), advanced to the number of finished requests."""

    def __init__(self, label: str, *, stream: Any = None) -> None:
        self.bar = tqdm(
            desc=f"{label:<24}", unit="req", file=stream if stream is not None else sys.stderr,
            leave=True, dynamic_ncols=True,
        )  # fmt: skip

    def __call__(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` requests."""
        if self.bar.total != total:
            self.bar.total = total
        if done != self.bar.n:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        """End the bar's line."""
        self.bar.close()


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
) -> tuple[DemoSummary, dict[str, list[int]]]:
    """Run the workload with ``algo`` and target-only; the summary and the spec outputs.

    Both engines are built (and their configuration checked) before either runs. With
    ``disagg`` the speculative run prefills in a second process and decodes here
    (:func:`~specstrat.runtime.disagg.run_disaggregated`). Greedy: lossless compares the outputs
    token for token with target-only's. Sampling (``sampling.temperature > 0``): outputs differ
    by design; a lossless rule is checked in distribution
    (:func:`~specstrat.testing.check_lossless_in_distribution`), a lossy one says so.
    """
    spec_algo = get(algo) if isinstance(algo, str) else algo
    models = models or EmbeddedModels.load()
    requests = workload(num_requests, sampling=sampling)
    config = EngineConfig(num_draft_tokens=num_draft_tokens, overlap=overlap, context_len=512)
    baseline = Engine(get("NONE"), models, config)
    spec = Engine(spec_algo, models, config)  # checks D against the context before any run
    torch.manual_seed(0)
    base_out = _timed(baseline, requests, "target-only", progress)
    if disagg:
        from specstrat.runtime.disagg import run_disaggregated  # spawns a process

        bar = ProgressBar(spec_algo.name) if progress else None
        try:
            result = run_disaggregated(spec_algo, requests, config, models=models, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        spec_stats, spec_out = result.stats, result.outputs
    else:
        spec_out = _timed(spec, requests, spec_algo.name, progress, trace)
        spec_stats = spec.stats
    lossless, note = _lossless(spec_algo, spec_out == base_out, sampling, models, num_draft_tokens)
    base_stats = baseline.stats
    summary = DemoSummary(
        algorithm=spec_algo.name,
        overlap=overlap,
        disagg=disagg,
        num_draft_tokens=num_draft_tokens,
        requests=len(requests),
        tokens=spec_stats.generated_tokens,
        acceptance_length=spec_stats.acceptance_length,
        spec_tokens_per_s=spec_stats.tokens_per_second,
        target_tokens_per_s=base_stats.tokens_per_second,
        speed_ratio=spec_stats.tokens_per_second / max(base_stats.tokens_per_second, 1e-9),
        lossless=lossless,
        acceptance_by_position=tuple(spec_stats.acceptance_by_position),
        acceptance_rule_lossless=spec_algo.lossless,
        temperature=sampling.temperature,
        lossless_check=note,
        topk=spec.tree.topk,
        num_steps=spec.tree.num_steps,
        draft_worker_verify_forwards=spec_stats.draft_worker_verify_forwards,
        draft_worker_tokens_per_req=spec_stats.draft_worker_tokens_per_req,
    )
    return summary, spec_out


def _lossless(
    algo: SpecAlgorithm[Any],
    same_tokens: bool,
    sampling: SamplingParams,
    models: EmbeddedModels,
    num_draft_tokens: int,
) -> tuple[bool, str]:
    """Whether the run was lossless, and how that was established."""
    rule = type(algo.acceptance).__name__
    if not algo.lossless:
        return False, f"rule {rule} is lossy"
    if sampling.greedy:
        return same_tokens, "token for token against target-only"
    from specstrat.errors import ConformanceError
    from specstrat.testing.lossless import check_lossless_in_distribution

    try:
        report = check_lossless_in_distribution(
            algo, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            num_samples=2000, num_draft_tokens=num_draft_tokens, models=models,
        )  # fmt: skip
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
