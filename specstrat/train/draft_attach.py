"""A distilled draft LM attached to a loaded Hugging Face model, so STANDALONE runs it (and a
block drafter, so DFLASH and DSPARK run it: :func:`attach_block`, :func:`block_for`).

:func:`attach_draft` loads a draft-LM file for ``models.target`` (refused for another target by
:class:`~specstrat.train.HeadMismatch`) and sets ``models.draft`` to it (a
:class:`~specstrat.train.DraftVocabLM`, in the target's dtype and device). The attacher joins
``models.attach`` (after a head's attacher, when one is there), so the prefill process of
disaggregation replays both after loading the same model.

:func:`draft_for` is the CLI's rule for which draft LM a run attaches: ``--draft FILE`` when
given, else the one the package ships for ``--model`` (:data:`SHIPPED_DRAFTS`) when an
algorithm's drafter drafts with it (:func:`reads_draft_lm`), else none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig
from specstrat.hf import HFModels
from specstrat.train.attach import chained, file_for, shipped_file
from specstrat.train.block_lm import BlockLM
from specstrat.train.draft_lm import DraftLM
from specstrat.train.draft_lm_file import (
    block_lm_metadata,
    draft_lm_metadata,
    load_block_lm,
    load_draft_lm,
)

__all__ = [
    "SHIPPED_BLOCKS",
    "SHIPPED_DRAFTS",
    "BlockAttacher",
    "DraftAttacher",
    "attach_block",
    "attach_draft",
    "attach_files",
    "block_for",
    "draft_for",
    "reads_block",
    "reads_draft_lm",
    "shipped_draft",
    "trained_files",
]

#: The draft LMs the package ships (in ``specstrat/train/heads/``), by the ``--model`` name of
#: the target each was distilled from; docs/real-models.md records how each was made.
SHIPPED_DRAFTS: Mapping[str, str] = MappingProxyType({"smollm2": "smollm2-draft-lm.safetensors"})
#: The block drafters the package ships, by the ``--model`` name of their target.
SHIPPED_BLOCKS: Mapping[str, str] = MappingProxyType({"smollm2": "smollm2-block.safetensors"})


def shipped_draft(model: str) -> Path | None:
    """The draft-LM file the package ships for ``--model model`` (None without one)."""
    return shipped_file(SHIPPED_DRAFTS, model)


def _reads(algo: SpecAlgorithm[Any], kind: type) -> bool:
    """Whether ``algo``'s drafter, or a member of its composition (``members``), is a
    ``kind``."""

    def reads(drafter: Any) -> bool:
        members = getattr(drafter, "members", None)
        if isinstance(members, tuple):
            return any(reads(m) for m in members)
        return isinstance(drafter, kind)

    return reads(algo.drafter)


def reads_block(algo: SpecAlgorithm[Any]) -> bool:
    """Whether ``algo``'s drafter drafts with ``models.block``: a
    :class:`~specstrat.strategies.BlockDrafterFactory` (DFLASH, DSPARK), alone or as a member
    of a composition."""
    from specstrat.strategies import BlockDrafterFactory

    return _reads(algo, BlockDrafterFactory)


def reads_draft_lm(algo: SpecAlgorithm[Any]) -> bool:
    """Whether ``algo``'s drafter drafts with ``models.draft``: a
    :class:`~specstrat.strategies.DraftModelDrafterFactory`, alone or as a member of a
    composition (``members``). ``DrafterNeeds.draft_model`` says less: early exit and the block
    drafters declare it too, for a draft KV cache of their own, and never read the draft LM."""
    from specstrat.strategies import DraftModelDrafterFactory

    return _reads(algo, DraftModelDrafterFactory)


def draft_for(
    model: str, draft: str | None, algorithms: Iterable[SpecAlgorithm[Any] | str]
) -> str | None:
    """The draft-LM file a CLI run on ``--model model`` attaches (see the module docstring),
    checked to be a readable draft-LM file before any model loads (``ModelLoadError`` naming
    it); algorithm names are looked up in the default registry."""
    return file_for(
        model,
        draft,
        algorithms,
        table=SHIPPED_DRAFTS,
        wanted=reads_draft_lm,
        check=draft_lm_metadata,
    )


def block_for(
    model: str, block: str | None, algorithms: Iterable[SpecAlgorithm[Any] | str]
) -> str | None:
    """The block-drafter file a CLI run on ``--model model`` attaches: ``--block FILE`` when
    given, else the one the package ships (:data:`SHIPPED_BLOCKS`) when an algorithm drafts
    with it (:func:`reads_block`), else none; checked before any model loads."""
    return file_for(
        model, block, algorithms, table=SHIPPED_BLOCKS, wanted=reads_block, check=block_lm_metadata
    )


def trained_files(
    model: str,
    head: str | None,
    draft: str | None,
    block: str | None,
    algorithms: Iterable[SpecAlgorithm[Any] | str],
) -> tuple[str | None, str | None, str | None]:
    """The head, draft-LM and block-drafter files a CLI run on ``--model model`` attaches
    (:func:`~specstrat.train.head_for`, :func:`draft_for`, :func:`block_for`: the given file,
    else the shipped one an algorithm drafts with), each checked before any model loads."""
    from specstrat.train.attach import head_for

    algos = list(algorithms)
    return (
        head_for(model, head, algos),
        draft_for(model, draft, algos),
        block_for(model, block, algos),
    )


@dataclass(frozen=True, slots=True)
class BlockAttacher:
    """Attaches the block drafter saved at ``path`` as ``models.block`` (picklable)."""

    path: str

    def __call__(self, models: HFModels) -> HFModels:
        """``models`` with the block drafter as ``models.block``."""
        if models.block is not None:
            raise InvalidConfig(
                f"block={self.path!r}: the models already have a block drafter; attach one to "
                "a freshly loaded model"
            )
        target = models.target
        block = _on_target(load_block_lm(self.path, target).draft, target)
        assert isinstance(block, BlockLM)  # load_block_lm builds one
        name = f"{target.name} block drafter ({Path(self.path).name})"
        return replace(
            models,
            block=block.causal_lm(name, target.shape.vocab_size),
            attach=chained(models.attach, self),
        )


def attach_block(models: HFModels, path: str | os.PathLike[str]) -> HFModels:
    """``models`` running the block drafter saved at ``path`` (``specstrat train --kind block
    --out``): DFLASH's and DSPARK's drafter reads it through ``models.block``."""
    return BlockAttacher(str(Path(path)))(models)


@dataclass(frozen=True, slots=True)
class DraftAttacher:
    """Attaches the draft LM saved at ``path`` (picklable: it travels to the prefill process)."""

    path: str

    def __call__(self, models: HFModels) -> HFModels:
        """``models`` with the draft LM as ``models.draft`` (see the module docstring)."""
        if models.draft is not None:
            raise InvalidConfig(
                f"draft={self.path!r}: the models already have a draft LM; attach one draft LM "
                "to a freshly loaded model"
            )
        target = models.target
        draft = _on_target(load_draft_lm(self.path, target).draft, target)
        name = f"{target.name} draft LM ({Path(self.path).name})"
        return replace(
            models,
            draft=draft.causal_lm(name, target.shape.vocab_size),
            attach=chained(models.attach, self),
        )


def _on_target(draft: DraftLM, target: Any) -> DraftLM:
    """``draft`` moved to ``target``'s device and dtype (what the engine runs both in)."""
    weight = next(target.parameters())
    return draft.to(device=weight.device, dtype=weight.dtype)


def attach_draft(models: HFModels, path: str | os.PathLike[str]) -> HFModels:
    """``models`` running the draft LM saved at ``path`` (``specstrat train --kind draft-lm
    --out``): STANDALONE's drafter reads it through ``models.draft``."""
    return DraftAttacher(str(Path(path)))(models)


def attach_files(
    models: HFModels, head: str | None, draft: str | None, block: str | None = None
) -> HFModels:
    """``models`` with the head file ``head``, the draft-LM file ``draft`` and the block-drafter
    file ``block`` attached (each may be None: nothing of that kind), in that order."""
    from specstrat.train.attach import attach_head

    if head is not None:
        models = attach_head(models, head)
    if draft is not None:
        models = attach_draft(models, draft)
    return models if block is None else attach_block(models, block)
