"""Models behind Protocols: what the engine and drafters need of a model, not which model it is.

The engine runs any :class:`CausalLM` (the embedded byte models, or a user's own torch module)
through paged attention; drafters reach the draft LM through a :class:`DraftKV` runner the engine
creates, an EAGLE-style head through :class:`DraftHead`, and a block drafter's model
(:class:`BlockDraftModel`) through a :class:`BlockKV` runner whose TARGET_VERIFY forward runs on
the draft worker. So built-in drafters live in
:mod:`specstrat.strategies` without importing the runtime.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

__all__ = [
    "AttentionBackend",
    "BlockDraftModel",
    "BlockKV",
    "CausalLM",
    "ContextDraftHead",
    "DraftHead",
    "DraftKV",
    "EarlyExitModel",
    "KVForward",
    "KVRequests",
    "KVSlotRows",
    "KVVerify",
    "LoadedModels",
    "ModelSet",
    "ModelShape",
    "RowLogitsLM",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """What the engine needs to know of a model to size its KV cache and check its outputs.

    ``vocab_size``: the token ids the engine may draft, accept and sample (a Hugging Face model's
    tokenizer vocabulary; its LM head may be wider, and the adapter slices the extra logits off).
    ``heads``: query heads; ``kv_heads``: key/value heads (grouped-query attention: ``heads`` is
    a multiple of it; ``None``, the default, means ``heads``). The KV cache holds ``kv_heads``
    heads of ``head_dim`` per layer.
    """

    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    head_dim: int
    max_positions: int
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "layers", "heads", "head_dim", "max_positions"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidConfig(f"ModelShape.{name}={value!r} must be an int >= 1")
        kv = self.kv_heads
        if kv is not None and (not is_int(kv) or kv < 1):
            raise InvalidConfig(f"ModelShape.kv_heads={kv!r} must be an int >= 1, or None")
        if kv is not None and self.heads % kv:
            raise InvalidConfig(
                f"ModelShape.heads={self.heads} is not a multiple of kv_heads={kv}; grouped-query "
                "attention shares each key/value head among heads // kv_heads query heads"
            )

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads per layer (``kv_heads``, or ``heads`` when it is ``None``)."""
        return self.heads if self.kv_heads is None else self.kv_heads


class AttentionBackend(Protocol):
    """Computes one layer's attention for flat q ``[n, heads, head_dim]`` and k, v
    ``[n, kv_heads, head_dim]`` (grouped-query attention when ``kv_heads < heads``). They may be
    strided views into one projection's output (``reshape``, not ``view``, where a backend
    needs another shape).

    The engine passes one per forward; it stores ``k``/``v`` in the KV cache and attends through
    the TARGET_VERIFY/EXTEND/DECODE metadata the kernels built. Keyword arguments, each ``None``
    for the default: ``scaling`` multiplies the scores (default ``head_dim ** -0.5``);
    ``sliding_window`` ``W``: a query at position ``p`` sees keys at positions ``> p - W`` only;
    ``softcap`` ``c``: scores become ``c * tanh(scores / c)`` before the mask and softmax.
    """

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scaling: float | None = None,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Attention output ``[n, heads, head_dim]``."""
        ...


@runtime_checkable
class CausalLM(Protocol):
    """A causal LM the engine can run: flat tokens and positions in, logits and hidden out.

    Called by the engine's model workers in every forward mode. Guarantees: ``__call__`` returns
    ``(logits [n, shape.vocab_size], hidden [n, shape.hidden_size])`` for ``n`` tokens and calls
    ``attention(layer, q, k, v, ...)`` once per layer in order ``0..shape.layers - 1`` with q
    ``[n, shape.heads, shape.head_dim]`` and k, v ``[n, shape.num_kv_heads, shape.head_dim]``;
    it keeps no state between calls. :mod:`specstrat.hf` wraps any Hugging Face causal LM so.
    """

    @property
    def shape(self) -> ModelShape:
        """Vocabulary, widths and depth (sizes the KV cache)."""
        ...

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden states, one row per token."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (their dtype and device are the KV cache's)."""
        ...


@runtime_checkable
class RowLogitsLM(CausalLM, Protocol):
    """A causal LM that can leave out the LM head for rows whose logits nobody reads.

    A prefill reads only the logits of each prompt's last row, and on a small model the LM head
    is a large share of every row's work (by arithmetic, SmolLM2's is 28 of the 135 million
    multiply-adds a row costs). The engine calls :meth:`forward_rows` for the target's prefill
    (and disaggregation's prefill side) when a model has it, and ``__call__`` everywhere else.
    Guarantees: the same forward as ``__call__`` (the same attention calls, the same hidden
    states for every token) with the logits of ``rows`` only.
    """

    def forward_rows(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        rows: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[len(rows), vocab_size]`` of the tokens at indices ``rows`` (ascending,
        distinct) and hidden states ``[n, hidden_size]`` of all ``n`` tokens."""
        ...


@runtime_checkable
class EarlyExitModel(CausalLM, Protocol):
    """A causal LM that can also run as its own first layers: self-speculation by early exit.

    Guarantees: ``early_exit(k)`` is a :class:`CausalLM` of the first ``k`` layers followed by
    the model's final norm and LM head (LayerSkip's early exit), sharing this model's weights
    (nothing is copied) and its ``vocab_size``; the engine gives it a KV cache of its own.
    """

    def early_exit(self, exit_layer: int) -> CausalLM:
        """The first ``exit_layer`` layers (``1 <= exit_layer < shape.layers``) plus the final
        norm and LM head."""
        ...


@runtime_checkable
class BlockDraftModel(CausalLM, Protocol):
    """A draft LM that also reads placeholder tokens, so one forward proposes a whole block.

    Guarantees (beyond :class:`CausalLM`'s): a row holding a vocabulary token produces what the
    plain draft LM would; a row holding ``placeholder(k)`` at absolute position ``p`` predicts the
    token *at* ``p`` (the ``k``-th after the anchor, the last known token), from everything
    before it. Placeholder ids lie outside the output vocabulary.
    """

    def placeholder(self, offset: int) -> int:
        """The input id standing for the unknown token ``offset >= 1`` positions after the
        anchor."""
        ...


class DraftHead(Protocol):
    """An EAGLE-style head: the next token's logits from a hidden state and the current token.

    Guarantees: ``(logits [n, V], new_hidden [n, H])`` for ``hidden [n, H]`` and ``tokens [n]``;
    ``new_hidden`` stands in for the target's hidden state one position later, so the head chains.
    """

    def __call__(
        self, hidden: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits for the token after ``tokens``, and the predicted hidden state."""
        ...


@runtime_checkable
class ContextDraftHead(DraftHead, Protocol):
    """A draft head that attends over the context: its decoder layer in two halves around the
    attention, which the drafter computes over the head's own KV cache
    (:class:`~specstrat.strategies.ContextHeadDrafter` calls ``layer_input`` for the rows it
    caches at admission and after each verify, and for each draft; ``layer_output`` for the
    rows it reads; ``__call__`` as a :class:`DraftHead` is the prefill process's first token
    for disaggregation, each row attending to itself only).

    Guarantees: ``layer_input`` returns the residual ``[B, T, H]`` and the rotated
    ``q [B, T, heads, d]``, ``k`` and ``v [B, T, kv_heads, d]`` for inputs ``[B, T, W]``
    (target features or the head's own hidden states), ``tokens [B, T]`` and ``positions
    [B, T]``; ``layer_output`` turns the residual and the attention ``[B, T, heads * d]`` into
    logits ``[B, T, V]`` and the head's hidden states ``[B, T, H]``.
    """

    def layer_input(
        self, features_or_hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The residual and the rotated ``q``, ``k``, ``v`` of each row."""
        ...

    def layer_output(
        self, residual: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the head's hidden state of each row."""
        ...


class LoadedModels(Protocol):
    """The models an engine runs: a target, and whatever drafters use (draft LM, draft head)."""

    @property
    def target(self) -> CausalLM:
        """The model whose output speculation must reproduce."""
        ...

    @property
    def draft(self) -> CausalLM | None:
        """A small draft LM, if loaded."""
        ...

    @property
    def head(self) -> DraftHead | None:
        """An EAGLE-style head bound to the target, if loaded."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSet:
    """Your own models for the engine: ``ModelSet(target=MyLM())`` (see docs/guides/models.md).

    ``block``: a :class:`BlockDraftModel` for the block drafter (DFLASH, DSPARK). It is not part
    of :class:`LoadedModels`, so model sets written before it still satisfy that Protocol; the
    block drafter reads ``models.block`` where it is present.
    """

    target: CausalLM
    draft: CausalLM | None = None
    head: DraftHead | None = None
    block: BlockDraftModel | None = None

    def __post_init__(self) -> None:
        for name in ("target", "draft"):
            model = getattr(self, name)
            if model is not None and not isinstance(model, CausalLM):
                raise InvalidConfig(
                    f"ModelSet.{name}={type(model).__name__} is not a CausalLM; it needs a "
                    "`shape` (ModelShape), `parameters()` and "
                    "`__call__(tokens, positions, attention) -> (logits, hidden)`"
                )
        if self.head is not None and not callable(self.head):
            raise InvalidConfig(f"ModelSet.head={type(self.head).__name__} is not callable")
        if self.block is not None and not isinstance(self.block, BlockDraftModel):
            raise InvalidConfig(
                f"ModelSet.block={type(self.block).__name__} is not a BlockDraftModel; it needs "
                "what a CausalLM has and `placeholder(offset) -> int`"
            )


class KVRequests(Protocol):
    """Draft rows of a :class:`DraftKV` runner: rows of its own request pool, not the target's
    (its methods' ``rows``/``row``). A drafter keeping one draft row per
    request takes them through :class:`KVSlotRows` instead, so the engine knows who holds what;
    rows from :meth:`alloc` are the drafter's alone to free."""

    def alloc(self, count: int) -> list[int]:
        """``count`` fresh draft rows with empty KV, all or none, held for no request slot."""
        ...

    def free(self, rows: Sequence[int]) -> None:
        """Release draft ``rows`` from :meth:`alloc` and their KV (a row held for a request slot
        is refused: :meth:`KVSlotRows.free_for` releases that)."""
        ...

    def rewind(self, row: int, new_len: int) -> None:
        """Drop the KV of positions ``new_len..`` of draft ``row``."""
        ...


class KVSlotRows(Protocol):
    """A :class:`DraftKV` runner's draft rows by the target's request slot, recorded in the
    engine's slot table: one draft row per request, held from the drafter's ``admit`` until its
    ``release``. Whatever a slot still holds once ``release`` returns (or raises) the engine
    frees, so a drafter's KV never outlives its request."""

    def alloc_for(self, slots: Sequence[int]) -> list[int]:
        """A fresh draft row (empty KV) for each of the target's ``slots``, in order, all or
        none; call it in ``admit`` with ``admission.slots``. A slot that holds no request, holds
        a row of this runner already, or repeats is refused with ``InvalidConfig``."""
        ...

    def rows_for(self, slots: Sequence[int]) -> list[int]:
        """The draft rows the target's ``slots`` hold, in order: what :class:`KVForward` and
        ``rewind`` take. A slot holding none raises ``InvalidConfig`` naming it."""
        ...

    def free_for(self, slots: Sequence[int]) -> None:
        """Release the draft rows (and their KV) of those of the target's ``slots`` that hold
        one, and their record; call it in ``release``."""
        ...


class KVForward(Protocol):
    """Forwards of a :class:`DraftKV` runner: append tokens to draft rows, read how many
    positions each caches (``rows`` are the runner's draft rows, as :meth:`KVSlotRows.rows_for`
    returns them)."""

    def extend(
        self, rows: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens[i]`` after draft row ``rows[i]``'s cached ones; logits and hidden, one
        row per token."""
        ...

    def extend_tree(
        self,
        rows: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``tokens [bs, k]`` as draft-tree nodes at ``positions [bs, k]`` (prefix +
        depth): new token ``j`` of draft row ``rows[i]`` sees the columns before the request's last
        ``W = mask.shape[2]`` (the tree, new tokens included) and the tree columns where
        ``mask[i, j]`` is True. Logits and hidden, ``bs * k`` rows."""
        ...

    def cached(self, rows: Sequence[int]) -> list[int]:
        """Positions whose draft KV is written, per draft row: the draft model's own fill, not
        the target's sequence length (``DrafterContext.target_tokens`` says that)."""
        ...


class DraftKV(KVRequests, KVSlotRows, KVForward, Protocol):
    """A model with its own request pool and KV cache, created for a drafter by the engine:
    draft rows by request slot (:class:`KVSlotRows`), forwards on them (:class:`KVForward`)."""


class KVVerify(Protocol):
    """The draft worker's TARGET_VERIFY forward of a :class:`BlockKV` runner."""

    @property
    def tokens_per_req(self) -> int:
        """``T_draft``: tokens per request each :meth:`verify` runs (the policy's answer for
        the draft worker)."""
        ...

    def verify(
        self, rows: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One TARGET_VERIFY forward of ``tokens`` ``[bs, tokens_per_req]`` after each draft
        row's cached tokens (their KV is kept until rewound); logits and hidden, ``bs * T`` rows."""
        ...


class BlockKV(DraftKV, KVVerify, Protocol):
    """A draft model with its own KV cache that also runs TARGET_VERIFY on the draft worker
    (through per-bucket graphs sized ``bs * tokens_per_req``), created by the engine."""
