"""Deprecated 0.3.0 path: internal since 0.4.0; the public names are in :mod:`specstrat.runtime`."""

from specstrat._deprecation import INTERNAL, moved_module
from specstrat.runtime._step import *  # noqa: F403

__getattr__ = moved_module(__name__, INTERNAL, "specstrat.runtime._step")
