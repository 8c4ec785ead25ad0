"""Deprecated 0.3.0 path: private since 0.4.0; its public names are in :mod:`specstrat.runtime`."""
from specstrat._deprecation import moved_module
from specstrat.runtime._admission import *  # noqa: F403

moved_module(__name__, "specstrat.runtime")
