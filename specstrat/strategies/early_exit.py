"""Self-speculation by early exit (LayerSkip): the draft LM is the target's own first layers.

:class:`EarlyExitDrafterFactory` asks the target for its ``early_exit(exit_layer)`` view (an
:class:`~specstrat.models.EarlyExitModel`: the first layers plus the final norm and LM head,
sharing the target's weights) and drafts with it exactly as the draft-LM drafter does: in a KV
cache of its own (sharing those layers' KV with the target is not done), chains or top-k trees.
It needs no training; on a model not trained for early exit, acceptance is low and grows with
``exit_layer``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specstrat._ints import is_int
from specstrat.drafting import DrafterContext, DrafterNeeds
from specstrat.errors import InvalidConfig
from specstrat.models import EarlyExitModel, LoadedModels
from specstrat.relay import RelayPayload
from specstrat.strategies.drafters import DraftModelDrafter, draft_lm_drafter

__all__ = ["EarlyExitDrafterFactory"]


@dataclass(frozen=True, slots=True)
class EarlyExitDrafterFactory:
    """Drafts with the target's first ``exit_layer`` layers (plus its final norm and LM head)."""

    exit_layer: int

    def __post_init__(self) -> None:
        layer = self.exit_layer
        if not is_int(layer) or layer < 1:
            raise InvalidConfig(f"EarlyExitDrafterFactory.exit_layer={layer!r} must be an int >= 1")

    @property
    def needs(self) -> DrafterNeeds:
        """A draft LM with its own KV (the early-exit view); drafts trees too."""
        return DrafterNeeds(draft_model=True, trees=True)

    def create_drafter(self, context: DrafterContext) -> DraftModelDrafter:
        """A draft-LM drafter over the target's early-exit view, in a KV runner of its own."""
        target = context.models.target
        if not isinstance(target, EarlyExitModel):
            raise InvalidConfig(
                f"EarlyExitDrafterFactory needs a target with early_exit(exit_layer); "
                f"{type(target).__name__} has none (specstrat.hf.HFCausalLM has it)"
            )
        layers = target.shape.layers
        if self.exit_layer >= layers:
            raise InvalidConfig(
                f"EarlyExitDrafterFactory.exit_layer={self.exit_layer} must be below the "
                f"target's {layers} layers"
            )
        return draft_lm_drafter(context, target.early_exit(self.exit_layer))

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """Nothing travels: the decode side rebuilds the draft KV from the prompt."""
        return RelayPayload()
