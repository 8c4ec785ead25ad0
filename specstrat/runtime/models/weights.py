"""Loading the embedded models shipped inside the package (no download)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specstrat.errors import InvalidConfig
from specstrat.runtime.models.model import BoundEagleHead, EagleHead, ModelConfig, TinyLM

__all__ = ["EMBEDDED_WEIGHTS", "EmbeddedModels"]

#: The weights `python -m specstrat.runtime.models.train` wrote (float16, under 5 MB).
EMBEDDED_WEIGHTS = Path(__file__).parent / "weights" / "embedded.pt"


@dataclass(frozen=True, slots=True)
class EmbeddedModels:
    """The target LM, the draft LM and the EAGLE-style head, in eval mode.

    A :class:`~specstrat.models.LoadedModels`: ``head`` is ``eagle`` bound to ``target``.
    """

    target: TinyLM
    draft: TinyLM
    eagle: EagleHead

    @property
    def head(self) -> BoundEagleHead:
        """The EAGLE-style head bound to the target (it reuses the target's embeddings)."""
        return BoundEagleHead(self.eagle, self.target)

    @classmethod
    def load(
        cls,
        path: Path = EMBEDDED_WEIGHTS,
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> EmbeddedModels:
        """Load ``path`` and cast to ``dtype`` on ``device``.

        float64 is the CPU default: verification compares argmaxes computed by forwards of
        different shapes (decode vs verify), and float64 keeps their rounding far below any
        logit gap, so speculation stays lossless.
        """
        if not path.is_file():
            raise InvalidConfig(
                f"weights file {path} is missing; run `python -m specstrat.runtime.models.train`"
            )
        blob = torch.load(path, map_location="cpu", weights_only=True)
        target = TinyLM(ModelConfig(**blob["target"]["config"]))
        target.load_state_dict(blob["target"]["state"])
        draft = TinyLM(ModelConfig(**blob["draft"]["config"]))
        draft.load_state_dict(blob["draft"]["state"])
        eagle = EagleHead(int(blob["eagle"]["dim"]))
        eagle.load_state_dict(blob["eagle"]["state"])
        dev = torch.device(device)
        return cls(
            target.to(dev, dtype).eval(), draft.to(dev, dtype).eval(), eagle.to(dev, dtype).eval()
        )
