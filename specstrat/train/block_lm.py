"""A block drafter for a Hugging Face target, for DFLASH and DSPARK: a few of the target's own
decoder layers that read placeholder tokens, so one forward proposes a whole block of drafts.

:meth:`BlockLM.from_target` builds one as :meth:`~specstrat.train.DraftLM.from_target` builds a
draft LM (a transformers model of the target's class, its layers initialised from the target
layers ``layers`` names, the target's embedding shared and frozen, an LM head over the draft
vocabulary with the target's rows, copied and frozen), plus ``block`` learned placeholder
embeddings. Input id ``rows + k - 1`` (``rows``: the target embedding's rows) is the placeholder
for offset ``k``: at absolute position ``p`` it predicts the token *at* ``p``, the ``k``-th after
the anchor, from the context up to the anchor and the placeholders before it
(:class:`~specstrat.models.BlockDraftModel`'s contract). The layers, the final norm and the
placeholders train, so a file stores only those (:func:`~specstrat.train.save_draft_lm`, format
``specstrat-block-lm/1``).

:func:`block_batch` lays out a training batch: each sequence's tokens, then ``anchors`` blocks of
``block`` placeholders, one block per anchor, under a mask where a placeholder sees the context up
to its anchor and its block's earlier placeholders (the rows the engine's TARGET_VERIFY forward
gives it), so one forward trains every anchor of a sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.train.capture import CapturedData, CapturedSequence
from specstrat.train.draft_lm import DraftLM, DraftVocabLM

__all__ = [
    "BLOCK_LM_FORMAT",
    "BlockBatch",
    "BlockLM",
    "BlockVocabLM",
    "PlaceholderEmbedding",
    "block_batch",
    "block_targets",
    "default_block_layers",
]

#: The ``format`` metadata value of a specstrat block-drafter file.
BLOCK_LM_FORMAT = "specstrat-block-lm/1"


def default_block_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers a block drafter starts from: the first and the last
    (``(0, L - 1)``; ``(0,)`` for a one-layer target)."""
    if not is_int(num_layers) or num_layers < 1:
        raise InvalidConfig(f"num_layers={num_layers!r} must be an int >= 1")
    return tuple(sorted({0, num_layers - 1}))


class PlaceholderEmbedding(nn.Module):
    """The target's input embedding (frozen) with ``block`` learned rows after it: id
    ``rows + k - 1`` is the placeholder for offset ``k``."""

    def __init__(self, embed: torch.Tensor, block: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding.from_pretrained(embed, freeze=True)  # type: ignore[no-untyped-call]
        start = embed.float().mean(0, keepdim=True).expand(block, -1).to(embed.dtype)
        self.placeholders = nn.Parameter(start.clone())

    @property
    def weight(self) -> torch.Tensor:
        """The target's embedding rows, as transformers reads an input embedding's weight (the
        placeholders are :attr:`placeholders`)."""
        weight: torch.Tensor = self.tokens.weight
        return weight

    @property
    def rows(self) -> int:
        """The target's token ids (the first placeholder's id)."""
        return int(self.tokens.num_embeddings)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[.., H]`` of token and placeholder ``ids``."""
        rows = self.rows
        held = ids >= rows
        blank = self.placeholders[(ids - rows).clamp(0, self.placeholders.shape[0] - 1)]
        own: torch.Tensor = self.tokens(ids.clamp(max=rows - 1))
        return torch.where(held[..., None], blank, own)


class BlockLM(DraftLM):
    """The trainable block drafter (see the module docstring): a :class:`DraftLM` whose input
    embedding is a :class:`PlaceholderEmbedding` of ``block`` placeholders."""

    format = BLOCK_LM_FORMAT

    @classmethod
    def from_target(
        cls,
        target: Any,
        layers: Sequence[int],
        d2t: torch.Tensor,
        vocab_size: int | None = None,
        *,
        block: int = 4,
    ) -> BlockLM:
        """A block drafter of ``target`` (a transformers causal LM) starting from its decoder
        ``layers``, predicting the draft vocabulary ``d2t`` with ``block`` placeholders."""
        if not is_int(block) or block < 1:
            raise InvalidConfig(
                f"block={block!r} must be an int >= 1 (the drafts of one block, D - 1)"
            )
        draft = DraftLM.from_target(target, layers, d2t, vocab_size)
        embed = target.get_input_embeddings().weight.detach()
        draft.model.set_input_embeddings(PlaceholderEmbedding(embed, block))
        out = cls(draft.model, draft.get_buffer("d2t"), draft.layers, draft.vocab_size)
        return out

    @property
    def embedding(self) -> PlaceholderEmbedding:
        """The input embedding with its placeholders."""
        embed = self.model.get_input_embeddings()
        assert isinstance(embed, PlaceholderEmbedding)
        return embed

    @property
    def block(self) -> int:
        """The learned placeholders: drafts one block proposes without reusing the last."""
        return int(self.embedding.placeholders.shape[0])

    def placeholder(self, offset: int) -> int:
        """The input id of the placeholder for ``offset`` in ``1..block`` (a wider block would
        draft from a placeholder never trained at that offset, so it is refused)."""
        if not is_int(offset) or offset < 1:
            raise InvalidConfig(
                f"offset={offset!r} must be an int >= 1 (1: the token after the anchor)"
            )
        if offset > self.block:
            raise InvalidConfig(
                f"offset={offset} is past this block drafter's {self.block} placeholders (it "
                f"drafts blocks of up to {self.block} tokens); run it with --draft-tokens at "
                f"most {self.block + 1}, or train one with --block-size {offset}"
            )
        return self.embedding.rows + offset - 1

    def block_logits(self, batch: BlockBatch) -> torch.Tensor:
        """Logits over the draft vocabulary ``[B, S, N]`` of a :func:`block_batch`."""
        wrapped = self.wrapped
        device = next(self.model.parameters()).device
        with wrapped.reference() if wrapped is not None else contextlib.nullcontext():
            out = self.model(
                input_ids=batch.tokens.to(device),
                position_ids=batch.positions.to(device),
                attention_mask=batch.mask.to(device),
                use_cache=False,
            )
        logits: torch.Tensor = out.logits
        return logits

    def derived(self) -> tuple[nn.Module, ...]:
        """The target's embedding rows (not the placeholders) and the LM head."""
        return (self.embedding.tokens, self.model.get_output_embeddings())

    def file_metadata(self) -> dict[str, str]:
        """What a file records beside a draft LM's: the placeholders."""
        return {"block": str(self.block)}

    def causal_lm(self, name: str = "block drafter", vocab_size: int | None = None) -> BlockVocabLM:
        """This drafter (in eval mode) as the engine's
        :class:`~specstrat.models.BlockDraftModel` over the target's ``vocab_size`` ids."""
        inner = super().causal_lm(name, vocab_size)
        return BlockVocabLM(inner.inner, inner.d2t, inner.shape.vocab_size, self.placeholder)


class BlockVocabLM(DraftVocabLM):
    """A :class:`~specstrat.train.DraftVocabLM` that reads placeholders: a
    :class:`~specstrat.models.BlockDraftModel`."""

    def __init__(
        self,
        inner: Any,
        d2t: torch.Tensor,
        vocab_size: int,
        placeholder: Callable[[int], int],
    ) -> None:
        super().__init__(inner, d2t, vocab_size)
        self._placeholder = placeholder

    def placeholder(self, offset: int) -> int:
        """The input id standing for the token ``offset >= 1`` positions after the anchor."""
        return self._placeholder(offset)


@dataclass(frozen=True, slots=True)
class BlockBatch:
    """One training or evaluation batch (:func:`block_batch`): ``tokens``, ``positions``
    ``[B, S]`` and ``mask [B, 1, S, S]`` (True: attends) for the model; ``labels [B, A, K]``, the
    captured row whose target distribution each placeholder learns (valid where ``valid``);
    ``context_rows``: the rows before the blocks (the longest sequence's tokens)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    labels: torch.Tensor
    valid: torch.Tensor
    context_rows: int


def block_batch(
    seqs: Sequence[CapturedSequence], anchors: Sequence[Sequence[int]], block: int, first: int
) -> BlockBatch:
    """The batch for ``seqs`` with ``anchors[b]`` (the same count for every sequence) blocks of
    ``block`` placeholders (ids ``first ..``) each: see the module docstring. Placeholder ``k``
    of anchor ``a`` sits at position ``a + k`` and learns captured row ``a + k - 1`` (the
    target's distribution for the token at ``a + k``), valid while that row exists."""
    count = sorted({len(a) for a in anchors})
    if len(count) != 1 or len(anchors) != len(seqs) or not count[0]:
        raise InvalidConfig(
            f"block_batch got {len(anchors)} anchor lists of lengths {count} for {len(seqs)} "
            "sequences; pass one non-empty list per sequence, all as long"
        )
    if not is_int(block) or block < 1:
        raise InvalidConfig(f"block={block!r} must be an int >= 1 (placeholders per anchor)")
    for seq, picked in zip(seqs, anchors, strict=True):
        n = int(seq.tokens.numel())
        bad = [a for a in picked if not is_int(a) or not 0 <= a < n]
        if bad:
            raise InvalidConfig(
                f"anchors {bad[:3]} lie outside a sequence of {n} tokens; an anchor is a "
                f"position in 0..{n - 1}"
            )
    per = count[0]
    width = max(int(s.tokens.numel()) for s in seqs)
    size = width + per * block
    offsets = torch.arange(1, block + 1)
    tokens = torch.zeros(len(seqs), size, dtype=torch.int64)
    positions = torch.zeros(len(seqs), size, dtype=torch.int64)
    mask = torch.zeros(len(seqs), 1, size, size, dtype=torch.bool)
    labels = torch.zeros(len(seqs), per, block, dtype=torch.int64)
    valid = torch.zeros(len(seqs), per, block, dtype=torch.bool)
    col = torch.arange(width)
    which = torch.arange(per * block) // block  # the block each placeholder row is in
    same = (which[:, None] == which[None, :]) & (
        torch.arange(per * block)[None, :] <= torch.arange(per * block)[:, None]
    )
    for b, (seq, picked) in enumerate(zip(seqs, anchors, strict=True)):
        n = int(seq.tokens.numel())
        anc = torch.tensor(list(picked), dtype=torch.int64)
        at = anc[:, None] + offsets[None, :]  # [A, K] positions of the placeholders
        tokens[b, :n] = seq.tokens
        tokens[b, width:] = (first + offsets - 1).repeat(per)
        positions[b, :width] = col
        positions[b, width:] = at.reshape(-1)
        real = col < n
        mask[b, 0, :width, :width] = (col[None, :] <= col[:, None]) & real[None, :]
        mask[b, 0, :width, :width] |= torch.eye(width, dtype=torch.bool)  # padding sees itself
        sees = col[None, :] <= anc.repeat_interleave(block)[:, None]
        mask[b, 0, width:, :width] = sees
        mask[b, 0, width:, width:] = same
        labels[b] = (at - 1).clamp(max=n - 1)
        valid[b] = at - 1 <= n - 1
    return BlockBatch(tokens, positions, mask, labels, valid, width)


def block_targets(
    data: CapturedData, seqs: Sequence[CapturedSequence], batch: BlockBatch
) -> torch.Tensor:
    """The target's logits on the draft vocabulary at each placeholder's captured row,
    ``[B, A, K, N]``."""
    rows = [seq.final[batch.labels[b]] for b, seq in enumerate(seqs)]
    return data.target_logits(torch.stack(rows))
