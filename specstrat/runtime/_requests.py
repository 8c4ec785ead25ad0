"""What the engine takes and reports: requests, the scheduler's limits, and a run's statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

from specstrat._ints import is_int
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.runtime._models.text import encode_indentation

__all__ = ["EngineConfig", "Request", "RunStats", "acceptance_rates"]

_VOCAB_HINT = "token ids are ints >= 0 (the embedded models' vocabulary is bytes, 0..255)"


@dataclass(frozen=True, slots=True)
class Request:
    """A generation request: a prompt of token ids, how many tokens to generate at most, the
    tokens that end it early (a generated stop token is kept as the output's last token), and
    how it samples (greedy by default; a seed makes its tokens reproducible in any batch).

    ``prompt`` is any non-empty sequence of token ids (a list, a range, a tuple); the request
    stores it as a tuple, so ``Request("a", [1, 2], 4).prompt == (1, 2)``."""

    rid: str
    prompt: Sequence[int]
    max_new_tokens: int
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    sampling: SamplingParams = GREEDY

    def __post_init__(self) -> None:
        if not isinstance(self.rid, str) or not self.rid:
            raise InvalidConfig(f"rid={self.rid!r} must be a non-empty string")
        prompt = self.prompt
        # Any sequence of ints (a list from a tokenizer, a range, a tuple), stored as a tuple so
        # the request stays hashable and immutable; a str is a sequence too, but of characters.
        if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence) or not prompt:
            raise InvalidConfig(
                f"request {self.rid!r}: prompt={prompt!r} must be a non-empty sequence of "
                "token ids (e.g. [1, 2, 3]); encode text with Request.from_text or a tokenizer"
            )
        object.__setattr__(self, "prompt", tuple(prompt))
        if any(not is_int(t) or t < 0 for t in self.prompt):
            raise InvalidConfig(f"request {self.rid!r}: prompt has a bad token; {_VOCAB_HINT}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise InvalidConfig(
                f"request {self.rid!r}: max_new_tokens={self.max_new_tokens!r} must be an int >= 1"
            )
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidConfig(
                f"request {self.rid!r}: sampling={self.sampling!r}; pass "
                "specstrat.SamplingParams(temperature=..., top_p=..., top_k=..., seed=...)"
            )
        stops = self.stop_token_ids
        if not isinstance(stops, frozenset) or any(not is_int(t) or t < 0 for t in stops):
            raise InvalidConfig(
                f"request {self.rid!r}: stop_token_ids={stops!r} must be a frozenset of ints "
                ">= 0 (e.g. frozenset({10}) to stop at a newline byte)"
            )

    @classmethod
    def from_text(
        cls,
        rid: str,
        text: str,
        max_new_tokens: int,
        *,
        stop: str | None = None,
        sampling: SamplingParams = GREEDY,
    ) -> Request:
        """A request whose prompt is ``text`` as the embedded models read it: UTF-8 bytes, each
        line's indentation as one depth byte (``decode_indentation`` turns outputs back into
        text); ``stop``: single-byte characters that end generation."""
        stops = frozenset(stop.encode()) if stop else frozenset()
        prompt = tuple(encode_indentation(text.encode()))
        return cls(rid, prompt, max_new_tokens, stops, sampling)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Scheduler limits. ``num_draft_tokens`` is D; the verify policy answers T from it.

    ``max_total_tokens``: KV indices per model (``None``: ``max_running_requests * context_len``).
    ``chunked_prefill_size``: tokens per prefill forward; the prompts admitted together are
    packed into forwards of at most this many tokens, a longer prompt in consecutive pieces, so
    a prefill's activations and logits stay bounded (the relay is sized by it too).
    ``ragged_verify``: for an algorithm with ``supports_ragged_verify``, a step where the drafter
    proposed fewer than ``T - 1`` tokens for some request verifies only what was proposed (one
    eager forward with ragged metadata; steps of T tokens per request replay the graph runner).
    ``graph_buckets``: batch sizes of the verify graph runner (``use_graph_runner``).
    """

    num_draft_tokens: int = 4
    max_running_requests: int = 16
    context_len: int = 1024
    chunked_prefill_size: int = 512
    max_total_tokens: int | None = None
    overlap: bool = False
    graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    use_graph_runner: bool = True
    ragged_verify: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not is_int(value) or value < 1):
                raise InvalidConfig(f"EngineConfig.{f.name}={value!r} must be an int >= 1")
            if f.type == "bool" and not isinstance(value, bool):
                raise InvalidConfig(f"EngineConfig.{f.name}={value!r} must be True or False")
        total = self.max_total_tokens
        if total is not None and (not is_int(total) or total < 1):
            raise InvalidConfig(
                f"EngineConfig.max_total_tokens={total!r} must be an int >= 1, or None for "
                "max_running_requests * context_len"
            )
        buckets = self.graph_buckets
        if (
            not isinstance(buckets, tuple)
            or not buckets
            or any(not is_int(b) or b < 1 for b in buckets)
        ):
            raise InvalidConfig(
                f"EngineConfig.graph_buckets={buckets!r} must be a non-empty tuple of ints >= 1"
            )

    @property
    def kv_tokens(self) -> int:
        """KV indices per model."""
        return self.max_total_tokens or self.max_running_requests * self.context_len


@dataclass(frozen=False, slots=True)
class RunStats:
    """What a run did: tokens, steps, acceptance (overall and by draft position), stage times.

    Verify statistics count the request-steps whose tokens a request kept: an overlapped extra
    step of a request that had already finished is dropped with its tokens and counted only in
    ``dropped_steps``, so overlap and sync report the same figures for the same output. They
    count what the acceptance rule accepted, before any cut at ``max_new_tokens`` or a stop
    token. Verify statistics count drafted steps (D > 1): a request-step at D = 1 (plain
    decoding, a non-speculative algorithm's every step) counts only in ``plain_steps``.
    ``verified_requests``: drafted request-steps verified; ``verified_tokens``: their accepted
    drafts plus bonus tokens; ``verify_forward_tokens``: the target tokens their verify rows
    held (``T`` each, or drafts + 1 under ragged verify). ``accepted_by_position[k]``: verify
    steps in which draft position ``k + 1`` (depth) was accepted; ``proposed_by_position[k]``:
    those in which it was proposed; ``accepted_histogram[p][a]``: verify steps that proposed
    ``p`` positions (a tree's depth) and accepted ``a`` of them (a position not proposed is
    unobserved, never a rejection). ``first_token_at`` / ``last_token_at``: by request id, the
    ``time.perf_counter()`` at which the scheduler kept its first and its last token.
    ``widths``: the D the speculation policy chose for each decode step, in order (1 for a
    non-speculative algorithm; the run's own list, never shared); ``width_histogram`` counts
    them. ``plain_steps``: kept request-steps decoded plainly (D = 1); ``plain_step_share``
    their share of all kept decode request-steps.

    Stage seconds are summed over decode steps: ``draft_seconds`` (drafter.propose),
    ``verify_seconds`` (the target's forward), ``accept_seconds`` (acceptance rule),
    ``decode_seconds`` (whole steps). ``draft_worker_verify_forwards``: TARGET_VERIFY forwards
    the draft worker ran (a block drafter's, one per step); ``draft_worker_tokens_per_req``:
    their ``T_draft`` (0 when the draft worker runs no TARGET_VERIFY).
    """

    generated_tokens: int = 0
    decode_steps: int = 0
    verified_requests: int = 0
    verified_tokens: int = 0  # tokens produced by verification (accepted drafts + bonus)
    verify_forward_tokens: int = 0  # target tokens of those verify rows (T, or drafts + 1)
    accepted_by_position: list[int] = field(default_factory=list)
    proposed_by_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    decode_seconds: float = 0.0
    seconds: float = 0.0
    draft_worker_verify_forwards: int = 0
    draft_worker_tokens_per_req: int = 0
    # New in 0.4.0, after the 0.3.0 fields so positional construction keeps its meaning.
    accepted_histogram: dict[int, list[int]] = field(default_factory=dict)
    dropped_steps: int = 0
    first_token_at: dict[str, float] = field(default_factory=dict)
    last_token_at: dict[str, float] = field(default_factory=dict)
    # New in 0.5.0 (adaptive speculation), after the 0.4.0 fields.
    widths: list[int] = field(default_factory=list)
    plain_steps: int = 0

    @property
    def width_histogram(self) -> dict[int, int]:
        """Decode steps per chosen D (``widths`` counted), ascending by D."""
        return dict(sorted(Counter(self.widths).items()))

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens produced (accepted drafts + bonus) per request per drafted step
        (D > 1; plain D = 1 steps excluded, see :attr:`plain_step_share`); 1.0 if none."""
        return self.verified_tokens / self.verified_requests if self.verified_requests else 1.0

    @property
    def plain_step_share(self) -> float:
        """The share of kept decode request-steps that ran at D = 1 (plain decoding), beside
        τ; 0.0 before any decode step."""
        steps = self.plain_steps + self.verified_requests
        return self.plain_steps / steps if steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over wall time."""
        return self.generated_tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """Acceptance (unconditional) by draft position 1, 2, ...: how often the position was
        accepted when proposed, ``A_i / P_i`` (:func:`acceptance_rates` over
        :attr:`accepted_histogram`); ``None`` where no step proposed the position."""
        return acceptance_rates(self.accepted_histogram)[0]

    @property
    def acceptance_conditional(self) -> list[float | None]:
        """Acceptance (conditional) by draft position 1, 2, ...: how often the position was
        accepted when proposed with every earlier position accepted, ``A_i / R_i``
        (:func:`acceptance_rates` over :attr:`accepted_histogram`); ``None`` where no step
        reached the position."""
        return acceptance_rates(self.accepted_histogram)[1]

    @property
    def verified_per_step(self) -> float:
        """Target tokens verified per request per verify step (1.0 without speculation)."""
        if not self.verified_requests:
            return 1.0
        return self.verify_forward_tokens / self.verified_requests

    def count_verify(
        self, proposed: int, accepted: int, produced: int, forward_tokens: int
    ) -> None:
        """Add one kept request-step: ``proposed`` draft positions (depth), ``accepted`` of
        them, ``produced`` tokens (accepted + bonus) and ``forward_tokens`` target tokens
        verified (its verify row's tokens)."""
        self.count_verified([proposed], [accepted], produced, forward_tokens)

    def count_verified(
        self, proposed: list[int], accepted: list[int], produced: int, forward_tokens: int
    ) -> None:
        """Add one step's kept request-steps at once: per request its proposed positions and
        accepted drafts; ``produced`` and ``forward_tokens`` summed over them."""
        self.verified_requests += len(proposed)
        self.verified_tokens += produced
        self.verify_forward_tokens += forward_tokens
        histogram = self.accepted_histogram
        for (p, a), n in Counter(zip(proposed, accepted, strict=True)).items():
            histogram.setdefault(p, [0] * (p + 1))[a] += n
        self.count_positions(proposed, accepted)

    def count_positions(self, proposed: list[int], accepted: list[int]) -> None:
        """Add one step's per-request proposed depths and accepted lengths (batched: a
        histogram of each, then one pass over the positions)."""
        depth = max(proposed, default=0)
        grow = depth - len(self.proposed_by_position)
        if grow > 0:
            self.proposed_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for counts, totals in (
            (proposed, self.proposed_by_position),
            (accepted, self.accepted_by_position),
        ):
            histogram = Counter(counts)
            reaching = len(counts)  # requests whose count exceeds k, for k = 0, 1, ...
            for k in range(depth):
                reaching -= histogram.get(k, 0)
                if reaching <= 0:
                    break
                totals[k] += reaching


def acceptance_rates(
    histogram: Mapping[int, Sequence[int]],
) -> tuple[list[float | None], list[float | None]]:
    """Acceptance by draft position, unconditional (``A_i / P_i``) and conditional
    (``A_i / R_i``), as ``docs/glossary.md`` defines them, from ``histogram`` (``h[p][a]``:
    verify request-steps that proposed ``p`` positions and accepted ``a``;
    :attr:`RunStats.accepted_histogram`, or several runs' summed). Lists indexed by position 1,
    2, ... up to the deepest proposed; ``None`` where the denominator is 0 (a position never
    proposed, or never reached, is unobserved, not rejected)."""
    depth = max(histogram, default=0)
    unconditional: list[float | None] = []
    conditional: list[float | None] = []
    for i in range(1, depth + 1):
        rows = [counts for p, counts in histogram.items() if p >= i]
        proposed = sum(sum(c) for c in rows)
        accepted = sum(sum(c[i:]) for c in rows)
        reached = sum(sum(c[i - 1 :]) for c in rows)
        unconditional.append(accepted / proposed if proposed else None)
        conditional.append(accepted / reached if reached else None)
    return unconditional, conditional
