"""What the engine takes and reports: requests, the scheduler's limits, and a run's statistics."""

from __future__ import annotations

from dataclasses import dataclass

from specstrat.errors import InvalidConfig
from specstrat.runtime.text import encode_indentation

__all__ = ["EngineConfig", "Request", "RunStats"]


@dataclass(frozen=True, slots=True)
class Request:
    """A generation request: a byte prompt and how many tokens to generate."""

    rid: str
    prompt: tuple[int, ...]
    max_new_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt:
            raise InvalidConfig(
                f"request {self.rid!r} has an empty prompt; give at least one token"
            )
        if any(not isinstance(t, int) or not 0 <= t < 256 for t in self.prompt):
            raise InvalidConfig(
                f"request {self.rid!r}: prompt tokens must be ints in 0..255 (bytes)"
            )
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise InvalidConfig(
                f"request {self.rid!r}: max_new_tokens={self.max_new_tokens!r} must be an int"
            )
        if self.max_new_tokens <= 0:
            raise InvalidConfig(
                f"request {self.rid!r}: max_new_tokens={self.max_new_tokens} must be >= 1"
            )

    @classmethod
    def from_text(cls, rid: str, text: str, max_new_tokens: int) -> Request:
        """A request whose prompt is ``text`` as the embedded models read it: UTF-8 bytes, each
        line's indentation as one depth byte (:func:`~specstrat.runtime.text.encode_indentation`;
        ``decode_indentation`` turns outputs back into text)."""
        return cls(rid, tuple(encode_indentation(text.encode())), max_new_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Scheduler limits. ``num_draft_tokens`` is D; TARGET_VERIFY width comes from the policy.

    ``ragged_verify``: for an algorithm with ``supports_ragged_verify``, a step where the drafter
    found fewer than ``T - 1`` tokens for some request verifies only what was found (one eager
    forward with ragged metadata; full-width steps still replay the graph runner).
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
        for name in (
            "num_draft_tokens",
            "max_running_requests",
            "context_len",
            "chunked_prefill_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"EngineConfig.{name}={value!r} must be an int >= 1")


@dataclass
class RunStats:
    """What a run did: tokens generated, decode steps, verify steps and accepted tokens."""

    generated_tokens: int = 0
    decode_steps: int = 0
    verified_requests: int = 0
    verified_tokens: int = 0  # tokens produced by verification (accepted drafts + bonus)
    verify_forward_tokens: int = 0  # tokens the target ran in TARGET_VERIFY (drafts + 1 each)
    seconds: float = 0.0

    @property
    def acceptance_length(self) -> float:
        """Mean tokens produced per request per verify step (1.0 without speculation)."""
        return self.verified_tokens / self.verified_requests if self.verified_requests else 1.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over wall time."""
        return self.generated_tokens / self.seconds if self.seconds else 0.0
