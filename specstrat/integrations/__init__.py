"""Adapters that run specstrat algorithms inside production inference engines.

Each engine has its own module, imported on demand (``specstrat.integrations.sglang``); none
imports its engine until it is used, so ``import specstrat`` never needs an engine installed.
"""

__all__: list[str] = []
