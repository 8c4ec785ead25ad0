"""The fast forward captured whole by ``torch.compile``, for forwards of chosen token counts.

Outside its matmuls a decode step on a small model is mostly small ops (norms, RoPE, SiLU,
residual adds, reshapes) and the Python between them; inductor fuses the ops and drops the
Python. :class:`CompiledForward` compiles :class:`~specstrat.hf.fast_llama.FastLlamaForward`'s
arithmetic as one graph per token count (static shapes, inductor's ``freezing``: the weights
become constants). Each matmul runs as the load-time plan says for that count
(:class:`~specstrat.hf.matmul_padding.MatmulPlan`): its ``F.linear`` rows inductor lays out for
itself (a second copy of those weights, held by the graph), its oneDNN-packed rows through one
custom operator each, ``specstrat::packed_linear``, on the copies packed at load (inductor
cannot read a packed layout). With only ``F.linear`` in the graph, NGRAM's 4-token verifies ran
0.93x the eager engine on SmolLM2; through the plan, 1.05x (``bench/compile_engine.py``).

The engine's attention stays outside the graph without splitting it: each layer's call goes
through one custom operator, ``specstrat::attend``, which hands ``q``, ``k`` and ``v`` to the
forward's :class:`~specstrat.models.AttentionBackend` (the paged KV cache's write and read, any
context length), so one graph serves every step of a count however long the context grows.

It is opt-in (:meth:`~specstrat.hf.HFCausalLM.compile`, ``--compile`` on ``specstrat bench`` and
``specstrat demo``): each count compiles for 5 to 50 seconds at load. Each count's graph is
checked at load against the eager fast forward on a probe, like the fast forward against
transformers' (:func:`~specstrat.hf.fast_llama.probe_tolerance`); compiled logits differ from
eager ones in the last bits (inductor sums in another order), so greedy outputs stay equal to
transformers' within the certified-tie rule (:func:`~specstrat.hf.compare`), not bit for bit.
"""

from __future__ import annotations

import contextvars
import copy
import types
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf.attention_probe import Probe
from specstrat.hf.fast_llama import (
    FastLlamaForward,
    disagreement,
    probe_inputs,
    probe_tolerance,
)
from specstrat.hf.matmul_padding import EXACT, MatmulPlan, run_packed
from specstrat.models import AttentionBackend

__all__ = ["MAX_COMPILED_COUNTS", "CompiledForward", "check_token_counts"]

#: The most token counts one forward compiles (dynamo keeps 8 graphs per code object).
MAX_COMPILED_COUNTS = 8

#: The fix every refusal ends with.
_NO_COMPILE = "run without compiling (drop --compile, or leave HFCausalLM.compile uncalled)"

_BACKEND: contextvars.ContextVar[AttentionBackend | None] = contextvars.ContextVar(
    "specstrat_compiled_attention", default=None
)

_Result = tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]


# Declared pure although the backend writes the KV cache: the cache is state outside the graph,
# and each layer's output feeds the next layer's input, so inductor can neither drop nor reorder
# the calls.
@torch.library.custom_op("specstrat::attend", mutates_args=())
def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """The current forward's backend on one layer (writes its KV cache, returns the output)."""
    backend = _BACKEND.get()
    if backend is None:
        raise InvalidConfig(
            "specstrat::attend runs only inside a compiled specstrat forward; call the model "
            "through specstrat.hf.HFCausalLM"
        )
    out = backend(layer, q, k, v, scaling=scaling, sliding_window=sliding_window, softcap=softcap)
    out = out.contiguous()  # the strides the graph was traced with (the fake below)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    # A custom operator's output may not alias an input: a backend returning a view is copied.
    return out.clone() if out.untyped_storage().data_ptr() in inputs else out


@_attend.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    scaling: float | None,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.custom_op("specstrat::packed_linear", mutates_args=())
def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, form: str, width: int
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` on the load-time packed copy of ``W`` (``width`` output features)
    by the plan's :data:`~specstrat.hf.matmul_padding.EXACT` ``form``: inductor cannot read a
    packed layout, so the graph calls the matmul the eager forward runs."""
    return run_packed(form, x, packed, bias).contiguous()


@_packed_linear.register_fake
def _(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, form: str, width: int
) -> torch.Tensor:
    return x.new_empty(x.shape[0], width)


class _GraphPlan(MatmulPlan):
    """A matmul plan that runs its packed forms through ``specstrat::packed_linear``."""

    def __init__(self, plan: MatmulPlan) -> None:
        super().__init__(plan.ways, plan.beyond)

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        packed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`MatmulPlan.linear`, the packed forms as one opaque operator each."""
        way = self.way(x.shape[0])
        if way is not None and way[0] in EXACT and packed is not None:
            width = int(weight.shape[0])
            out: torch.Tensor = torch.ops.specstrat.packed_linear(x, packed, bias, way[0], width)
            return out
        return super().linear(x, weight, bias, packed)


def _through_op(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The attention the graph records: one ``specstrat::attend`` call per layer."""
    out: torch.Tensor = torch.ops.specstrat.attend(q, k, v, layer, scaling, sliding_window, softcap)
    return out


def check_token_counts(counts: Iterable[int], where: str, limit: int) -> tuple[int, ...]:
    """``counts`` sorted without repeats, or :class:`~specstrat.errors.InvalidConfig` naming
    ``where`` they came from when they are not a collection of ints from 1 to ``limit`` (the
    most tokens a forward can hold: the model's positions), none is given, or there are more
    than :data:`MAX_COMPILED_COUNTS`."""
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Iterable):
        raise InvalidConfig(
            f"{where}={counts!r}: pass the token counts to compile as a list of ints, e.g. [1, 4]"
        )
    values = tuple(counts)
    bad = [c for c in values if not is_int(c) or not 1 <= c <= limit]
    if bad or not values:
        raise InvalidConfig(
            f"{where}={list(values)!r}: token counts to compile must be ints from 1 to {limit} "
            "(the tokens of one forward: the batch size for decode, batch size x verify tokens "
            "for a verify; at most the model's positions), e.g. 1"
        )
    unique = tuple(sorted(set(values)))
    if len(unique) > MAX_COMPILED_COUNTS:
        raise InvalidConfig(
            f"{where}={list(values)!r}: {len(unique)} token counts; at most "
            f"{MAX_COMPILED_COUNTS} compile (one graph each); keep the counts the run uses most"
        )
    return unique


class CompiledForward:
    """``fast``'s forward compiled for the token counts ``counts`` and the decoder layers it
    returns ``keep``; see the module docstring. Build it with :meth:`build`."""

    def __init__(
        self, fast: FastLlamaForward, counts: tuple[int, ...], keep: tuple[int, ...]
    ) -> None:
        #: The eager forward compiled (a graph serves only forwards of it).
        self.fast = fast
        #: The token counts with a graph, sorted.
        self.counts = counts
        #: The decoder layers whose outputs the graphs return (the wrapper's feature layers).
        self.keep = keep
        self._checked = False  # past the load-time check a graph is never compiled mid-run
        #: torch's thread count at compile time: inductor's loops are built for it.
        self.threads = torch.get_num_threads()
        linear = copy.copy(fast)  # the same weights and packed copies
        linear.plan, linear.head_plan = _GraphPlan(fast.plan), _GraphPlan(fast.head_plan)

        def forward(tokens: torch.Tensor, positions: torch.Tensor) -> _Result:
            return linear(tokens, positions, _through_op, keep)

        self._graph: Callable[[torch.Tensor, torch.Tensor], _Result] = torch.compile(
            _own_code(forward), dynamic=False, options={"freezing": True}
        )

    @classmethod
    def build(
        cls,
        fast: FastLlamaForward | None,
        counts: Iterable[int],
        keep: Sequence[int],
        vocab_size: int,
        limit: int,
        name: str = "model",
    ) -> CompiledForward:
        """Compile ``fast`` (the fast forward of the model called ``name``; ``None``: it runs
        transformers' forward, refused) for each of ``counts`` (checked by
        :func:`check_token_counts` against ``limit``) and
        check each graph against the eager forward on a probe of that many tokens; a compile
        that fails (no C++ compiler, an op inductor cannot lower) or a graph that disagrees is
        a :class:`~specstrat.errors.ModelLoadError` saying so, as is a torch without
        ``torch.compiler.set_stance`` (before 2.6)."""
        if fast is None:
            raise ModelLoadError(
                f"{name}: only the fast forward of a plain transformers Llama compiles (this "
                "model runs transformers' own forward: another class, HFCausalLM(fast=False), or "
                f"hooked or changed after wrapping, which lasts until wrapped anew); {_NO_COMPILE}"
            )
        if not hasattr(torch.compiler, "set_stance"):
            raise ModelLoadError(
                f"{name}: compiling the forward needs torch >= 2.6 (torch.compiler.set_stance); "
                f"this is torch {torch.__version__}: upgrade torch, or {_NO_COMPILE}"
            )
        unique = check_token_counts(counts, "token_counts", limit)
        with warnings.catch_warnings():  # inductor imports torch.jit's deprecated parts
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.")
            compiled = cls(fast, unique, tuple(keep))
            compiled._check(vocab_size, name)
        compiled._checked = True
        return compiled

    def _check(self, vocab_size: int, name: str) -> None:
        """Compile each count's graph and compare it with the eager forward on a probe."""
        fast = self.fast
        for n in self.counts:
            tokens, positions = probe_inputs(n, vocab_size, fast.device)
            try:
                with torch.inference_mode():
                    want = fast(tokens, positions, Probe(), self.keep)
                    got = self(tokens, positions, Probe())
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                hint = "; inductor needs a C++ compiler (g++)" if "compiler" in first else ""
                raise ModelLoadError(
                    f"{name}: torch.compile of the forward for {n} token(s) failed "
                    f"({type(exc).__name__}: {first}){hint}; {_NO_COMPILE}"
                ) from exc
            for what, a, b in _pairs(want, got, vocab_size):
                gap = disagreement(a, b)
                if gap is not None:
                    raise ModelLoadError(
                        f"{name}: the compiled forward's {what} for {n} token(s) differ from the "
                        f"eager forward's by {gap:.3g}, past {probe_tolerance(a.dtype):g} of "
                        f"their range; {_NO_COMPILE}"
                    )

    def serves(
        self,
        fast: FastLlamaForward,
        tokens: torch.Tensor,
        keep: Sequence[int],
        rows: torch.Tensor | None,
    ) -> bool:
        """Whether a forward of ``fast`` over ``tokens`` returning ``keep`` and every row's
        logits (``rows`` None) has a graph here, on the threads it was compiled for."""
        return (
            rows is None
            and fast is self.fast
            and int(tokens.shape[0]) in self.counts
            and tuple(keep) == self.keep
            and torch.get_num_threads() == self.threads
        )

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> _Result:
        """The fast forward's ``(logits, final hidden, kept layers' outputs)`` through the
        graph, ``attention`` serving each layer's ``specstrat::attend``. Once built, inputs no
        graph was compiled for (another dtype, say) run the same arithmetic eagerly rather than
        compile an unchecked graph mid-run."""
        token = _BACKEND.set(attention)
        try:
            if not self._checked:
                return self._graph(tokens, positions)
            with torch.compiler.set_stance("eager_on_recompile"):
                return self._graph(tokens, positions)
        finally:
            _BACKEND.reset(token)


def _own_code(fn: Callable[..., _Result]) -> Callable[..., _Result]:
    """``fn`` with a code object of its own: dynamo keeps at most 8 graphs per code object, so
    without it every compiled forward in the process would share those 8."""
    code = fn.__code__.replace()  # a copy
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _pairs(want: _Result, got: _Result, vocab: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The tensors of two forwards' results to compare, named."""
    pairs = [("logits", want[0][:, :vocab], got[0][:, :vocab]), ("hidden state", want[1], got[1])]
    pairs += [(f"layer {i} output", want[2][i], got[2][i]) for i in sorted(want[2])]
    return pairs
