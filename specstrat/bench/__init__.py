"""Measuring algorithms: runs timed side by side (:mod:`specstrat.bench.timing`), the one core
that the benchmark scripts and the demo's comparisons use. Lives outside the runtime: it only
calls what it times."""

from specstrat.bench.timing import Contender, Ratio, Timings, interleaved, ratio

__all__ = ["Contender", "Ratio", "Timings", "interleaved", "ratio"]
