"""Any Hugging Face causal LM behind :class:`~specstrat.models.CausalLM`, with no modelling code
copied: the engine's paged attention runs inside a function registered with transformers'
attention interface.

How a forward reaches the engine's attention: :class:`HFCausalLM` sets the step's
:class:`~specstrat.models.AttentionBackend` in a context variable around the model's own forward
(so it works whether or not a model passes extra keyword arguments down to its attention) and
passes positions as ``position_ids`` (RoPE, partial rotary and learned positions all follow
them). transformers calls :func:`paged_attention` once per layer with the query
``[1, heads, n, head_dim]``, the un-repeated key/value ``[1, kv_heads, n, head_dim]``, the
attention module (its ``layer_idx``) and the layer's ``scaling``, ``sliding_window`` and
``softcap``; the function hands them to the backend, which writes the KV cache and attends
through the metadata the kernels built. transformers builds no mask for an implementation it
does not know, so the engine's metadata is the only mask.

A plain transformers Llama takes another route where a probe at load proves it equal:
:mod:`specstrat.hf.fast_llama` computes the same arithmetic over the model's own weights
without transformers' per-layer modules and calls the backend itself (a forward of our own, not
transformers' code, so the design's "no modelling code copied" holds; it only serves models it
can check against transformers' forward).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from specstrat._ints import is_int
from specstrat.errors import EngineStateError, InvalidConfig, ModelLoadError
from specstrat.hf.attention_probe import LayerShape, Probe, attention_class, attention_layers
from specstrat.hf.compiled_forward import CompiledForward
from specstrat.hf.early_exit_view import truncated_model
from specstrat.hf.fast_llama import FastLlamaForward, proven
from specstrat.hf.layer_features import captured, checked_layers, fused, install_layer_hooks
from specstrat.hf.model_checks import check_model
from specstrat.models import AttentionBackend, ModelShape

__all__ = ["ATTENTION_NAME", "HFCausalLM", "paged_attention"]

#: The name :func:`paged_attention` is registered under in transformers' ``AttentionInterface``.
ATTENTION_NAME = "specstrat_paged"

_BACKEND: contextvars.ContextVar[AttentionBackend | None] = contextvars.ContextVar(
    "specstrat_attention", default=None
)
_HIDDEN: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar(
    "specstrat_hidden", default=None
)

# Keyword arguments transformers' models pass to an attention function that carry nothing the
# engine's metadata does not already say (positions, caches, flash-attention varlen bounds).
_IGNORED = frozenset(
    {
        "dropout",
        "position_ids",
        "use_cache",
        "cache",
        "cache_position",
        "is_causal",
        "output_attentions",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "output_router_logits",  # MoE models pass their router flag down to every layer
    }
)
# The config field behind each keyword argument, for the refusal message.
_CONFIG_FIELD = {"s_aux": "sinks (attention sinks)", "position_bias": "relative position bias"}


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over the engine's backend for this forward.

    Returns ``(output [1, n, heads, head_dim], None)`` as transformers' own functions do. The
    ``attention_mask`` is ignored: the backend masks through the engine's metadata. A keyword
    argument this cannot honour (an attention sink, a position bias) raises
    :class:`~specstrat.errors.ModelLoadError` naming it; :func:`~specstrat.hf.load` calls the
    model once at load, so such a model is refused there.
    """
    backend = _BACKEND.get()
    if backend is None:
        raise InvalidConfig(
            f"attn_implementation={ATTENTION_NAME!r} runs only inside a specstrat forward; "
            "call the model through specstrat.hf.HFCausalLM, or inside `with lm.reference():` "
            "for transformers' own forward and generate"
        )
    # None or False: a feature switched off, nothing to honour.
    unknown = sorted(
        k for k, v in kwargs.items() if k not in _IGNORED and v is not None and v is not False
    )
    if unknown:
        fields = ", ".join(f"{k} ({_CONFIG_FIELD.get(k, 'unsupported')})" for k in unknown)
        raise ModelLoadError(
            f"{type(module).__name__} passes attention arguments specstrat cannot honour: "
            f"{fields}; this model is not supported"
        )
    if query.shape[0] != 1:
        raise InvalidConfig(f"query batch={query.shape[0]}; specstrat runs flat batches of 1")
    if getattr(module, "is_causal", True) is False or kwargs.get("is_causal") is False:
        raise ModelLoadError(
            f"{type(module).__name__} attends bidirectionally (is_causal=False); specstrat runs "
            "causal decoders only"
        )
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        raise ModelLoadError(
            f"{type(module).__name__} has no integer layer_idx; specstrat needs it to address "
            "the layer's KV cache"
        )
    out = backend(
        layer,
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
    )
    return out.unsqueeze(0), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)


class HFCausalLM:
    """A transformers causal LM as a :class:`~specstrat.models.CausalLM`.

    ``model``: a ``PreTrainedModel`` with an LM head whose every attention layer calls
    transformers' ``AttentionInterface`` (seen in the probe forward, whatever the class's
    ``_supports_attention_backend`` flag says); ``vocab_size``: the ids the engine
    may use (the tokenizer's vocabulary; default the LM head's width). The LM head may be wider
    (padded): its extra logits are sliced off. ``__call__`` returns the LM head's logits (after
    any final soft-cap the model applies) and the final normalised hidden state: the LM head's
    input (the base model's ``last_hidden_state``, or its projection where a model projects it
    for the head, as OPT does; what an EAGLE-style head reads; ``shape.hidden_size`` is its
    width).

    Construction runs one probe forward of two tokens (the attention function sees every
    layer; with ``fast``, two more compare the fast forward with transformers'): it sizes
    :attr:`shape` from what the layers actually pass (query heads, key/value heads, head
    width) and refuses, with :class:`~specstrat.errors.ModelLoadError`, a model whose
    attention needs something the engine cannot do. The model is switched to the engine's
    attention; :meth:`reference` switches it back for transformers' own forward and
    ``generate``.

    ``fast``: run :class:`~specstrat.hf.fast_llama.FastLlamaForward` in place of
    transformers' forward where the model qualifies and the probe shows it computes the same
    (:attr:`fast_forward` says whether it does); ``False`` always runs transformers' forward.
    """

    def __init__(
        self, model: Any, *, vocab_size: int | None = None, name: str = "model", fast: bool = True
    ) -> None:
        check_model(model, name)
        # Every value is checked before the model is touched: a refused model keeps its
        # attention implementation and gets no hook.
        head = model.get_output_embeddings()
        width = int(head.weight.shape[0])
        if vocab_size is not None and (not is_int(vocab_size) or vocab_size < 1):
            raise InvalidConfig(f"vocab_size={vocab_size!r} must be an int >= 1, or None")
        positions = getattr(model.config, "max_position_embeddings", None)
        if not isinstance(positions, int):
            raise ModelLoadError(
                f"{name}: config has no max_position_embeddings; specstrat bounds context_len by it"
            )
        _register()
        self.model = model
        self.name = name
        #: Decoder layers whose outputs ``__call__`` returns as the hidden state; () the final.
        self.feature_layers: tuple[int, ...] = ()
        #: The forward the engine runs in place of transformers' own, where one is proven at
        #: load (:mod:`specstrat.hf.fast_llama`); ``None``: transformers' forward.
        self.fast_forward: FastLlamaForward | None = None
        #: The fast forward compiled for some token counts (:meth:`compile`); ``None``: eager.
        self.compiled: CompiledForward | None = None
        current = model.config._attn_implementation
        if current == ATTENTION_NAME:  # wrapped before: transformers' own is the one kept then
            current = getattr(model, "_specstrat_reference_attention", None) or "eager"
        #: transformers' attention implementation :meth:`reference` switches back to.
        self.reference_attention: str = current
        #: LM head width; logit columns kept: the tokenizer's ids (a padded head's rest dropped).
        self.head_width = width
        # A tokenizer may count an id or two past the head (transformers adds a pad token to
        # some GGUF tokenizers): the head's ids are what can be produced, so those are kept.
        self.vocab_size = width if vocab_size is None else min(vocab_size, width)
        # The hidden state is what the LM head reads (some models, such as OPT, call their decoder
        # around the base model, so a hook on the base model would never fire).
        hooked = getattr(head, "_specstrat_hidden_hook", False)
        handle = (
            None if hooked else head.register_forward_pre_hook(_capture_hidden, with_kwargs=True)
        )
        model.set_attn_implementation(ATTENTION_NAME)
        try:
            layers = self._probe()
            first = layers[0]
            if any(shape != first for shape in layers.values()) or sorted(layers) != list(
                range(len(layers))
            ):
                raise ModelLoadError(
                    f"{name}: layers differ in head shapes or order ({layers}); specstrat's KV "
                    "cache holds one head shape for every layer"
                )
        except BaseException:  # a refused model is left as it came
            model.set_attn_implementation(self.reference_attention)
            if handle is not None:
                handle.remove()
            raise
        head._specstrat_hidden_hook = True  # one hook however many wrappers
        model._specstrat_reference_attention = self.reference_attention
        self._shape = ModelShape(
            vocab_size=self.vocab_size,
            hidden_size=int(head.weight.shape[1]),  # what the head reads (OPT projects it)
            layers=len(layers),
            heads=first.heads,
            kv_heads=first.kv_heads,
            head_dim=first.head_dim,
            max_positions=positions,
        )
        #: Whether :attr:`fast_forward` may run (the constructor's ``fast``).
        self.fast = fast
        if fast:
            self.fast_forward = self._proven_fast_forward()

    def _probe(self) -> dict[int, LayerShape]:
        probe = Probe()
        device = next(self.model.parameters()).device
        tokens = torch.zeros(2, dtype=torch.long, device=device)
        with torch.inference_mode():
            self(tokens, torch.arange(2, device=device), probe)
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        depth = int(getattr(text, "num_hidden_layers", 0) or len(probe.layers))
        held = attention_layers(self.model) or set(range(depth))  # a view may hold fewer
        missing = sorted(held - set(probe.layers))
        if missing:
            classes = sorted({attention_class(self.model, i) for i in missing})
            which = "none of its layers" if len(missing) == len(held) else f"layers {missing}"
            raise ModelLoadError(
                f"{self.name}: {type(self.model).__name__}'s attention in {which} "
                f"({', '.join(classes)}) did not call transformers' attention interface in the "
                "probe forward (it computes attention itself), so specstrat's KV cache would be "
                "bypassed; this model is not supported"
            )
        return probe.layers

    def _proven_fast_forward(self) -> FastLlamaForward | None:
        """:func:`~specstrat.hf.fast_llama.proven` against this wrapper's transformers
        forward (run with :attr:`fast_forward` unset)."""
        self.fast_forward = None
        plain = copy.copy(self)  # its hidden state is the final one, whatever layers this reads
        plain.feature_layers = ()
        return proven(self.model, plain, self.vocab_size)

    @property
    def shape(self) -> ModelShape:
        """Vocabulary (the tokenizer's), widths, depth and head shapes, as the probe saw them."""
        return self._shape

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The wrapped model's parameters (their dtype and device are the KV cache's)."""
        return iter(self.model.parameters(recurse))

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[n, vocab_size]`` and final hidden states ``[n, hidden]`` for flat tokens."""
        return self.forward_rows(tokens, positions, attention, None)

    def forward_rows(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        rows: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`__call__` with the logits of ``rows`` only (every row's with ``None``); the
        fast forward leaves the LM head out for the rest, transformers' computes every row's."""
        attn = self.model.config._attn_implementation
        if attn != ATTENTION_NAME:
            raise EngineStateError(
                f"{self.name}: the model's attn_implementation={attn!r}, not {ATTENTION_NAME!r} "
                "(a forward inside HFCausalLM.reference(), or the attention switched by hand): "
                "the engine's KV cache would be bypassed; run the engine outside reference()"
            )
        if self.model.training:  # switched after wrapping: the model's state, not a bad value
            raise EngineStateError(
                f"{self.name}: the model is in training mode (dropout would make every forward "
                "differ); call model.eval() first"
            )
        fast, compiled, keep = self._current_fast(), self.compiled, self.feature_layers
        if fast is not None:
            if compiled is not None and compiled.serves(fast, tokens, keep, rows):
                logits, final, outputs = compiled(tokens, positions, attention)
            else:
                logits, final, outputs = fast(tokens, positions, attention, keep, rows)
            if self.feature_layers:
                final = fused(outputs, self.feature_layers, final[None], self.name)[0]
            return logits[:, : self.vocab_size], final
        hidden: list[torch.Tensor] = []
        backend, box = _BACKEND.set(attention), _HIDDEN.set(hidden)
        try:
            with captured(self.feature_layers) as outputs:
                out = self.model(
                    input_ids=tokens[None], position_ids=positions[None], use_cache=False
                )
        finally:
            _BACKEND.reset(backend)
            _HIDDEN.reset(box)
        if not hidden:
            raise ModelLoadError(
                f"{self.name}: {type(self.model).__name__}'s forward never called its LM head "
                "(get_output_embeddings()); specstrat reads the hidden state the head reads"
            )
        final = hidden[-1][0]
        if self.feature_layers:
            final = fused(outputs, self.feature_layers, hidden[-1], self.name)[0]
        logits = out.logits[0, :, : self.vocab_size]
        return (logits if rows is None else logits[rows]), final

    def _current_fast(self) -> FastLlamaForward | None:
        """The fast forward, proven anew (its graphs dropped) where the model was moved, cast
        or changed since."""
        fast = self.fast_forward
        if fast is not None and not fast.current():
            fast = self.compiled = None  # its packed weights go before new ones are made
            fast = self.fast_forward = self._proven_fast_forward()
        return fast

    def compile(self, token_counts: Iterable[int]) -> None:
        """Compile the fast forward for ``token_counts`` (:mod:`specstrat.hf.compiled_forward`,
        :meth:`~specstrat.hf.compiled_forward.CompiledForward.build`: what it refuses; 5-50 s a
        count), returning :attr:`feature_layers`; other forwards stay eager, and a model moved,
        cast or changed later drops the graphs."""
        fast, keep, limit = self._current_fast(), self.feature_layers, self.shape.max_positions
        self.compiled = CompiledForward.build(
            fast, token_counts, keep, self.vocab_size, limit, self.name
        )

    def with_feature_layers(self, layers: Sequence[int]) -> HFCausalLM:
        """This model (the same weights and attention) returning, in place of the final hidden
        state, the outputs of decoder ``layers`` concatenated (``[n, len(layers) * H]``, what an
        EAGLE-3-style head reads; ``shape.hidden_size`` says that width). The logits are
        unchanged."""
        picked = checked_layers(layers, self.shape.layers, self.name)
        install_layer_hooks(self.model, self.shape.layers)  # a fast forward's watch skips these
        view = copy.copy(self)
        view.feature_layers = picked
        view._shape = replace(self._shape, hidden_size=len(picked) * self._shape.hidden_size)
        return view

    def early_exit(self, exit_layer: int) -> HFCausalLM:
        """The first ``exit_layer`` layers plus the final norm and LM head, sharing this model's
        weights (an :class:`~specstrat.models.EarlyExitModel`; see
        :mod:`specstrat.hf.early_exit_view`)."""
        top = truncated_model(self.model, self.shape.layers, exit_layer, self.name)
        view = HFCausalLM(
            top, vocab_size=self.vocab_size, name=f"{self.name}[:{exit_layer}]", fast=self.fast
        )
        view.reference_attention = self.reference_attention  # the shared config says ours now
        return view

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        """The wrapped model on transformers' own attention for the block (its forward and
        ``generate`` as transformers runs them); the engine's attention again after."""
        before = self.model.config._attn_implementation
        self.model.set_attn_implementation(self.reference_attention)
        try:
            yield self.model
        finally:
            self.model.set_attn_implementation(before)


def _capture_hidden(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
    box = _HIDDEN.get()
    if box is not None:
        box.append(args[0] if args else next(iter(kwargs.values())))
