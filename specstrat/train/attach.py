"""A trained head attached to a loaded Hugging Face model, so the engine's EAGLE drafters run it.

:func:`attach_head` loads a head file for ``models.target`` (refused for another target by
:class:`~specstrat.train.artifact.HeadMismatch`), switches the target to return the fused
outputs of the head's layers as its hidden state (:meth:`HFCausalLM.with_feature_layers`: what
the head reads at prefill and after each verify) and sets ``models.head``. The attacher is
recorded in ``models.attach``, so the prefill process of disaggregation attaches the same head
after loading the same model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from specstrat.errors import InvalidConfig
from specstrat.hf import HFModels
from specstrat.train.artifact import load_head

__all__ = ["HeadAttacher", "attach_head"]


@dataclass(frozen=True, slots=True)
class HeadAttacher:
    """Attaches the head saved at ``path`` (picklable: it travels to the prefill process)."""

    path: str

    def __call__(self, models: HFModels) -> HFModels:
        """``models`` with the head attached (see the module docstring)."""
        if models.head is not None:
            raise InvalidConfig(
                f"head={self.path!r}: the models already have a head; attach one head to a "
                "freshly loaded model"
            )
        target = models.target
        trained = load_head(self.path, target)
        weight = next(target.parameters())
        trained.head.to(device=weight.device, dtype=weight.dtype).eval()
        return replace(
            models,
            target=target.with_feature_layers(trained.layers),
            head=trained.draft_head(target.shape.vocab_size),
            attach=self,
        )


def attach_head(models: HFModels, path: str | os.PathLike[str]) -> HFModels:
    """``models`` running the head saved at ``path`` (``specstrat train --out``): the EAGLE
    drafters (``EAGLE``, ``EAGLE3``, a ``TopkTree``) read it through ``models.head``."""
    return HeadAttacher(str(Path(path)))(models)
