"""The demo on a Hugging Face model: one algorithm against target-only decoding on the
code-editing workload, both checked against transformers' own greedy ``generate``.

Greedy runs are lossless when the speculative outputs equal target-only's and target-only's
equal ``generate``'s, token for token, except at certified numerical ties
(:mod:`specstrat.hf.reference`). Both sides run on the same torch thread count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from specstrat.algorithm import SpecAlgorithm
from specstrat.builtins import NONE
from specstrat.demo import DemoSummary, run_comparison
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.hf.code_workload import code_prompts
from specstrat.hf.loader import HFModels
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.reference import ReferenceCheck, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, Request, kv_reservation
from specstrat.timing import Contender, interleaved

__all__ = ["HFDemo", "code_requests", "default_context_len", "prompt_requests", "run_hf_demo"]


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


def prompt_requests(
    models: HFModels, prompts: Sequence[str], max_new_tokens: int, sampling: SamplingParams = GREEDY
) -> list[Request]:
    """One request per prompt of your own (``demo --prompt``), as :func:`code_requests` builds
    them: a user turn through the chat template when the tokenizer has one."""
    chat = getattr(models.tokenizer, "chat_template", None) is not None
    out = []
    for i, text in enumerate(prompts):
        params = replace(sampling, seed=(sampling.seed + i) % 2**63)
        if chat:
            messages = [{"role": "user", "content": text}]
            out.append(
                models.request(f"prompt-{i}", max_new_tokens, messages=messages, sampling=params)
            )
        else:
            out.append(models.request(f"prompt-{i}", max_new_tokens, text=text, sampling=params))
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
    generate_requests: int = 0
    batch_size: int = 0
    target_batch1_tokens_per_s: float = 0.0

    def lines(self) -> list[str]:
        """Comparison and sample lines for the console. transformers' tokens/s is printed only
        beside specstrat's target-only on the same requests at the same batch size (1, the
        size transformers' ``generate`` runs here), in interleaved rounds; the batched run's
        figures are on their own line."""
        out = []
        if self.reference is not None:
            s = self.summary
            ours, theirs = self.target_batch1_tokens_per_s, self.generate_tokens_per_s
            out.append(f"target-only vs transformers generate: {self.reference.line()}")
            out.append(
                f"tokens/s, first {self.generate_requests} requests at batch size 1, "
                f"{_rounds(s.rounds)} interleaved: transformers generate {theirs:.1f}, "
                f"specstrat target-only {ours:.1f} "
                f"({ours / max(theirs, 1e-9):.2f}x)"
            )
            out.append(
                f"tokens/s, all {s.num_requests} requests, up to {self.batch_size} running: "
                f"specstrat target-only {s.target_tokens_per_s:.1f}, {s.algorithm} "
                f"{s.spec_tokens_per_s:.1f}"
            )
        out.append(f"sample ({self.summary.requests[0].rid}): {self.sample!r}")
        return out


def _rounds(n: int) -> str:
    return "1 round" if n == 1 else f"median of {n} rounds"


def default_context_len(
    requests: Sequence[Request], algo: SpecAlgorithm[Any] | str, num_draft_tokens: int
) -> int:
    """The smallest context that admits every request: the longest prompt plus its
    ``max_new_tokens`` plus what the engine reserves past them
    (:func:`~specstrat.runtime.kv_reservation`), not the model's ``max_position_embeddings``,
    whose KV cache at float32 could take gigabytes."""
    return kv_reservation(algo, num_draft_tokens).context_len_for(requests)


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
    prompts: Sequence[str] = (),
    rounds: int = 1,
) -> HFDemo:
    """Run the code-editing workload with ``algo`` and target-only on ``models``.

    ``context_len`` defaults to :func:`default_context_len`. Greedy: the
    first ``compare_requests`` requests also run through transformers' ``generate``. With
    ``disagg`` the speculative run prefills in a second process, which loads the same model
    (:class:`~specstrat.hf.process_loader.HFLoader`).
    """
    if disagg and not models.source:
        raise InvalidConfig(
            "disagg=True needs models loaded from a path (specstrat.hf.load): the prefill "
            "process loads the same model from models.source, which is empty here"
        )
    requests = (
        prompt_requests(models, prompts, max_new_tokens, sampling)
        if prompts
        else code_requests(models, num_requests, max_new_tokens, sampling)
    )
    if context_len is None:
        context_len = default_context_len(requests, algo, num_draft_tokens)
    config = EngineConfig(
        num_draft_tokens=num_draft_tokens,
        overlap=overlap,
        context_len=context_len,
        max_running_requests=max_running_requests,
    )
    run = run_comparison(
        algo,
        models,
        requests,
        config,
        progress=progress,
        trace=trace,
        sampling=sampling,
        model_name=models.source,
        disagg=disagg,
        loader=_loader(models) if disagg else None,
        rounds=rounds,
    )
    summary = run.summary
    reference = None
    generate_tps = batch1_tps = 0.0
    if sampling.greedy:
        lm = models.target
        subset = requests[: max(1, compare_requests)]
        generate_reference(lm, [replace(subset[0], rid="warm-up", max_new_tokens=2)])
        single: list[Engine] = []

        def fresh_single() -> None:
            single[:] = [Engine(NONE, models, replace(config, max_running_requests=1))]

        # Like for like: specstrat's target-only on the same requests at batch size 1,
        # interleaved round by round with transformers' generate.
        paired = interleaved(
            [
                Contender(
                    "generate", lambda: generate_reference(lm, subset, pad_token_id=_pad(models))
                ),
                Contender("target-only", lambda: single[0].run(list(subset)), fresh_single),
            ],
            rounds=rounds,
            warmup=0,
        )
        want = paired["generate"].outputs
        generate_tps, batch1_tps = (paired[n].tokens_per_s for n in ("generate", "target-only"))
        reference = compare(lm, subset, run.target_outputs, want)
        spec_check = compare(lm, requests, run.spec_outputs, run.target_outputs)
        lossless = (
            spec_check.lossless
            and reference.lossless
            and run.rounds_agree
            and summary.acceptance_rule_lossless
        )
        note = (
            f"against target-only: {spec_check.line()}; target-only against transformers "
            f"generate: {reference.line()}"
        )
        if not run.rounds_agree:
            note += "; a later round's outputs differ from the first round's"
        summary = replace(
            summary, lossless=lossless, lossless_check=note, ties=spec_check.ties + reference.ties
        )
    first = run.spec_outputs.get(requests[0].rid, [])
    count = len(requests[: max(1, compare_requests)]) if reference is not None else 0
    return HFDemo(
        summary,
        reference,
        generate_tps,
        models.decode(first),
        count,
        max_running_requests,
        batch1_tps if reference is not None else 0.0,
    )


def _loader(models: HFModels) -> HFLoader:
    """The prefill process's loader: the same path, at the target's dtype."""
    dtype = next(models.target.parameters()).dtype
    return HFLoader(models.source, str(dtype).removeprefix("torch."), models.attach)


def _pad(models: HFModels) -> int | None:
    pad = getattr(models.tokenizer, "pad_token_id", None)
    return pad if isinstance(pad, int) else None
