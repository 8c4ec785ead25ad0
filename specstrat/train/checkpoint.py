"""A training run's checkpoint: what :func:`~specstrat.train.train_head` needs to continue a run
where it stopped, written after each epoch.

One ``torch.save`` file (read back with ``weights_only=True``) holds the :class:`HeadConfig`, the
target's name and weights' sha256, the captured training and held-out data (so a resumed run
does not generate them again; the file is about as large as that data in memory), the head's
weights, AdamW's state, the shuffling generator's state, the epochs and steps done and the
recent losses. It is written beside the finished file and renamed over the old one, so an
interrupted write leaves the previous epoch's checkpoint whole.

A resumed run with the same config and target ends with the weights an uninterrupted run ends
with. Resuming is refused (:class:`~specstrat.errors.InvalidConfig`, naming the field) when a
config field that shapes the data or the training differs; ``budget_seconds`` and
``eval_depth`` may differ (a resumed run's budget counts from the resume, for training only).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.train.artifact import HeadMismatch
from specstrat.train.capture import CapturedData, CapturedSequence
from specstrat.train.self_written import given_source

__all__ = ["CHECKPOINT_FORMAT", "MAY_DIFFER", "Checkpoint", "read_checkpoint", "save_checkpoint"]

#: The ``format`` entry of a checkpoint file.
CHECKPOINT_FORMAT = "specstrat-train-checkpoint/2"
#: The HeadConfig fields a resumed run may change.
MAY_DIFFER = frozenset({"budget_seconds", "eval_depth"})
_FIX = "pass the checkpoint the same run wrote, or start afresh without --resume"


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A run's state after ``epoch`` whole epochs (``step`` optimiser steps): the ``config``
    (a :class:`~specstrat.train.HeadConfig`'s fields), the ``target``'s name and weights'
    ``target_sha256``, the training ``data`` and ``held``-out data, the ``head``'s state dict,
    the ``optimizer``'s, the shuffling generator's state (``order``) and the ``recent`` losses
    the final loss averages; ``file``, where it was read from (for messages; not stored)."""

    config: dict[str, Any]
    target: str
    target_sha256: str
    data: CapturedData
    held: CapturedData
    head: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    order: torch.Tensor
    epoch: int
    step: int
    recent: tuple[float, ...]
    file: str = ""

    def check_resumes(self, config: Any, source: str) -> None:
        """Refuses (:class:`~specstrat.errors.InvalidConfig`) a run whose ``config`` (a
        HeadConfig) or prompt ``source`` differs from this checkpoint's where it matters. A
        setting the checkpoint does not record (written before the setting existed) counts as
        its default."""
        where = self.file
        ours, theirs = _config_dict(config), {**_config_dict(type(config)()), **self.config}
        changed = [k for k in sorted(ours) if k not in MAY_DIFFER and ours[k] != theirs.get(k)]
        if changed:
            diffs = ", ".join(f"{k}={theirs.get(k)!r} (this run: {ours[k]!r})" for k in changed)
            raise InvalidConfig(
                f"resume={where!r} was written with HeadConfig {diffs}; rerun with the "
                f"checkpoint's values, or {_FIX}"
            )
        if source != given_source(self.data.source):
            raise InvalidConfig(
                f"resume={where!r} holds data from prompts {self.data.source!r}, but this run's "
                f"prompts are {source!r}; pass the same prompts, or {_FIX}"
            )

    def check_target(self, name: str, digest: str, flag: str = "resume") -> None:
        """Refuses (:class:`~specstrat.train.HeadMismatch`) a target whose weights' sha256
        ``digest`` is not the one this checkpoint was trained for (``flag``: the option that
        named the checkpoint, ``resume`` or ``data``)."""
        if digest != self.target_sha256:
            fix = _FIX if flag == "resume" else f"drop --{flag} to generate this model's own"
            raise HeadMismatch(
                f"{flag}={self.file!r} was written for target {self.target!r} (weights sha256 "
                f"{self.target_sha256}), but target {name!r} has weights sha256 {digest}; "
                f"pass the model it was written for, or {fix}"
            )


def _config_dict(config: Any) -> dict[str, Any]:
    """A HeadConfig's fields as JSON values (``layers`` a list)."""
    loaded: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(config)))
    return loaded


def _data(data: CapturedData) -> dict[str, Any]:
    return {
        "layers": list(data.layers),
        "d2t": data.d2t,
        "lm_rows": data.lm_rows,
        "lm_bias": data.lm_bias,
        "source": data.source,
        "sequences": [
            {
                "features": s.features,
                "tokens": s.tokens,
                "final": s.final,
                "greedy": s.greedy,
                "start": s.start,
                "context": s.context,
            }
            for s in data.sequences
        ],
    }


def _undata(raw: dict[str, Any]) -> CapturedData:
    sequences = tuple(
        CapturedSequence(
            features=s["features"],
            tokens=s["tokens"],
            final=s["final"],
            greedy=s["greedy"],
            start=int(s["start"]),
            context=int(s.get("context", 0)),
        )
        for s in raw["sequences"]
    )
    return CapturedData(
        sequences=sequences,
        layers=tuple(raw["layers"]),
        d2t=raw["d2t"],
        lm_rows=raw["lm_rows"],
        lm_bias=raw["lm_bias"],
        source=raw["source"],
    )


def save_checkpoint(path: str | os.PathLike[str], checkpoint: Checkpoint) -> Path:
    """``checkpoint`` at ``path``, written aside and renamed over it; returns the path."""
    file = Path(path)
    document = {
        "format": CHECKPOINT_FORMAT,
        "config": json.dumps(checkpoint.config),
        "target": checkpoint.target,
        "target_sha256": checkpoint.target_sha256,
        "data": _data(checkpoint.data),
        "held": _data(checkpoint.held),
        "head": checkpoint.head,
        "optimizer": checkpoint.optimizer,
        "order": checkpoint.order,
        "epoch": checkpoint.epoch,
        "step": checkpoint.step,
        "recent": list(checkpoint.recent),
    }
    aside = file.with_name(file.name + ".partial")
    torch.save(document, aside)
    os.replace(aside, file)
    return file


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint at ``path``; a missing, unreadable or foreign file is a
    :class:`~specstrat.errors.ModelLoadError` naming it."""
    file = Path(path)
    where = str(file)
    if not file.is_file():
        raise ModelLoadError(
            f"resume={where!r}: no such file; pass the .ckpt file a `specstrat train` run wrote "
            "beside its --out"
        )
    try:
        raw = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise ModelLoadError(
            f"resume={where!r} is not a readable checkpoint ({type(exc).__name__}); it may be "
            f"truncated: {_FIX}"
        ) from exc
    if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ModelLoadError(
            f"resume={where!r} is not a specstrat training checkpoint (format={found!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); {_FIX}"
        )
    try:
        return Checkpoint(
            config=json.loads(raw["config"]),
            target=raw["target"],
            target_sha256=raw["target_sha256"],
            data=_undata(raw["data"]),
            held=_undata(raw["held"]),
            head=raw["head"],
            optimizer=raw["optimizer"],
            order=raw["order"],
            epoch=int(raw["epoch"]),
            step=int(raw["step"]),
            recent=tuple(float(x) for x in raw["recent"]),
            file=where,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"resume={where!r} lacks or breaks an entry ({type(exc).__name__}: {exc}); {_FIX}"
        ) from exc
