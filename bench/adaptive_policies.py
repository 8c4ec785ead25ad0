"""Speculation policies for the adaptive-speculation measurement in
docs/guides/speculation-policy.md: each fixed D as its own contender, and goodput over the
same widths, so one ``specstrat bench`` run compares them (``--adaptive bench.adaptive_policies:FIXED3``)."""

from specstrat.protocols import SpeculationPolicy
from specstrat.strategies import FixedSpeculationPolicy, GoodputSpeculationPolicy

FIXED2: SpeculationPolicy = FixedSpeculationPolicy(width=2)
FIXED3: SpeculationPolicy = FixedSpeculationPolicy(width=3)
FIXED4: SpeculationPolicy = FixedSpeculationPolicy(width=4)
FIXED5: SpeculationPolicy = FixedSpeculationPolicy(width=5)
GOODPUT5: SpeculationPolicy = GoodputSpeculationPolicy(widths=(1, 2, 3, 4, 5))
