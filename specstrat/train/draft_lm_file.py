"""A distilled draft LM as one safetensors file, bound to the target it was distilled from.

The file stores only what cannot be derived from the target: the draft's decoder layers and
final norm (float16 storage) and its ``d2t`` map (int64). The embedding and the LM-head rows are
the loaded target's. Its string metadata is a head file's (:mod:`~specstrat.train.artifact`):
the format, the target's name and weights' sha256, the target layers the draft started from,
the draft vocabulary's size, the data's size and source, the steps, the final loss, the
held-out τ and acceptance by position, the command line and specstrat's version.
:func:`load_draft_lm` refuses a file made for another target
(:class:`~specstrat.train.HeadMismatch`) and one that is not a whole draft LM
(``ModelLoadError`` naming the file).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.train.agreement import chained_conditional
from specstrat.train.artifact import (
    HeadMismatch,
    read_trained,
    run_facts,
    run_metadata,
    target_name,
    target_sha256,
)
from specstrat.train.capture import raw_model
from specstrat.train.draft_lm import DraftLM

__all__ = [
    "DRAFT_LM_FORMAT",
    "TrainedDraftLM",
    "draft_lm_metadata",
    "load_draft_lm",
    "save_draft_lm",
]

#: The ``format`` metadata value of a specstrat draft-LM file.
DRAFT_LM_FORMAT = "specstrat-draft-lm/1"
_HINT = "distil one for this model with `specstrat train --kind draft-lm`"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainedDraftLM:
    """A draft LM and what it was distilled on (the fields of
    :class:`~specstrat.train.TrainedHead`, for a :class:`~specstrat.train.DraftLM`)."""

    draft: DraftLM
    target: str
    target_sha256: str
    data_size: int
    data_source: str
    steps: int
    final_loss: float
    tau: float
    acceptance: tuple[float, ...] = ()
    command: str = ""

    @property
    def conditional(self) -> tuple[float | None, ...]:
        """Held-out acceptance (conditional) by position, from ``acceptance``."""
        return tuple(chained_conditional(self.acceptance))

    @property
    def layers(self) -> tuple[int, ...]:
        """The target layers the draft's layers started from."""
        return self.draft.layers


def save_draft_lm(path: str | os.PathLike[str], trained: TrainedDraftLM) -> Path:
    """``trained`` as one safetensors file at ``path`` (see the module docstring)."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous()
        for k, v in trained.draft.trainable().items()
    }
    d2t = trained.draft.get_buffer("d2t")
    tensors["d2t"] = d2t.detach().cpu().contiguous()
    metadata = {
        "format": DRAFT_LM_FORMAT,
        "layers": json.dumps(list(trained.layers)),
        "draft_vocab_size": str(d2t.numel()),
        **run_metadata(trained),
    }
    file = Path(path)
    save_file(tensors, str(file), metadata=metadata)
    return file


def draft_lm_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of the draft-LM file at ``path``, read without its tensors (a missing,
    unreadable or foreign file is a ``ModelLoadError`` naming it)."""
    return _read(Path(path), tensors=False)[1]


def _read(file: Path, *, tensors: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    return read_trained(
        file, format=DRAFT_LM_FORMAT, flag="draft", kind="draft LM", hint=_HINT, tensors=tensors
    )


def _layers(text: str | None, file: Path) -> tuple[int, ...]:
    """The metadata's ``layers``: a JSON list of ints (``ModelLoadError`` naming it otherwise)."""
    try:
        raw = json.loads(text or "")
    except ValueError:
        raw = None
    if not isinstance(raw, list) or not all(type(x) is int for x in raw):
        raise ModelLoadError(
            f"draft={str(file)!r} has metadata layers={text!r}, not a JSON list of layer indices; "
            f"save it again, or {_HINT}"
        )
    return tuple(raw)


def load_draft_lm(path: str | os.PathLike[str], target_model: Any) -> TrainedDraftLM:
    """The draft LM saved at ``path``, rebuilt on ``target_model`` (its embedding and LM-head
    rows are the target's; weights in the target's dtype and device). Refuses a file made for
    another model (:class:`~specstrat.train.HeadMismatch`) and one that is not whole
    (``ModelLoadError``)."""
    file = Path(path)
    tensors, meta = _read(file)
    ours = target_sha256(target_model)
    if meta.get("target_sha256") != ours:
        raise HeadMismatch(
            f"draft={str(file)!r} was distilled from target {meta.get('target')!r} (weights "
            f"sha256 {meta.get('target_sha256')}), but target {target_name(target_model)!r} "
            f"has weights sha256 {ours}; {_HINT}"
        )
    layers = _layers(meta.get("layers"), file)
    if "d2t" not in tensors:
        raise ModelLoadError(f"draft={str(file)!r} has no d2t tensor; save it again, or {_HINT}")
    try:
        with raw_model(target_model) as lm:
            draft = DraftLM.from_target(lm, layers, tensors.pop("d2t"))
    except InvalidConfig as exc:  # layers or d2t that do not fit this target
        raise ModelLoadError(f"draft={str(file)!r} does not fit this target: {exc}") from exc
    try:
        expected = set(draft.trainable())
        if set(tensors) != expected:
            raise ModelLoadError(
                f"draft={str(file)!r} lacks tensors {sorted(expected - set(tensors))} or has "
                f"unknown ones {sorted(set(tensors) - expected)}; save it again, or {_HINT}"
            )
        weight = next(draft.model.parameters())
        stored = {k: v.to(weight.device, weight.dtype) for k, v in tensors.items()}
        draft.model.load_state_dict(stored, strict=False)
        return TrainedDraftLM(draft=draft, **run_facts(meta, ours))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(
            f"draft={str(file)!r} has broken metadata or tensors ({type(exc).__name__}: {exc}); "
            f"save it again, or {_HINT}"
        ) from exc
