"""Target-verify policies: how wide TARGET_VERIFY is, and on which workers it may run."""

from __future__ import annotations

from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = ["OffsetVerifyPolicy"]

_MIN_OFFSET, _MAX_OFFSET = -1, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetVerifyPolicy:
    """``T = num_draft_tokens + offset``, with its own offset on the draft worker.

    ``allow_on_draft_worker`` says whether a draft worker may run TARGET_VERIFY (DFLASH and DSPARK
    verify on the draft worker; EAGLE does not). ``target_offset`` and ``draft_worker_offset`` lie
    in ``-1..1`` (DSPARK's draft worker verifies ``D - 1`` tokens). The sum is settled here once,
    so the per-step call is one addition. ``T`` never drops below 1 (DSPARK at ``D = 1`` verifies
    one token on the draft worker, not zero); the algorithm checks the result lies in ``1..D+1``.
    """

    allow_on_draft_worker: bool = False
    target_offset: int = 0
    draft_worker_offset: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.allow_on_draft_worker, bool):
            raise InvalidConfig(
                f"allow_on_draft_worker={self.allow_on_draft_worker!r} must be True or False"
            )
        for name in ("target_offset", "draft_worker_offset"):
            value = getattr(self, name)
            if not is_int(value):
                raise InvalidConfig(f"{name}={value!r} must be an int in -1..1")
            if not _MIN_OFFSET <= value <= _MAX_OFFSET:
                raise InvalidConfig(
                    f"{name}={value} is outside -1..1; T = num_draft_tokens + offset must stay "
                    "within 1..num_draft_tokens+1"
                )

    def supports_target_verify_for_draft(self) -> bool:
        """Whether a draft worker may run TARGET_VERIFY."""
        return self.allow_on_draft_worker

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        """``num_draft_tokens`` plus this worker's offset, at least 1."""
        offset = self.draft_worker_offset if is_draft_worker else self.target_offset
        return max(1, num_draft_tokens + offset)
