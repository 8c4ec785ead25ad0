"""The payload that crosses scheduler steps through a FutureMap, and its validation.

A :class:`RelayPayload` is a set of *batched* tensors, one row per request, any subset of
:data:`RELAY_FIELDS`. Absent fields are ``None``. The same type is what
``FutureMap.stash`` takes, what ``FutureMap.resolve`` returns and what the relay-gather kernel
reads and writes, so one validation covers all three.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from specstrat.errors import InvalidConfig

__all__ = ["RELAY_FIELDS", "RelayField", "RelayPayload"]

RelayField = Literal["bonus_tokens", "seq_lens", "topk_p", "topk_index", "hidden_states"]

#: Every relay field, with the rank it must have and whether it holds integers.
RELAY_FIELDS: dict[RelayField, tuple[int, bool]] = {
    "bonus_tokens": (1, True),
    "seq_lens": (1, True),
    "topk_p": (2, False),
    "topk_index": (2, True),
    "hidden_states": (2, False),
}


@dataclass(frozen=True, slots=True)
class RelayPayload:
    """Per-request relay tensors; every present field has the same number of rows.

    ``bonus_tokens`` ``[n]`` int: the token the next step starts from (the verified/bonus token).
    ``seq_lens`` ``[n]`` int: sequence lengths after this step.
    ``topk_p`` ``[n, k]`` float and ``topk_index`` ``[n, k]`` int: the draft head's top-k.
    ``hidden_states`` ``[n, H]`` float: the target's last hidden state per request.
    """

    bonus_tokens: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None
    topk_index: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None

    def __post_init__(self) -> None:
        rows: tuple[str, int] | None = None
        device: tuple[str, torch.device] | None = None
        for name, tensor in self.present().items():
            ndim, integral = RELAY_FIELDS[name]
            if not isinstance(tensor, torch.Tensor):
                raise InvalidConfig(
                    f"{name}={type(tensor).__name__} is not a torch.Tensor; pass a tensor or None"
                )
            if tensor.dim() != ndim:
                raise InvalidConfig(
                    f"{name}.shape={tuple(tensor.shape)} has rank {tensor.dim()}; "
                    f"{name} must have rank {ndim} (one row per request)"
                )
            if integral == tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
                kind = "an integer" if integral else "a floating-point"
                raise InvalidConfig(f"{name}.dtype={tensor.dtype}; {name} must have {kind} dtype")
            if rows is None:
                rows = (name, tensor.shape[0])
            elif tensor.shape[0] != rows[1]:
                raise InvalidConfig(
                    f"{name} has {tensor.shape[0]} rows but {rows[0]} has {rows[1]}; "
                    "every relay field has one row per request"
                )
            if device is None:
                device = (name, tensor.device)
            elif tensor.device != device[1]:
                raise InvalidConfig(
                    f"{name}.device={tensor.device} but {device[0]}.device={device[1]}; "
                    "put every relay field on one device"
                )

    def present(self) -> dict[RelayField, torch.Tensor]:
        """The fields that are set, by name, in :data:`RELAY_FIELDS` order."""
        found: dict[RelayField, torch.Tensor] = {}
        for name in RELAY_FIELDS:
            value = getattr(self, name)
            if value is not None:
                found[name] = value
        return found

    @property
    def num_rows(self) -> int:
        """Rows (requests) in the payload; 0 when no field is set."""
        present = self.present()
        return next(iter(present.values())).shape[0] if present else 0

    def merged(self, other: RelayPayload) -> RelayPayload:
        """This payload with every field that ``other`` sets replaced by ``other``'s."""
        return replace(self, **other.present())
