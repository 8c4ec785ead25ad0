"""A distilled draft LM (or a block drafter) as one safetensors file, bound to its target.

The file stores only what cannot be derived from the target: the draft's decoder layers and
final norm (float16 storage) and its ``d2t`` map (int64). The embedding and the LM-head rows are
the loaded target's. Its string metadata is a head file's (:mod:`~specstrat.train.artifact`):
the format, the target's name and weights' sha256, the target layers the draft started from,
the draft vocabulary's size, the data's size and source, the steps, the final loss, the
held-out τ and acceptance by position, the command line and specstrat's version.
:func:`load_draft_lm` refuses a file made for another target
(:class:`~specstrat.train.HeadMismatch`) and one that is not a whole draft LM
(``ModelLoadError`` naming the file). A block drafter's file
(:class:`~specstrat.train.BlockLM`, format ``specstrat-block-lm/1``) adds its placeholders'
tensor and their count (metadata ``block``); :func:`load_block_lm` reads it.
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
from specstrat.train.block_lm import BLOCK_LM_FORMAT, BlockLM
from specstrat.train.capture import raw_model
from specstrat.train.draft_lm import DraftLM

__all__ = [
    "DRAFT_LM_FORMAT",
    "TrainedDraftLM",
    "block_lm_metadata",
    "draft_lm_metadata",
    "load_block_lm",
    "load_draft_lm",
    "save_draft_lm",
]

#: The ``format`` metadata value of a specstrat draft-LM file.
DRAFT_LM_FORMAT = DraftLM.format
_HINT = "distil one for this model with `specstrat train --kind draft-lm`"
_BLOCK_HINT = "train one for this model with `specstrat train --kind block`"


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
    """``trained`` as one safetensors file at ``path`` (see the module docstring; a
    :class:`~specstrat.train.BlockLM` writes the block-drafter format and its placeholders)."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous()
        for k, v in trained.draft.trainable().items()
    }
    d2t = trained.draft.get_buffer("d2t")
    tensors["d2t"] = d2t.detach().cpu().contiguous()
    metadata = {
        "format": trained.draft.format,
        "layers": json.dumps(list(trained.layers)),
        "draft_vocab_size": str(d2t.numel()),
        **trained.draft.file_metadata(),
        **run_metadata(trained),
    }
    file = Path(path)
    save_file(tensors, str(file), metadata=metadata)
    return file


def draft_lm_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of the draft-LM file at ``path``, read without its tensors (a missing,
    unreadable or foreign file is a ``ModelLoadError`` naming it)."""
    return _read(Path(path), tensors=False)[1]


def block_lm_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of the block-drafter file at ``path``, read without its tensors (a
    missing, unreadable or foreign file is a ``ModelLoadError`` naming it)."""
    return _read(Path(path), tensors=False, block=True)[1]


def _read(
    file: Path, *, tensors: bool = True, block: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if block:
        return read_trained(
            file,
            format=BLOCK_LM_FORMAT,
            flag="block",
            kind="block drafter",
            hint=_BLOCK_HINT,
            tensors=tensors,
        )
    return read_trained(
        file, format=DRAFT_LM_FORMAT, flag="draft", kind="draft LM", hint=_HINT, tensors=tensors
    )


def _block(text: str | None, file: Path, hint: str) -> int:
    """The metadata's ``block``: an int >= 1 (``ModelLoadError`` naming it otherwise)."""
    if text is None or not text.isdigit() or int(text) < 1:
        raise ModelLoadError(
            f"block={str(file)!r} has metadata block={text!r}, not a count of placeholders >= "
            f"1; save it again, or {hint}"
        )
    return int(text)


def _layers(text: str | None, file: Path, flag: str, hint: str) -> tuple[int, ...]:
    """The metadata's ``layers``: a JSON list of ints (``ModelLoadError`` naming it otherwise)."""
    try:
        raw = json.loads(text or "")
    except ValueError:
        raw = None
    if not isinstance(raw, list) or not all(type(x) is int for x in raw):
        raise ModelLoadError(
            f"{flag}={str(file)!r} has metadata layers={text!r}, not a JSON list of layer "
            f"indices; save it again, or {hint}"
        )
    return tuple(raw)


def load_draft_lm(path: str | os.PathLike[str], target_model: Any) -> TrainedDraftLM:
    """The draft LM saved at ``path``, rebuilt on ``target_model`` (its embedding and LM-head
    rows are the target's; weights in the target's dtype and device). Refuses a file made for
    another model (:class:`~specstrat.train.HeadMismatch`) and one that is not whole
    (``ModelLoadError``)."""
    return _load(Path(path), target_model, block=False)


def load_block_lm(path: str | os.PathLike[str], target_model: Any) -> TrainedDraftLM:
    """The block drafter saved at ``path`` (``specstrat train --kind block``), rebuilt on
    ``target_model`` as :func:`load_draft_lm` rebuilds a draft LM; its ``draft`` is a
    :class:`~specstrat.train.BlockLM`."""
    return _load(Path(path), target_model, block=True)


def _load(file: Path, target_model: Any, *, block: bool) -> TrainedDraftLM:
    flag, hint = ("block", _BLOCK_HINT) if block else ("draft", _HINT)
    what = "trained for" if block else "distilled from"
    tensors, meta = _read(file, block=block)
    ours = target_sha256(target_model)
    if meta.get("target_sha256") != ours:
        raise HeadMismatch(
            f"{flag}={str(file)!r} was {what} target {meta.get('target')!r} (weights "
            f"sha256 {meta.get('target_sha256')}), but target {target_name(target_model)!r} "
            f"has weights sha256 {ours}; {hint}"
        )
    layers = _layers(meta.get("layers"), file, flag, hint)
    width = _block(meta.get("block"), file, hint) if block else 0
    if "d2t" not in tensors:
        raise ModelLoadError(f"{flag}={str(file)!r} has no d2t tensor; save it again, or {hint}")
    try:
        with raw_model(target_model) as lm:
            d2t = tensors.pop("d2t")
            draft = (
                BlockLM.from_target(lm, layers, d2t, block=width)
                if block
                else DraftLM.from_target(lm, layers, d2t)
            )
    except InvalidConfig as exc:  # layers or d2t that do not fit
        raise ModelLoadError(f"{flag}={str(file)!r} does not fit this target: {exc}") from exc
    try:
        expected = set(draft.trainable())
        if set(tensors) != expected:
            raise ModelLoadError(
                f"{flag}={str(file)!r} lacks tensors {sorted(expected - set(tensors))} or has "
                f"unknown ones {sorted(set(tensors) - expected)}; save it again, or {hint}"
            )
        weight = next(draft.model.parameters())
        stored = {k: v.to(weight.device, weight.dtype) for k, v in tensors.items()}
        draft.model.load_state_dict(stored, strict=False)
        return TrainedDraftLM(draft=draft, **run_facts(meta, ours))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(
            f"{flag}={str(file)!r} has broken metadata or tensors ({type(exc).__name__}: {exc}); "
            f"save it again, or {hint}"
        ) from exc
