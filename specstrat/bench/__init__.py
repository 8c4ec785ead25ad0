"""Measuring algorithms the way the field reports them: ``specstrat bench`` (workloads, the
figures, tables, JSON and plots) over the timing core of :mod:`specstrat.timing` (runs timed
side by side, re-exported here), and the engine's host cost per step
(:mod:`specstrat.bench.overhead`). Lives outside the runtime: it only calls what it times."""

from specstrat.timing import Contender, Ratio, Timings, interleaved, ratio

__all__ = ["Contender", "Ratio", "Timings", "interleaved", "ratio"]
