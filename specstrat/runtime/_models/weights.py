"""Loading the embedded models shipped inside the package (no download)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specstrat.errors import InvalidConfig
from specstrat.runtime._models.model import (
    BlockDraftLM,
    BlockHead,
    BoundEagleHead,
    EagleHead,
    ModelConfig,
    TinyLM,
)

__all__ = ["BLOCK_WEIGHTS", "EMBEDDED_WEIGHTS", "EmbeddedModels"]

#: The weights `python -m specstrat.runtime._models.train` wrote (float16, under 5 MB).
EMBEDDED_WEIGHTS = Path(__file__).parent / "weights" / "embedded.pt"
#: The block head `python -m specstrat.runtime._models.train --block-head` trained against the
#: frozen models of :data:`EMBEDDED_WEIGHTS` (float16; a file of its own, so those stay as they
#: are).
BLOCK_WEIGHTS = Path(__file__).parent / "weights" / "block.pt"


@dataclass(frozen=True, slots=True)
class EmbeddedModels:
    """The target LM, the draft LM, the EAGLE-style head and the block head, in eval mode.

    A :class:`~specstrat.models.LoadedModels`: ``head`` is ``eagle`` bound to ``target``;
    ``block`` is the draft LM with ``block_head`` (``None`` when no block head was loaded).
    """

    target: TinyLM
    draft: TinyLM
    eagle: EagleHead
    block_head: BlockHead | None = None

    @property
    def block(self) -> BlockDraftLM | None:
        """The draft LM with the block head (a :class:`~specstrat.models.BlockDraftModel`)."""
        return None if self.block_head is None else BlockDraftLM(self.draft, self.block_head)

    @property
    def head(self) -> BoundEagleHead:
        """The EAGLE-style head bound to the target (it reuses the target's embeddings)."""
        return BoundEagleHead(self.eagle, self.target)

    @classmethod
    def load(
        cls,
        path: Path = EMBEDDED_WEIGHTS,
        *,
        block: Path | None = BLOCK_WEIGHTS,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> EmbeddedModels:
        """Load ``path`` (and the block head from ``block``; ``None``: none) and cast to
        ``dtype`` on ``device``.

        float64 is the CPU default: verification compares argmaxes computed by forwards of
        different shapes (decode vs verify), and float64 keeps their rounding far below any
        logit gap, so speculation stays lossless.
        """
        if not path.is_file():
            raise InvalidConfig(
                f"weights file {path} is missing; run `python -m specstrat.runtime._models.train`"
            )
        if block is not None and not block.is_file():
            raise InvalidConfig(
                f"block head file {block} is missing; run `python -m "
                "specstrat.runtime._models.train --block-head`, or pass block=None"
            )
        blob = torch.load(path, map_location="cpu", weights_only=True)
        target = TinyLM(ModelConfig(**blob["target"]["config"]))
        target.load_state_dict(blob["target"]["state"])
        draft = TinyLM(ModelConfig(**blob["draft"]["config"]))
        draft.load_state_dict(blob["draft"]["state"])
        eagle = EagleHead(int(blob["eagle"]["dim"]))
        eagle.load_state_dict(blob["eagle"]["state"])
        head = None
        if block is not None:
            stored = torch.load(block, map_location="cpu", weights_only=True)["block_head"]
            config, size = ModelConfig(**stored["config"]), int(stored["max_block"])
            head = BlockHead(config, size, int(stored["layers"]))
            head.load_state_dict(stored["state"])
            head = head.to(torch.device(device), dtype).eval()
        dev = torch.device(device)
        return cls(
            target.to(dev, dtype).eval(),
            draft.to(dev, dtype).eval(),
            eagle.to(dev, dtype).eval(),
            head,
        )
