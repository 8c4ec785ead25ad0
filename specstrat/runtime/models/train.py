"""``python -m specstrat.runtime.models.train``: retrains the embedded models (the documented
command, kept); importing this 0.3.0 path is deprecated (the trainer is internal since 0.4.0)."""

from specstrat._deprecation import INTERNAL, moved_module
from specstrat.runtime._models.train import *  # noqa: F403
from specstrat.runtime._models.train import main

if __name__ != "__main__":
    __getattr__ = moved_module(__name__, INTERNAL, "specstrat.runtime._models.train")
else:
    main()
