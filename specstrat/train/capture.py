"""The target's own generations, and the features a head trains on.

A head learns to predict what *this* target says, so the data is the target's own responses to
the prompts (greedy, or sampled at a temperature with a seed), not a dataset's answers. For each
generated sequence one further forward with ``output_hidden_states`` captures, at the response
positions, the hidden states of the fused layers, the LM head's input (from which the target's
logits on the draft vocabulary are recomputed as training needs them, so the data stays about
``(k + 1) * H`` half-precision numbers a position) and the target's greedy choices. That is a
second forward over text the generation already ran; capturing during generation instead (no
second pass) is left to the engine.

Layer ``l`` means the output of decoder layer ``l`` (transformers' ``hidden_states[l + 1]``;
the last layer's entry is after the final norm in most models).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig
from specstrat.hf import HFCausalLM, eos_token_ids, plain_defaults

__all__ = [
    "CapturedData",
    "CapturedSequence",
    "Generation",
    "capture",
    "capture_sequences",
    "check_layers",
    "default_layers",
    "draft_data",
    "draft_vocab",
    "generate",
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
    tensors, ``features`` and ``final`` in float16."""

    features: torch.Tensor
    tokens: torch.Tensor
    final: torch.Tensor
    greedy: torch.Tensor
    start: int


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
        """Rows over all sequences (the data size)."""
        return sum(int(s.tokens.numel()) for s in self.sequences)


def target_vocab(model: Any, tokenizer: Any) -> int:
    """The ids a response can hold: the tokenizer's, capped at the LM head's rows (a padded
    head's extra rows are never chosen)."""
    return min(len(tokenizer), int(model.get_output_embeddings().weight.shape[0]))


def _prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt as one user turn through the chat template (plain text without a template)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return [int(t) for t in tokenizer.encode(prompt)]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    deadline: float | None = None,
    batch: int = 64,
) -> tuple[Generation, ...]:
    """The target's responses to ``prompts``: greedy at ``temperature=0``, else sampled at it
    with ``seed + i`` for prompt ``i``; stops at the tokenizer's and generation config's EOS.
    Logits past the tokenizer's vocabulary (a padded head) are never chosen. An
    :class:`~specstrat.hf.HFCausalLM` generates through specstrat's own engine, ``batch``
    prompts at a time (greedy output equal to transformers' ``generate``, batched); a bare
    transformers model through its ``generate``, one prompt at a time. Stops early, keeping
    what it has, once ``time.monotonic()`` passes ``deadline`` (checked between batches)."""
    from transformers import GenerationConfig

    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise InvalidConfig(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
    if isinstance(model, HFCausalLM):
        return _engine_generate(
            model, tokenizer, prompts, max_new_tokens, temperature, seed, deadline, batch
        )
    out: list[Generation] = []
    with raw_model(model) as lm, plain_defaults(lm), torch.inference_mode():
        vocab, width = target_vocab(lm, tokenizer), int(lm.get_output_embeddings().weight.shape[0])
        eos = sorted(eos_token_ids(lm, tokenizer))
        sampled = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max_new_tokens,
            eos_token_id=eos or None,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            suppress_tokens=list(range(vocab, width)) or None,
            **(sampled if temperature > 0 else {"do_sample": False}),
        )
        device = next(lm.parameters()).device
        for i, prompt in enumerate(prompts):
            if deadline is not None and time.monotonic() > deadline:
                break
            ids = torch.tensor([_prompt_ids(tokenizer, prompt)], device=device)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + i)
                done = lm.generate(
                    ids, attention_mask=torch.ones_like(ids), generation_config=config
                )
            out.append(Generation(tokens=done[0].cpu(), prompt_len=ids.shape[1]))
    return tuple(out)


def _engine_generate(
    model: HFCausalLM,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    deadline: float | None,
    batch: int,
) -> tuple[Generation, ...]:
    """:func:`generate` through specstrat's engine (target-only decoding, ``batch`` requests
    running at once)."""
    from specstrat.builtins import NONE
    from specstrat.drafting import SamplingParams
    from specstrat.models import ModelSet
    from specstrat.runtime import Engine, EngineConfig, Request, kv_reservation

    with raw_model(model) as lm:
        eos = eos_token_ids(lm, tokenizer)
    requests = [
        Request(
            f"p{i}",
            _prompt_ids(tokenizer, prompt),
            max_new_tokens,
            stop_token_ids=eos,
            sampling=SamplingParams(temperature=temperature, seed=(seed + i) % 2**63),
        )
        for i, prompt in enumerate(prompts)
    ]
    context = kv_reservation(NONE, 1).context_len_for(requests)
    if context > model.shape.max_positions:
        raise InvalidConfig(
            f"the longest prompt plus max_new_tokens={max_new_tokens} needs context_len="
            f"{context}, past the model's {model.shape.max_positions} positions; lower "
            "max_new_tokens or shorten the prompts"
        )
    config = EngineConfig(context_len=context, max_running_requests=batch)
    engine = Engine(NONE, ModelSet(target=model), config)
    out: list[Generation] = []
    for first in range(0, len(requests), batch):
        if deadline is not None and time.monotonic() > deadline:
            break
        chunk = requests[first : first + batch]
        outputs = engine.run(chunk)
        for r in chunk:
            tokens = torch.tensor([*r.prompt, *outputs[r.rid]], dtype=torch.int64)
            out.append(Generation(tokens=tokens, prompt_len=len(r.prompt)))
    return tuple(out)


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
    model: Any, generations: Sequence[Generation], *, layers: Sequence[int], vocab_size: int
) -> tuple[CapturedSequence, ...]:
    """One forward per generation with ``output_hidden_states``: the fused ``layers``' hidden
    states, the LM head's input and the greedy next token (over the first ``vocab_size`` ids)
    at every position from the last prompt token on (:class:`CapturedSequence`). A target whose
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
                start = g.prompt_len - 1
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
