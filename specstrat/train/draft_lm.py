"""A draft LM distilled from its target, for STANDALONE: a few of the target's own decoder layers
in the target's architecture and tokenizer, reading the target's embedding and predicting over a
draft vocabulary with the target's LM-head rows.

:meth:`DraftLM.from_target` builds one: a transformers model of the target's class with
``len(layers)`` decoder layers, each initialised from the target layer it names, the target's
final norm, the target's input embedding (shared, frozen) and an LM head over the draft
vocabulary ``d2t`` (draft id -> target id) whose rows are the target's (copied, frozen). Only the
decoder layers and the final norm train, so a file stores only those
(:mod:`~specstrat.train.draft_lm_file`); the rest comes from the loaded target.

:class:`DraftVocabLM` is the trained draft as the engine's :class:`~specstrat.models.CausalLM`:
its logits cover the target's whole vocabulary, a token outside the draft vocabulary at the
float's lowest value, so it is never drafted.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf import HFCausalLM
from specstrat.models import AttentionBackend, ModelShape

__all__ = [
    "DraftLM",
    "DraftVocabLM",
    "FullVocabHead",
    "check_d2t",
    "check_draft_layers",
    "default_draft_layers",
    "scattered",
    "soft_cross_entropy",
]


def default_draft_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers a draft LM starts from: the first, the middle and the last
    (``(0, L // 2, L - 1)``, without repeats for a shallow target)."""
    if num_layers < 1:
        raise InvalidConfig(f"num_layers={num_layers!r} must be >= 1")
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))


def check_draft_layers(layers: Sequence[int], num_layers: int) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) draft-LM ``layers`` that are empty,
    repeated, out of order or not decoder layers of a target of ``num_layers`` layers."""
    picked = tuple(layers)
    if (
        not picked
        or any(not 0 <= x < num_layers for x in picked)
        or list(picked) != sorted(set(picked))
    ):
        raise InvalidConfig(
            f"layers={picked} must be distinct ascending indices in [0, {num_layers - 1}] (the "
            f"target's {num_layers} decoder layers), e.g. --layers=0,{num_layers - 1}"
        )


def check_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``d2t`` as int64 once it is a non-empty 1-D map of distinct target ids below
    ``vocab_size`` (:class:`~specstrat.errors.InvalidConfig` naming the bad id otherwise)."""
    ids = d2t.to(torch.int64)
    if ids.dim() != 1 or not ids.numel():
        raise InvalidConfig(
            f"d2t has shape {tuple(ids.shape)}; pass a non-empty 1-D map of target ids "
            "(capture.draft_vocab)"
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidConfig(
            f"d2t holds id {bad}, outside the target's vocabulary 0..{vocab_size - 1}; use the "
            "draft vocabulary of this target (capture.draft_vocab)"
        )
    distinct = len(set(ids.tolist()))
    if distinct != ids.numel():
        raise InvalidConfig(
            f"d2t repeats target ids ({ids.numel() - distinct} repeats); each draft "
            "id must map to its own target id (capture.draft_vocab)"
        )
    return ids


def _decoder(model: Any) -> Any:
    """The decoder of a transformers causal LM, with its ``layers`` and final ``norm``."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "norm"):
        raise ModelLoadError(
            f"{type(model).__name__} has no decoder with .layers and .norm (as Llama, Qwen2 and "
            "Mistral have); a draft LM or a block drafter copies its layers from there, so "
            "this target is not supported by specstrat train --kind draft-lm or block"
        )
    return decoder


class DraftLM(nn.Module):
    """The trainable draft LM (see the module docstring): ``model`` is the transformers model,
    ``d2t [N]`` its draft vocabulary, ``layers`` the target layers it started from and
    ``vocab_size`` the target's vocabulary."""

    #: The ``format`` metadata value of its file.
    format = "specstrat-draft-lm/1"

    def __init__(
        self, model: Any, d2t: torch.Tensor, layers: Sequence[int], vocab_size: int
    ) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("d2t", d2t.to(torch.int64).clone())
        self.layers = tuple(int(x) for x in layers)
        self.vocab_size = int(vocab_size)
        #: The engine's wrapper once :meth:`causal_lm` made one (it switches the model's
        #: attention to the engine's; :meth:`draft_logits` then runs under its reference()).
        self.wrapped: HFCausalLM | None = None

    @classmethod
    def from_target(
        cls, target: Any, layers: Sequence[int], d2t: torch.Tensor, vocab_size: int | None = None
    ) -> DraftLM:
        """A draft LM of ``target`` (a transformers causal LM) starting from its decoder
        ``layers`` (:func:`check_draft_layers`), predicting the draft vocabulary ``d2t``;
        ``vocab_size``: the target's token ids (default: its LM head's rows)."""
        decoder = _decoder(target)
        picked = tuple(int(x) for x in layers)
        check_draft_layers(picked, len(decoder.layers))
        head = target.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if vocab_size is None else int(vocab_size)
        ids = check_d2t(d2t, vocab)
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = len(picked)
        config.tie_word_embeddings = False
        kinds = getattr(config, "layer_types", None)
        if isinstance(kinds, list) and len(kinds) == len(decoder.layers):
            config.layer_types = [kinds[x] for x in picked]
        weight = head.weight.detach()
        with torch.device(weight.device):
            model = type(target)(config)
        model.to(weight.dtype)
        model.set_attn_implementation("sdpa")
        ours = _decoder(model)
        for mine, x in zip(ours.layers, picked, strict=True):
            mine.load_state_dict(decoder.layers[x].state_dict())
        ours.norm.load_state_dict(decoder.norm.state_dict())
        embed = target.get_input_embeddings().weight.detach()  # shared, never trained
        model.set_input_embeddings(nn.Embedding.from_pretrained(embed, freeze=True))  # type: ignore[no-untyped-call]
        bias = getattr(head, "bias", None)
        lm_head = nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None)
        lm_head.to(weight.device, weight.dtype)
        with torch.no_grad():
            lm_head.weight.copy_(weight[ids.to(weight.device)])
            if bias is not None:
                lm_head.bias.copy_(bias.detach()[ids.to(weight.device)])
        lm_head.requires_grad_(False)
        model.set_output_embeddings(lm_head)
        model.eval()
        return cls(model, ids.to(weight.device), picked, vocab)

    def trainable(self) -> dict[str, torch.Tensor]:
        """What trains and what a draft-LM file stores: the decoder layers and the final norm
        (every tensor but the embedding's, the LM head's and non-persistent buffers), by
        ``state_dict`` name."""
        model = self.model
        derived = {
            id(t) for module in self.derived() for t in module.state_dict(keep_vars=True).values()
        }
        return {
            name: value
            for name, value in model.state_dict(keep_vars=True).items()
            if id(value) not in derived
        }

    def derived(self) -> tuple[nn.Module, ...]:
        """The modules whose tensors come from the target (frozen, never stored): the input
        embedding and the LM head."""
        model = self.model
        return (model.get_input_embeddings(), model.get_output_embeddings())

    def file_metadata(self) -> dict[str, str]:
        """What a file records beside the run's facts, the layers and the draft vocabulary
        (nothing for a draft LM)."""
        return {}

    def train_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimiser updates (those of :meth:`trainable`)."""
        names = set(self.trainable())
        return [p for n, p in self.model.named_parameters() if n in names]

    def draft_logits(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits over the draft vocabulary, ``[B, T, N]``, for ``tokens [B, T]`` (right-padded
        where ``attention_mask`` is 0)."""
        wrapped = self.wrapped
        with wrapped.reference() if wrapped is not None else contextlib.nullcontext():
            out = self.model(input_ids=tokens, attention_mask=attention_mask, use_cache=False)
        logits: torch.Tensor = out.logits
        return logits

    def causal_lm(self, name: str = "draft LM", vocab_size: int | None = None) -> DraftVocabLM:
        """This draft (in eval mode) as the engine's :class:`~specstrat.models.CausalLM` over
        the target's ``vocab_size`` ids (default: its LM head's rows; pass the target's
        ``shape.vocab_size``, which a tokenizer may cap below them)."""
        self.eval()
        vocab = self.vocab_size if vocab_size is None else vocab_size
        if self.wrapped is None:
            self.wrapped = HFCausalLM(self.model, name=name)
        return DraftVocabLM(self.wrapped, self.get_buffer("d2t"), vocab)


class DraftVocabLM:
    """A causal LM over a draft vocabulary, seen by the engine over the target's: ``inner``
    (an :class:`~specstrat.hf.HFCausalLM` whose LM head has a row per draft id) and ``d2t``;
    logits outside the draft vocabulary are the dtype's lowest value, so nothing drafts them."""

    def __init__(self, inner: HFCausalLM, d2t: torch.Tensor, vocab_size: int) -> None:
        if inner.shape.vocab_size != d2t.numel():
            raise InvalidConfig(
                f"{inner.name}: the LM head has {inner.shape.vocab_size} rows but d2t maps "
                f"{d2t.numel()} draft ids; pass the d2t the head was built with"
            )
        check_d2t(d2t, vocab_size)
        self.inner, self.name = inner, inner.name
        device = next(inner.parameters()).device
        self.d2t = d2t.to(device=device, dtype=torch.int64)
        self._shape = replace(inner.shape, vocab_size=int(vocab_size))

    @property
    def shape(self) -> ModelShape:
        """The inner model's shape over the target's ``vocab_size``."""
        return self._shape

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The inner model's parameters."""
        return self.inner.parameters(recurse)

    @contextlib.contextmanager
    def assistant(self) -> Iterator[Any]:
        """The same weights as a transformers model for the block, on transformers' own
        attention, its LM head scattering into the target's vocabulary as :meth:`__call__`
        does: what transformers' assisted generation (``generate(assistant_model=...)``) takes.
        The model is restored afterwards."""
        with self.inner.reference() as model:
            head = model.get_output_embeddings()
            model.set_output_embeddings(FullVocabHead(head, self.d2t, self._shape.vocab_size))
            try:
                yield model
            finally:
                model.set_output_embeddings(head)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[n, vocab_size]`` (the draft vocabulary's scattered into place) and the
        final hidden state."""
        small, hidden = self.inner(tokens, positions, attention)
        return scattered(small, self.d2t, self._shape.vocab_size), hidden


class FullVocabHead(nn.Module):
    """An LM head over draft ids (``head``) seen over ``vocab_size`` target ids: its logits
    scattered to ``d2t``, every other id at the dtype's lowest value."""

    def __init__(self, head: nn.Module, d2t: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.head, self.vocab_size = head, vocab_size
        self.register_buffer("d2t", d2t)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[.., vocab_size]`` for ``hidden [.., H]``."""
        return scattered(self.head(hidden), self.get_buffer("d2t"), self.vocab_size)


def scattered(small: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over draft ids ``small [.., N]`` placed at their target ids ``d2t`` in a
    ``[.., vocab_size]`` tensor, every other id at the dtype's lowest value."""
    low = torch.finfo(small.dtype).min
    out = small.new_full((*small.shape[:-1], vocab_size), low)
    return out.index_copy_(-1, d2t, small)


def soft_cross_entropy(
    logits: torch.Tensor, target_logits: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean soft cross-entropy of ``logits [.., N]`` against the softmax of
    ``target_logits [.., N]`` over the rows where ``rows`` is true, and the share of those rows
    whose top-1 agrees."""
    picked, want = logits[rows], target_logits[rows]
    loss = -(want.softmax(-1) * F.log_softmax(picked, -1)).sum(-1).mean()
    agree = (picked.argmax(-1) == want.argmax(-1)).float().mean()
    return loss, agree
