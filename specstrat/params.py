"""How a request samples: :class:`SamplingParams` and :data:`GREEDY` (re-exported by
:mod:`specstrat.drafting`, whose hooks receive one per request)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = ["GREEDY", "MIN_TEMPERATURE", "SamplingParams"]

#: The smallest temperature above 0 (greedy) a request may ask for.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How a request samples: ``temperature`` 0 is greedy; ``top_k`` 0 is off.

    Acceptance rules receive one per request; :class:`~specstrat.strategies.GreedyAcceptance`
    decodes greedily whatever they say, so it is lossless for ``temperature=0`` only.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise InvalidConfig(f"temperature={t!r} must be a finite number >= 0 (0 = greedy)")
        if 0 < t < MIN_TEMPERATURE:  # logits / t would overflow to inf
            raise InvalidConfig(
                f"temperature={t!r} is below {MIN_TEMPERATURE}; use 0 for greedy decoding"
            )
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise InvalidConfig(f"top_p={p!r} must be in (0, 1]")
        for name in ("top_k", "seed"):
            value = getattr(self, name)
            if not is_int(value) or not 0 <= value < 2**63:
                raise InvalidConfig(f"{name}={value!r} must be an int in 0..2**63-1")

    @property
    def greedy(self) -> bool:
        """Whether this request decodes greedily."""
        return self.temperature == 0


#: Greedy decoding, the engine's default for every request.
GREEDY = SamplingParams()
