"""A trained head as one safetensors file, bound to the target it was trained for.

The file holds the head's weights in float16 storage, its ``d2t`` map (int64), and string
metadata: the format, the head's shape, the target's name and the sha256 of its weights, the
fused layers, the draft vocabulary size, the data's size and source, the training steps, the
final loss, the held-out τ and acceptance (unconditional) by position (the held-out agreement
of ``docs/glossary.md``), how its weights started (``start``), the command line and
specstrat's version. :func:`load_head` refuses
a head whose target hash differs from the model it is loaded for (:class:`HeadMismatch`) and a
file that is not a whole head (``ModelLoadError`` naming the file).

The target's hash reads every ``state_dict`` tensor in name order, rounded to bfloat16 (so the
model loaded in float32 or bfloat16 hashes alike), with its name and shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specstrat.errors import ModelLoadError
from specstrat.train.agreement import Agreement, chained_conditional
from specstrat.train.capture import raw_model
from specstrat.train.eagle3 import Eagle3Config, Eagle3DraftHead, Eagle3Head

__all__ = [
    "FORMAT",
    "HeadMismatch",
    "TrainedHead",
    "head_metadata",
    "load_head",
    "read_trained",
    "run_facts",
    "run_metadata",
    "save_head",
    "target_name",
    "target_sha256",
    "trained_fields",
]

#: The ``format`` metadata value of a specstrat head file.
FORMAT = "specstrat-eagle3-head/1"
_TRAIN_HINT = "train a head for this model with `specstrat train`"


class HeadMismatch(ModelLoadError):
    """A head file was trained for another target (its weights' sha256 differs from the model's
    it is loaded for); the message names both models, both hashes and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainedHead:
    """A head and what it was trained on: the ``target`` model's name and weights' sha256, the
    data (``data_size`` captured positions from ``data_source``), ``steps`` optimiser steps, the
    ``final_loss``, the held-out ``tau`` (NaN when none was measured) and ``acceptance``
    (unconditional) by position (:func:`~specstrat.train.evaluate`'s; empty when none was
    measured), the ``command``, and ``start``: how its weights began (``"random"``, or the
    target layer :func:`~specstrat.train.start_from_target` copied); :attr:`conditional`
    derives from ``acceptance``."""

    head: Eagle3Head
    target: str
    target_sha256: str
    data_size: int
    data_source: str
    steps: int
    final_loss: float
    tau: float
    acceptance: tuple[float, ...] = ()
    command: str = ""
    start: str = "random"

    @property
    def conditional(self) -> tuple[float | None, ...]:
        """Held-out acceptance (conditional) by position, from ``acceptance``
        (:func:`~specstrat.train.chained_conditional`)."""
        return tuple(chained_conditional(self.acceptance))

    @property
    def layers(self) -> tuple[int, ...]:
        """The target layers whose hidden states the head fuses."""
        return self.head.config.layers

    @property
    def d2t(self) -> torch.Tensor:
        """The draft vocabulary: draft id -> target id, ``[N]`` int64."""
        return self.head.get_buffer("d2t")

    def draft_head(self, vocab_size: int | None = None) -> Eagle3DraftHead:
        """The head as a :class:`~specstrat.models.DraftHead` over ``vocab_size`` target ids."""
        return self.head.draft_head(vocab_size)


def target_name(model: Any) -> str:
    """A model's name for messages: an HFCausalLM's ``name``, else its config's path."""
    name = getattr(model, "name", None)
    if isinstance(name, str) and name:
        return name
    config = getattr(model, "config", None)
    return str(getattr(config, "_name_or_path", "") or type(model).__name__)


def target_sha256(model: Any) -> str:
    """The sha256 of a target's weights (see the module docstring): an
    :class:`~specstrat.hf.HFCausalLM` or a transformers model."""
    digest = hashlib.sha256()
    with raw_model(model) as lm:
        state = lm.state_dict()
        for name in sorted(state):
            tensor = state[name].detach()
            rounded = tensor.to("cpu", torch.bfloat16).contiguous().reshape(-1)
            digest.update(f"{name}:{tuple(tensor.shape)}\n".encode())
            digest.update(rounded.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def run_metadata(trained: Any) -> dict[str, str]:
    """The metadata every trained file carries, from a :class:`TrainedHead` or a
    :class:`~specstrat.train.TrainedDraftLM`: the target, the data, the training, the held-out
    agreement, the command and specstrat's version."""
    import specstrat

    return {
        "target": trained.target,
        "target_sha256": trained.target_sha256,
        "data_size": str(trained.data_size),
        "data_source": trained.data_source,
        "steps": str(trained.steps),
        "final_loss": repr(trained.final_loss),
        "tau": repr(trained.tau),
        "acceptance": json.dumps(list(trained.acceptance)),
        "command": trained.command,
        "specstrat_version": specstrat.__version__,
    }


def run_facts(meta: dict[str, str], target_sha256: str) -> dict[str, Any]:
    """The fields :func:`run_metadata` wrote, read back for the trained file's dataclass
    (``KeyError`` or ``ValueError`` where metadata is missing or broken)."""
    return {
        "target": meta["target"],
        "target_sha256": target_sha256,
        "data_size": int(meta["data_size"]),
        "data_source": meta["data_source"],
        "steps": int(meta["steps"]),
        "final_loss": float(meta["final_loss"]),
        "tau": float(meta["tau"]),
        "acceptance": tuple(float(a) for a in json.loads(meta.get("acceptance", "[]"))),
        "command": meta.get("command", ""),
    }


def trained_fields(
    target: tuple[str, str],
    data: tuple[int, str],
    fitted: tuple[int, float],
    agreement: Agreement | None,
    command: str,
) -> dict[str, Any]:
    """A finished run's fields for its trained file's dataclass: ``target`` (name, sha256),
    ``data`` (positions, source), ``fitted`` (steps, final loss), the held-out ``agreement``
    (None: not measured) and the ``command``."""
    return {
        "target": target[0],
        "target_sha256": target[1],
        "data_size": data[0],
        "data_source": data[1],
        "steps": fitted[0],
        "final_loss": fitted[1],
        "tau": agreement["tau"] if agreement else math.nan,
        "acceptance": tuple(agreement["acceptance"]) if agreement else (),
        "command": command,
    }


def save_head(path: str | os.PathLike[str], trained: TrainedHead) -> Path:
    """``trained`` as one safetensors file at ``path`` (see the module docstring); returns it."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous()
        for k, v in trained.head.state_dict().items()
        if k != "d2t"
    }
    tensors["d2t"] = trained.d2t.detach().cpu().contiguous()
    config = trained.head.config
    metadata = {
        "format": FORMAT,
        "config": json.dumps(dataclasses.asdict(config)),
        "layers": json.dumps(list(config.layers)),
        "draft_vocab_size": str(config.draft_vocab_size),
        "start": trained.start,
        **run_metadata(trained),
    }
    file = Path(path)
    save_file(tensors, str(file), metadata=metadata)
    return file


def head_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The metadata of the head file at ``path``, read without its tensors: a missing or
    unreadable file, or one that is not a specstrat head, is a ``ModelLoadError`` naming it
    (the CLI checks ``--head`` so before it loads a model)."""
    return _read(Path(path), tensors=False)[1]


def read_trained(
    file: Path, *, format: str, flag: str, kind: str, hint: str, tensors: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors (none unless ``tensors``) and metadata of a trained file of ``format`` at
    ``file``; a missing, unreadable or foreign file is a ``ModelLoadError`` that names it as
    ``flag=...``, says it is not a specstrat ``kind`` and ends with ``hint``."""
    from safetensors import safe_open

    if not file.is_file():
        raise ModelLoadError(f"{flag}={str(file)!r}: no such file; {hint}")
    try:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata() or {}
            names = list(f.keys()) if tensors else []
            found = {k: f.get_tensor(k) for k in names}
    except Exception as exc:  # safetensors raises its own error types (and OSError)
        raise ModelLoadError(
            f"{flag}={str(file)!r} is not a readable safetensors file ({type(exc).__name__}: "
            f"{exc}); it may be truncated: save it again, or {hint}"
        ) from exc
    if metadata.get("format") != format:
        raise ModelLoadError(
            f"{flag}={str(file)!r} is a safetensors file but not a specstrat {kind} "
            f"(format={metadata.get('format')!r}, expected {format!r}); {hint}"
        )
    return found, metadata


def _read(file: Path, *, tensors: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if not file.is_file():  # the head's own fix: a file save_head wrote
        raise ModelLoadError(f"head={str(file)!r}: no such file; pass a head saved by save_head")
    return read_trained(
        file, format=FORMAT, flag="head", kind="head", hint=_TRAIN_HINT, tensors=tensors
    )


def load_head(path: str | os.PathLike[str], target_model: Any) -> TrainedHead:
    """The head saved at ``path``, bound to ``target_model`` (its embedding is the target's; the
    weights come back in float32). Refuses a head trained for another model
    (:class:`HeadMismatch`) and a file that is not a whole head (``ModelLoadError``)."""
    file = Path(path)
    tensors, meta = _read(file)
    ours = target_sha256(target_model)
    if meta.get("target_sha256") != ours:
        raise HeadMismatch(
            f"head={str(file)!r} was trained for target {meta.get('target')!r} (weights sha256 "
            f"{meta.get('target_sha256')}), but target {target_name(target_model)!r} has "
            f"weights sha256 {ours}; {_TRAIN_HINT}"
        )
    try:
        raw = json.loads(meta["config"])
        config = Eagle3Config(**{**raw, "layers": tuple(raw["layers"])})
        with raw_model(target_model) as lm:
            embed = lm.get_input_embeddings().weight.detach().cpu()
        head = Eagle3Head(config, tensors.pop("d2t"), embed)
        head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
        missing = set(head.state_dict()) - {"d2t"} - set(tensors)
        unexpected = set(tensors) - set(head.state_dict())
        if missing or unexpected:
            raise ModelLoadError(
                f"head={str(file)!r} lacks tensors {sorted(missing)} or has unknown ones "
                f"{sorted(unexpected)}; it is incomplete: save it again, or {_TRAIN_HINT}"
            )
        start = meta.get("start", "random")  # heads saved before the key started at random
        return TrainedHead(head=head, start=start, **run_facts(meta, ours))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(
            f"head={str(file)!r} has broken metadata or tensors ({type(exc).__name__}: {exc}); "
            f"save it again, or {_TRAIN_HINT}"
        ) from exc
