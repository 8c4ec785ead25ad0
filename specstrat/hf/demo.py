"""The demo on a Hugging Face model: one algorithm against target-only decoding on the
code-editing workload, both checked against transformers' own greedy ``generate``.

Greedy runs are lossless when the speculative outputs equal target-only's and target-only's
equal ``generate``'s, token for token, except at certified numerical ties
(:mod:`specstrat.hf.reference`). Both sides run on the same torch thread count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, TextIO

from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.hf.loader import HFModels
from specstrat.hf.process import HFLoader
from specstrat.hf.reference import ReferenceCheck, compare, generate_reference
from specstrat.hf.workload import code_prompts
from specstrat.runtime.demo import DemoSummary, run_comparison
from specstrat.runtime.requests import EngineConfig, Request

__all__ = ["HFDemo", "code_requests", "run_hf_demo"]


def code_requests(
    models: HFModels, num_requests: int, max_new_tokens: int, sampling: SamplingParams = GREEDY
) -> list[Request]:
    """The code-editing workload as requests: chat messages through the tokenizer's template
    when it has one, else plain text; request ``i`` samples with seed ``sampling.seed + i``."""
    chat = getattr(models.tokenizer, "chat_template", None) is not None
    out = []
    for i, (name, text) in enumerate(code_prompts(num_requests)):
        params = replace(sampling, seed=(sampling.seed + i) % 2**63)
        if chat:
            messages = [{"role": "user", "content": text}]
            out.append(models.request(name, max_new_tokens, messages=messages, sampling=params))
        else:
            out.append(models.request(name, max_new_tokens, text=text, sampling=params))
    return out


@dataclass(frozen=True, slots=True)
class HFDemo:
    """The demo's summary plus what only a Hugging Face model has: the check of target-only
    against transformers' ``generate`` (``reference``; None when sampling), transformers'
    tokens/s on the same requests, and one decoded sample."""

    summary: DemoSummary
    reference: ReferenceCheck | None
    generate_tokens_per_s: float
    sample: str

    def lines(self) -> list[str]:
        """Comparison and sample lines for the console."""
        out = []
        if self.reference is not None:
            out.append(f"target-only vs transformers generate: {self.reference.line()}")
            ratio = self.summary.target_tokens_per_s / max(self.generate_tokens_per_s, 1e-9)
            out.append(
                f"tokens/s transformers generate {self.generate_tokens_per_s:.1f}; "
                f"specstrat target-only / generate {ratio:.2f}x, "
                f"{self.summary.algorithm} / generate "
                f"{self.summary.spec_tokens_per_s / max(self.generate_tokens_per_s, 1e-9):.2f}x"
            )
        out.append(f"sample ({self.summary.requests[0].rid}): {self.sample!r}")
        return out


def run_hf_demo(
    models: HFModels,
    algo: SpecAlgorithm[Any] | str,
    *,
    overlap: bool = True,
    num_requests: int = 8,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 64,
    context_len: int | None = None,
    max_running_requests: int = 16,
    compare_requests: int = 4,
    progress: bool = True,
    trace: TextIO | None = None,
    sampling: SamplingParams = GREEDY,
    disagg: bool = False,
) -> HFDemo:
    """Run the code-editing workload with ``algo`` and target-only on ``models``.

    ``context_len`` defaults to the longest prompt plus ``max_new_tokens`` plus what a step may
    reserve past them (``2 * (D + 1)``; a top-k tree's columns), not the model's
    ``max_position_embeddings`` (whose KV cache at float32 could take gigabytes). Greedy: the
    first ``compare_requests`` requests also run through transformers' ``generate``. With
    ``disagg`` the speculative run prefills in a second process, which loads the same model
    (:class:`~specstrat.hf.process.HFLoader`).
    """
    requests = code_requests(models, num_requests, max_new_tokens, sampling)
    if context_len is None:
        tree = _algorithm(algo).tree  # a top-k tree's draft columns (a chain has none)
        columns = int(getattr(tree, "topk", 0)) * int(getattr(tree, "num_steps", 0))
        longest = max(len(r.prompt) for r in requests)
        context_len = longest + max_new_tokens + 2 * (num_draft_tokens + 1) + columns
    config = EngineConfig(
        num_draft_tokens=num_draft_tokens,
        overlap=overlap,
        context_len=context_len,
        max_running_requests=max_running_requests,
    )
    run = run_comparison(
        algo, models, requests, config, progress=progress, trace=trace, sampling=sampling,
        model_name=models.source, disagg=disagg, loader=HFLoader(models.source) if disagg else None,
    )  # fmt: skip
    summary = run.summary
    reference = None
    generate_tps = 0.0
    if sampling.greedy:
        lm = models.target
        subset = requests[: max(1, compare_requests)]
        start = time.perf_counter()
        want = generate_reference(lm, subset, pad_token_id=_pad(models))
        seconds = time.perf_counter() - start
        generate_tps = sum(len(v) for v in want.values()) / max(seconds, 1e-9)
        reference = compare(lm, subset, run.target_outputs, want)
        spec_check = compare(lm, requests, run.spec_outputs, run.target_outputs)
        lossless = spec_check.lossless and reference.lossless and summary.acceptance_rule_lossless
        note = (
            f"against target-only: {spec_check.line()}; target-only against transformers "
            f"generate: {reference.line()}"
        )
        summary = replace(
            summary, lossless=lossless, lossless_check=note, ties=spec_check.ties + reference.ties
        )
    first = run.spec_outputs.get(requests[0].rid, [])
    return HFDemo(summary, reference, generate_tps, models.decode(first))


def _pad(models: HFModels) -> int | None:
    pad = getattr(models.tokenizer, "pad_token_id", None)
    return pad if isinstance(pad, int) else None


def _algorithm(algo: SpecAlgorithm[Any] | str) -> SpecAlgorithm[Any]:
    from specstrat.registry import get

    if isinstance(algo, str):
        return get(algo)
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(f"algo={algo!r}; pass a SpecAlgorithm or a registered name")
    return algo

