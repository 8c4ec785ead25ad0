"""The main job: one algorithm against target-only decoding on the embedded models.

Both runs decode the same workload (prompts cut from the Python standard library's source, which
every machine has); the summary reports mean acceptance length, tokens/s of each, their ratio,
and whether speculation was lossless (token-for-token equal to target-only greedy output).
"""

from __future__ import annotations

import random
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.registry import get
from specstrat.runtime.engine import Engine
from specstrat.runtime.requests import EngineConfig, Request
from specstrat.runtime.text import encode_indentation
from specstrat.runtime.weights import EmbeddedModels

__all__ = ["DemoSummary", "ProgressBar", "run_demo", "workload"]

#: Stdlib files the prompts come from (not among the training files).
PROMPT_FILES = ("json/__init__.py", "glob.py", "fnmatch.py", "keyword.py", "colorsys.py", "this.py")


def workload(num_requests: int, *, seed: int = 0) -> list[Request]:
    """``num_requests`` prompts of 24..160 bytes, each asking for 48..128 tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    # Encoded like the training text (see specstrat.runtime.text.encode_indentation).
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
        requests.append(Request(f"req-{i}", tuple(prompt), rng.randint(48, 128)))
    return requests


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The demo's figures."""

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

    def _setup(self) -> str:
        parts = [f"D={self.num_draft_tokens}", f"overlap {'on' if self.overlap else 'off'}"]
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
            ("tokens/s with speculation", f"{self.spec_tokens_per_s:.1f}"),
            ("tokens/s target-only", f"{self.target_tokens_per_s:.1f}"),
            ("speed ratio", f"{self.speed_ratio:.2f}x"),
            ("lossless", "yes" if self.lossless else "no"),
        ]
        return "\n".join(f"{k:<26} {v}" for k, v in rows)

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values."""
        return asdict(self)


class ProgressBar:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, *, width: int = 30, stream: Any = None) -> None:
        self.label, self.width = label, width
        self.stream = stream if stream is not None else sys.stderr
        self._shown = -1

    def __call__(self, done: int, total: int) -> None:
        """Redraw for ``done`` of ``total`` requests (only when the count changed)."""
        if done == self._shown:
            return
        self._shown = done
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label:<24} [{bar}] {done}/{total}{end}")
        self.stream.flush()


def run_demo(
    algo: SpecAlgorithm[Any] | str = "EAGLE",
    *,
    overlap: bool = True,
    num_requests: int = 16,
    num_draft_tokens: int = 4,
    progress: bool = True,
    models: EmbeddedModels | None = None,
    disagg: bool = False,
) -> tuple[DemoSummary, dict[str, list[int]]]:
    """Run the workload with ``algo`` and target-only; the summary and the spec outputs.

    With ``disagg`` the speculative run prefills in a second process and decodes here
    (:func:`~specstrat.runtime.disagg.run_disaggregated`); lossless then compares it with
    single-process target-only output.
    """
    spec_algo = get(algo) if isinstance(algo, str) else algo
    models = models or EmbeddedModels.load()
    requests = workload(num_requests)
    config = EngineConfig(num_draft_tokens=num_draft_tokens, overlap=overlap, context_len=512)
    torch.manual_seed(0)
    runs = {}
    for label, chosen in (("target-only", get("NONE")), (spec_algo.name, spec_algo)):
        bar = ProgressBar(label) if progress else None
        if disagg and chosen is spec_algo:
            from specstrat.runtime.disagg import run_disaggregated  # spawns a process

            result = run_disaggregated(chosen, requests, config, models=models, progress=bar)
            runs[label] = (result.stats, result.outputs)
            continue
        engine = Engine(chosen, models, config)
        outputs = engine.run(requests, progress=bar)
        runs[label] = (engine.stats, outputs)
    base_stats, base_out = runs["target-only"]
    spec_stats, spec_out = runs[spec_algo.name]
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
        lossless=spec_out == base_out,
    )
    return summary, spec_out
