"""Speculation policies for the adaptive-speculation measurement in
docs/guides/speculation-policy.md: each fixed D as its own contender, and goodput over the same
widths, so one ``specstrat bench`` run compares them
(``--adaptive bench.adaptive_policies:FIXED3``)."""

from specstrat.protocols import SpeculationPolicy
from specstrat.strategies import (
    EmaLadderSpeculationPolicy,
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
)

FIXED2: SpeculationPolicy = FixedSpeculationPolicy(width=2)
FIXED3: SpeculationPolicy = FixedSpeculationPolicy(width=3)
FIXED4: SpeculationPolicy = FixedSpeculationPolicy(width=4)
FIXED5: SpeculationPolicy = FixedSpeculationPolicy(width=5)
GOODPUT5: SpeculationPolicy = GoodputSpeculationPolicy(widths=(1, 2, 3, 4, 5))
#: SGLang's EMA rule and numbers with the bs-1 ladder cut to D <= 5 (its D 6 and 8 need more
#: context than the embedded code prompts leave at context_len 512).
EMA5: SpeculationPolicy = EmaLadderSpeculationPolicy(
    ladders=((1, (2, 4, 5), -0.25), (8, (1, 2, 4), 0.0), (32, (1, 2), 0.0), (64, (1,), 0.0))
)
