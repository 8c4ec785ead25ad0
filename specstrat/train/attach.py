"""A trained head attached to a loaded Hugging Face model, so the engine's EAGLE drafters run it.

:func:`attach_head` loads a head file for ``models.target`` (refused for another target by
:class:`~specstrat.train.artifact.HeadMismatch`), switches the target to return the fused
outputs of the head's layers as its hidden state (:meth:`HFCausalLM.with_feature_layers`: what
the head reads at prefill and after each verify) and sets ``models.head``. The attacher is
recorded in ``models.attach``, so the prefill process of disaggregation attaches the same head
after loading the same model.

:func:`head_for` is the CLI's one rule for which head a run attaches: ``--head FILE`` when given,
else the head the package ships for ``--model`` (:data:`SHIPPED_HEADS`) when an algorithm's
drafter declares it runs a draft head (``DrafterNeeds.draft_head``), else none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig
from specstrat.hf import HFModels
from specstrat.train.artifact import head_metadata, load_head

__all__ = [
    "SHIPPED_HEADS",
    "Attachers",
    "HeadAttacher",
    "attach_head",
    "chained",
    "file_for",
    "head_for",
    "shipped_file",
    "shipped_head",
]

#: The heads the package ships (in ``specstrat/train/heads/``), by the ``--model`` name of the
#: target each was trained for; docs/real-models.md records how each was made.
SHIPPED_HEADS: Mapping[str, str] = MappingProxyType({"smollm2": "smollm2-eagle3.safetensors"})


def shipped_file(table: Mapping[str, str], model: str) -> Path | None:
    """The file ``table`` names for ``--model model`` in ``specstrat/train/heads/`` (None for
    a model without one, or an installation that left the file out)."""
    name = table.get(model)
    path = None if name is None else Path(__file__).with_name("heads") / name
    return path if path is not None and path.is_file() else None


def file_for(
    model: str,
    given: str | None,
    algorithms: Iterable[SpecAlgorithm[Any] | str],
    *,
    table: Mapping[str, str],
    wanted: Callable[[SpecAlgorithm[Any]], bool],
    check: Callable[[str], object],
) -> str | None:
    """The CLI's one rule for a trained file: ``given`` when set, else the one ``table`` ships
    for ``model`` when ``wanted`` holds for an algorithm (names looked up in the default
    registry), else none; the file is ``check``-ed before any model loads."""
    from specstrat.registry import default_registry

    if given is None:
        algos = [default_registry().get(a) if isinstance(a, str) else a for a in algorithms]
        found = shipped_file(table, model)
        given = str(found) if found is not None and any(wanted(a) for a in algos) else None
    if given is not None:
        check(given)
    return given


def shipped_head(model: str) -> Path | None:
    """The head file the package ships for ``--model model`` (None without one)."""
    return shipped_file(SHIPPED_HEADS, model)


def head_for(
    model: str, head: str | None, algorithms: Iterable[SpecAlgorithm[Any] | str]
) -> str | None:
    """The head file a CLI run on ``--model model`` attaches (see the module docstring),
    checked to be a readable head file before any model loads (``ModelLoadError`` naming it);
    algorithm names are looked up in the default registry."""
    return file_for(
        model,
        head,
        algorithms,
        table=SHIPPED_HEADS,
        wanted=lambda a: a.drafter.needs.draft_head,
        check=head_metadata,
    )


@dataclass(frozen=True, slots=True)
class Attachers:
    """Attachers replayed in order (picklable when each is): a head's and a draft LM's."""

    steps: tuple[Callable[[HFModels], HFModels], ...]

    def __call__(self, models: HFModels) -> HFModels:
        """``models`` after each attacher in turn, recording all of them."""
        for step in self.steps:
            models = step(models)
        return replace(models, attach=self)


def chained(
    earlier: Callable[[HFModels], HFModels] | None, step: Callable[[HFModels], HFModels]
) -> Callable[[HFModels], HFModels]:
    """What ``models.attach`` records once ``step`` ran after ``earlier`` (the models' attach
    before it): ``step`` alone, or every attacher in order."""
    if earlier is None:
        return step
    before = earlier.steps if isinstance(earlier, Attachers) else (earlier,)
    return Attachers((*before, step))


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
            attach=chained(models.attach, self),
        )


def attach_head(models: HFModels, path: str | os.PathLike[str]) -> HFModels:
    """``models`` running the head saved at ``path`` (``specstrat train --out``): the EAGLE
    drafters (``EAGLE``, ``EAGLE3``, a ``TopkTree``) read it through ``models.head``."""
    return HeadAttacher(str(Path(path)))(models)
