"""The features a head trains on, captured from the target's own generations.

A head learns to predict what *this* target says, so the data is the target's own responses to
the prompts (:mod:`~specstrat.train.generation`), not a dataset's answers. For each position
from the last prompt token on, a :class:`CapturedSequence` holds the hidden states of the fused
layers, the LM head's input (from which the target's logits on the draft vocabulary are
recomputed as training needs them, so the data stays about ``(k + 1) * H`` half-precision
numbers a position) and the target's greedy choice. :func:`~specstrat.train.generate_captured`
records them while the engine generates; :func:`capture_sequences` is the second pass, one
forward with ``output_hidden_states`` per generation, for a bare transformers model or
generations made elsewhere.

Layer ``l`` means the output of decoder layer ``l`` (transformers' ``hidden_states[l + 1]``;
the last layer's entry is after the final norm in most models).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.hf import HFCausalLM

__all__ = [
    "CapturedData",
    "CapturedSequence",
    "Generation",
    "capture",
    "capture_sequences",
    "check_lm_head",
    "check_layers",
    "default_layers",
    "draft_data",
    "draft_vocab",
    "raw_model",
    "target_vocab",
    "token_counts",
]


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """The fused layers for a target of ``num_layers`` decoder layers: ``(1, L // 2, L - 2)``
    (low, middle, high), each clamped into ``[0, L - 1]``, sorted (a tiny model repeats one)."""
    if not is_int(num_layers) or num_layers < 1:
        raise InvalidConfig(f"num_layers={num_layers!r} must be an int >= 1")
    picked = sorted(min(max(i, 0), num_layers - 1) for i in (1, num_layers // 2, num_layers - 2))
    return picked[0], picked[1], picked[2]


def check_layers(layers: Sequence[int], num_layers: int) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) fused ``layers`` that are empty or
    not decoder-layer indices of a target of ``num_layers`` layers."""
    picked = tuple(layers)
    if not picked or any(not 0 <= x < num_layers for x in picked):
        raise InvalidConfig(
            f"layers={picked} must be non-empty indices in [0, {num_layers - 1}] (the "
            f"target's {num_layers} decoder layers); default_layers({num_layers}) = "
            f"{default_layers(num_layers)}"
        )


@contextlib.contextmanager
def raw_model(model: Any) -> Iterator[Any]:
    """The transformers model behind ``model`` for the block: an
    :class:`~specstrat.hf.HFCausalLM` on transformers' own attention (its ``reference()``), or
    ``model`` itself when it already is a transformers model."""
    if isinstance(model, HFCausalLM):
        with model.reference() as inner:
            yield inner
    else:
        yield model


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """One prompt's tokens (``tokens [T]``, CPU int64): ``prompt_len`` prompt ids (the chat
    template applied), then the target's response."""

    tokens: torch.Tensor
    prompt_len: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CapturedSequence:
    """What a head trains on for one generation, at rows ``r = 0 .. R - 1`` that stand for
    sequence positions ``start + r`` (``start = prompt_len - 1``: row 0 predicts the first
    response token). ``features [R, k * H]``: the fused layers' hidden states, concatenated;
    ``tokens [R]``: the token at each position; ``logits [R, N]``: the target's logits on the
    draft vocabulary are :meth:`CapturedData.target_logits` of ``final [R, H]``, the LM head's
    input; ``greedy [R]``: the target's greedy next token over its whole vocabulary. CPU
    tensors, ``features`` and ``final`` in float16. ``context``: the first rows that only
    stand for the prompt (a capture with the prompt's rows starts at ``start = 0``, and its
    row ``context = prompt_len - 1`` predicts the first response token): a head that attends
    over the context reads them, and no loss or measurement is taken there."""

    features: torch.Tensor
    tokens: torch.Tensor
    final: torch.Tensor
    greedy: torch.Tensor
    start: int
    context: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CapturedData:
    """Captured sequences of one target: the fused ``layers``, the draft vocabulary ``d2t``
    (draft id -> target id), the target's LM head rows at ``d2t`` (``lm_rows [N, H]`` and
    ``lm_bias [N]``, float32) and a description of the prompts' ``source``."""

    sequences: tuple[CapturedSequence, ...]
    layers: tuple[int, ...]
    d2t: torch.Tensor
    lm_rows: torch.Tensor
    lm_bias: torch.Tensor
    source: str

    def target_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's logits on the draft vocabulary (``[.., N]`` float32) for LM head inputs
        ``final [.., H]``."""
        return F.linear(final.float(), self.lm_rows, self.lm_bias)

    @property
    def positions(self) -> int:
        """Rows over all sequences past their context rows: the positions trained on (the
        data size)."""
        return sum(int(s.tokens.numel()) - s.context for s in self.sequences)


def target_vocab(model: Any, tokenizer: Any) -> int:
    """The ids a response can hold: the tokenizer's, capped at the LM head's rows (a padded
    head's extra rows are never chosen)."""
    return min(len(tokenizer), int(model.get_output_embeddings().weight.shape[0]))


def token_counts(generations: Sequence[Generation], vocab_size: int) -> torch.Tensor:
    """How often each id ``< vocab_size`` occurs in the responses (``[vocab_size]`` int64)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for g in generations:
        response = g.tokens[g.prompt_len :]
        counts += torch.bincount(response[response < vocab_size], minlength=vocab_size)
    return counts


def draft_vocab(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The draft vocabulary: the ``n`` most frequent ids of ``counts [V]`` (ties broken by the
    smaller id), most frequent first, as the d2t map ``[n]`` int64 (draft id -> target id)."""
    if counts.dim() != 1 or counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise InvalidConfig(
            f"token_counts has shape {tuple(counts.shape)} and dtype {counts.dtype}; pass a 1-D "
            "integer tensor of counts per target id (token_counts(generations, vocab_size))"
        )
    if not is_int(n) or not 1 <= n <= counts.numel():
        raise InvalidConfig(
            f"draft vocabulary n={n!r} must be an int in [1, {counts.numel()}] (the target's "
            "vocabulary); pass a smaller draft_vocab"
        )
    ids = torch.arange(counts.numel(), dtype=torch.int64)
    # Stable sort by id first, then by count descending: equal counts keep ascending ids.
    order = torch.sort(counts.to(torch.int64), descending=True, stable=True).indices
    return ids[order[:n]].clone()


def capture(
    model: Any,
    generations: Sequence[Generation],
    *,
    layers: Sequence[int],
    d2t: torch.Tensor,
    vocab_size: int,
    source: str = "",
) -> CapturedData:
    """:func:`capture_sequences` of ``generations`` as :func:`draft_data` on ``d2t``."""
    sequences = capture_sequences(model, generations, layers=layers, vocab_size=vocab_size)
    return draft_data(model, sequences, layers=layers, d2t=d2t, source=source)


def capture_sequences(
    model: Any,
    generations: Sequence[Generation],
    *,
    layers: Sequence[int],
    vocab_size: int,
    prompt_rows: bool = False,
) -> tuple[CapturedSequence, ...]:
    """One forward per generation with ``output_hidden_states``: the fused ``layers``' hidden
    states, the LM head's input and the greedy next token (over the first ``vocab_size`` ids)
    at every position from the last prompt token on (:class:`CapturedSequence`), or from the
    first with ``prompt_rows`` (the prompt's rows as its ``context``). A target whose
    logits are not its LM head's output (a soft cap or a scale after the head) is refused: the
    logits training recomputes would not be the target's."""
    picked = tuple(int(x) for x in layers)
    sequences: list[CapturedSequence] = []
    with raw_model(model) as lm, torch.inference_mode():
        check_layers(picked, int(lm.config.num_hidden_layers))
        device = next(lm.parameters()).device
        head = lm.get_output_embeddings()
        inputs: list[torch.Tensor] = []
        hook = head.register_forward_pre_hook(lambda _module, args: inputs.append(args[0]))
        try:
            for g in generations:
                start = 0 if prompt_rows else g.prompt_len - 1
                inputs.clear()
                out = lm(input_ids=g.tokens[None].to(device), output_hidden_states=True)
                feats = torch.cat([out.hidden_states[x + 1][0, start:] for x in picked], dim=-1)
                logits = out.logits[0, start:].float()
                final = inputs[-1][0, start:].float()
                if not sequences:
                    _check_head(head, final, logits)
                sequences.append(
                    CapturedSequence(
                        features=feats.half().cpu(),
                        tokens=g.tokens[start:].clone(),
                        final=final.half().cpu(),
                        greedy=logits[:, :vocab_size].argmax(-1).cpu(),
                        start=start,
                        context=g.prompt_len - 1 - start,
                    )
                )
        finally:
            hook.remove()
    return tuple(sequences)


def draft_data(
    model: Any,
    sequences: Sequence[CapturedSequence],
    *,
    layers: Sequence[int],
    d2t: torch.Tensor,
    source: str = "",
) -> CapturedData:
    """``sequences`` captured from ``model`` on the fused ``layers``, with the draft vocabulary
    ``d2t`` and the target's LM head rows at it."""
    with raw_model(model) as lm:
        head = lm.get_output_embeddings()
        bias = getattr(head, "bias", None)
        index = d2t.to(head.weight.device)
        rows = head.weight.detach()[index].float().cpu()
        picked = torch.zeros(d2t.numel()) if bias is None else bias.detach()[index].float().cpu()
    return CapturedData(
        sequences=tuple(sequences),
        layers=tuple(int(x) for x in layers),
        d2t=d2t.clone(),
        lm_rows=rows,
        lm_bias=picked,
        source=source,
    )


def check_lm_head(model: Any, ids: Sequence[int]) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) a transformers ``model`` whose logits
    for ``ids`` are not its LM head's output (a soft cap or a scale after the head): the logits
    training recomputes from the head's input would not be the target's. No ids: nothing to
    check."""
    if not ids:
        return
    head = model.get_output_embeddings()
    inputs: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda _module, args: inputs.append(args[0]))
    try:
        with torch.inference_mode():
            device = next(model.parameters()).device
            out = model(input_ids=torch.tensor([list(ids)], device=device))
            _check_head(head, inputs[-1][0].float(), out.logits[0].float())
    finally:
        hook.remove()


def _check_head(head: Any, final: torch.Tensor, logits: torch.Tensor) -> None:
    """Refuses a target whose logits are not its LM head's output for the head's input."""
    width = logits.shape[-1]
    bias = getattr(head, "bias", None)
    recomputed = F.linear(final.to(head.weight.dtype), head.weight, bias).float()[..., :width]
    error = float((recomputed - logits).abs().max()) if logits.numel() else 0.0
    if error > 1e-3 * max(1.0, float(logits.abs().max())):
        raise InvalidConfig(
            f"the target's logits differ from its LM head's output by up to {error:.3g} (a "
            "soft cap or a scale after the head); specstrat train needs a target whose logits "
            "are the output of get_output_embeddings()"
        )
