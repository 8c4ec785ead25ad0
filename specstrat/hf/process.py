"""Loading a Hugging Face model in another process: the prefill side of disaggregation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat.hf.loader import HFModels, load

__all__ = ["HFLoader"]


@dataclass(frozen=True, slots=True)
class HFLoader:
    """A picklable :class:`~specstrat.runtime.disagg.process.ModelLoader` of the model at
    ``path`` (``dtype`` a torch dtype's name): the prefill process of
    :func:`~specstrat.runtime.disagg.run_disaggregated` loads the same model as the decode side
    (a ``.gguf`` file from the conversion cache)."""

    path: str
    dtype: str = "float32"

    def __call__(self, device: str) -> HFModels:
        """``specstrat.hf.load(path, dtype=..., device=device)``."""
        return load(self.path, dtype=getattr(torch, self.dtype), device=device)
