"""Measuring algorithms: runs timed side by side (:mod:`specstrat.bench.timing`), the core that
``bench/hf_speed.py`` uses and ``specstrat bench`` is to use. Lives outside the runtime: it only
calls what it times."""

from specstrat.bench.timing import Contender, Ratio, Timings, interleaved, ratio

__all__ = ["Contender", "Ratio", "Timings", "interleaved", "ratio"]
