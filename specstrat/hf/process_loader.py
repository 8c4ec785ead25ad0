"""Loading a Hugging Face model in another process: the prefill side of disaggregation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.hf.loader import HFModels, load

__all__ = ["HFLoader"]


@dataclass(frozen=True, slots=True)
class HFLoader:
    """A picklable :class:`~specstrat.runtime.ModelLoader` of the model at
    ``path`` (``dtype`` a torch dtype's name): the prefill process of
    :func:`~specstrat.runtime._disagg.run_disaggregated` loads the same model as the decode side
    (a ``.gguf`` file from the conversion cache), then replays ``attach`` on it (the decode
    side's :attr:`HFModels.attach`, e.g. a trained head)."""

    path: str
    dtype: str = "float32"
    attach: Callable[[HFModels], HFModels] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise InvalidConfig(
                f"HFLoader.path={self.path!r} must be a model directory or .gguf path"
            )
        if not isinstance(getattr(torch, str(self.dtype), None), torch.dtype):
            raise InvalidConfig(
                f"HFLoader.dtype={self.dtype!r} is not a torch dtype name (e.g. 'float32', "
                "'bfloat16')"
            )

    def __call__(self, device: str) -> HFModels:
        """``specstrat.hf.load(path, dtype=..., device=device)``, then ``attach``."""
        models = load(self.path, dtype=getattr(torch, self.dtype), device=device)
        return models if self.attach is None else self.attach(models)
