"""Deprecated 0.3.0 path: moved to :mod:`specstrat.timing` in 0.4.0."""

from specstrat._deprecation import moved_module
from specstrat.timing import *  # noqa: F403

__getattr__ = moved_module(__name__, "specstrat.timing", "specstrat.timing")
