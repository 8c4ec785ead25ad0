"""The demo's summary: what :func:`specstrat.demo.run_comparison` measured, as a table and
as JSON (``specstrat.demo`` re-exports both classes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DemoSummary", "RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request of a demo run: ``prompt_ids`` exactly as the target saw them, ``output_ids``
    the speculative run's kept tokens."""

    rid: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The demo's figures. ``requests``: every request's ids (:class:`RequestRecord`);
    ``num_requests``: their count (``requests`` was that count in 0.3). ``topk``/``num_steps``:
    the draft tree (topk 1 is a chain); ``draft_worker_verify_forwards``: TARGET_VERIFY forwards
    the draft worker ran (a block drafter's); ``draft_worker_tokens_per_req``: their ``T_draft``
    (0: none). ``temperature``, ``top_p``, ``top_k``, ``seed``: the sampling parameters (request
    ``i`` samples with ``seed + i``). ``model``: what ran (``embedded`` or a model's path);
    ``ties``: divergences certified as numerical ties (Hugging Face models, see
    :mod:`specstrat.hf.reference`). ``verified_per_step``: target tokens verified per request
    per verify step (``T``, or drafts + 1 under ragged verify; 1.0 without speculation);
    ``max_running_requests`` and ``context_len``: the engine's limits. The tokens/s and the
    speed ratio come from :mod:`specstrat.timing`: ``rounds`` interleaved rounds (target-only
    first in each), tokens/s over each one's median round, the speed ratio the median of the
    per-round ratios, ``speed_ratio_min``/``speed_ratio_max`` their range.
    ``width_histogram``: decode steps per D the algorithm's speculation policy chose, keyed by
    D as a string (``{"4": 44}`` for a fixed D = 4). ``acceptance_length`` is τ over drafted
    steps (D > 1); ``plain_step_share``: the share of decode request-steps at D = 1 (plain
    decoding), which τ excludes; ``acceptance_by_position`` and ``acceptance_conditional``:
    acceptance by draft position, unconditional and conditional (``None``: never proposed, or
    never reached), the bench's keys and figures (all as ``docs/glossary.md`` defines them)."""

    algorithm: str
    overlap: bool
    disagg: bool
    num_draft_tokens: int
    requests: tuple[RequestRecord, ...]
    num_requests: int
    tokens: int
    acceptance_length: float
    spec_tokens_per_s: float
    target_tokens_per_s: float
    speed_ratio: float
    lossless: bool
    acceptance_by_position: tuple[float | None, ...]
    acceptance_rule_lossless: bool
    temperature: float
    lossless_check: str
    topk: int
    num_steps: int
    draft_worker_verify_forwards: int = 0
    draft_worker_tokens_per_req: int = 0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    model: str = "embedded"
    ties: int = 0
    verified_per_step: float = 1.0
    max_running_requests: int = 16
    context_len: int = 512
    width_histogram: dict[str, int] = field(default_factory=dict)
    plain_step_share: float = 0.0
    rounds: int = 1
    speed_ratio_min: float = 0.0
    speed_ratio_max: float = 0.0
    acceptance_conditional: tuple[float | None, ...] = ()

    def _setup(self) -> str:
        parts = [f"D={self.num_draft_tokens}", f"overlap {'on' if self.overlap else 'off'}"]
        if self.topk > 1:
            parts.append(f"tree topk {self.topk}, {self.num_steps} steps")
        if self.temperature:
            parts.append(f"temperature {self.temperature:g}")
        if self.disagg:
            parts.append("prefill/decode in 2 processes")
        return f"{self.algorithm} ({', '.join(parts)})"

    def _sampling(self) -> str:
        kind = "greedy" if not self.temperature else f"temperature {self.temperature:g}"
        return f"{kind}, top_p {self.top_p:g}, top_k {self.top_k}, seed {self.seed}"

    def table(self) -> str:
        """The summary as aligned text."""
        rows = [
            ("algorithm", self._setup()),
            ("model", self.model),
            ("requests", str(self.num_requests)),
            ("tokens", str(self.tokens)),
            ("sampling", self._sampling()),
            ("τ (tokens per drafted step)", f"{self.acceptance_length:.2f}"),
            ("verified per step", f"{self.verified_per_step:.2f} target tokens per request"),
            ("acceptance (unconditional)", _rates(self.acceptance_by_position)),
            ("acceptance (conditional)", _rates(self.acceptance_conditional)),
            ("tokens/s with speculation", f"{self.spec_tokens_per_s:.1f}"),
            ("tokens/s target-only", f"{self.target_tokens_per_s:.1f}"),
            ("speed ratio", self._ratio()),
            ("lossless", f"{'yes' if self.lossless else 'no'} ({self.lossless_check})"),
        ]
        if len(self.width_histogram) > 1:  # a speculation policy chose D per step
            steps = ", ".join(f"D={w}: {n}" for w, n in self.width_histogram.items())
            rows.insert(-1, ("decode steps by D", steps))
        if 0.0 < self.plain_step_share < 1.0:  # beside tau, which counts drafted steps only
            share = f"{self.plain_step_share:.0%} of request-steps (not in τ)"
            rows.insert(6, ("plain steps (D=1)", share))
        if self.draft_worker_verify_forwards:
            forwards = f"{self.draft_worker_verify_forwards} forwards"
            rows.insert(
                -1, ("draft-worker verify", f"{forwards}, T={self.draft_worker_tokens_per_req}")
            )
        return "\n".join(f"{k:<28} {v}" for k, v in rows)

    def _ratio(self) -> str:
        """The median ratio, with its range over the rounds when there were several."""
        if self.rounds < 2:
            return f"{self.speed_ratio:.2f}x (1 round)"
        low, high = self.speed_ratio_min, self.speed_ratio_max
        return f"{self.speed_ratio:.2f}x ({low:.2f}-{high:.2f} over {self.rounds} rounds)"

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values."""
        return asdict(self)


def _rates(rates: Sequence[float | None]) -> str:
    """Rates by position as text: two decimals each, ``-`` where unobserved (or none at all)."""
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates) or "-"
