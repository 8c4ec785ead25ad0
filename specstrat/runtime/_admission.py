"""What PREBUILT admission on the decode side of disaggregation takes, and its checks: a received
batch is checked whole against the engine's model and algorithm before anything is queued
(:meth:`~specstrat.runtime._step.StepRunner.admit_prebuilt` then installs it).

:class:`TransferBatch` is what crosses the wire (:mod:`specstrat.runtime._disagg.wire`): every
field batched, requests in order, the drafter's prefill payload as a
:class:`~specstrat.relay.RelayPayload`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specstrat.contracts import describe
from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import DisaggError
from specstrat.models import ModelShape
from specstrat.relay import RelayPayload
from specstrat.runtime._requests import Request

__all__ = ["TransferBatch", "check_transfer"]


@dataclass(frozen=True, slots=True)
class TransferBatch:
    """One prefilled batch: ids, prompts, budgets, stop tokens, bonus tokens, KV and payload.

    ``bonus_tokens`` ``[bs]``: each request's first generated token, its next input.

    ``k``/``v`` are ``[layers, sum(prompt lengths), kv_heads, head_dim]``: request ``i``'s KV is the
    slice of ``len(prompts[i])`` positions after the previous requests'. ``payload`` holds what
    the algorithm's drafter asked the prefill side to send (``DrafterNeeds.prefill_fields``).
    """

    rids: tuple[str, ...]
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: torch.Tensor
    bonus_tokens: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    payload: RelayPayload = field(default_factory=RelayPayload)
    stop_token_ids: tuple[frozenset[int], ...] = ()
    sampling: tuple[SamplingParams, ...] = ()

    @property
    def kv_lens(self) -> list[int]:
        """Positions of KV per request (its prompt length)."""
        return [len(p) for p in self.prompts]

    def requests(self) -> list[Request]:
        """The requests this batch carries."""
        stops = self.stop_token_ids or (frozenset(),) * len(self.rids)
        params = self.sampling or (GREEDY,) * len(self.rids)
        budgets = self.max_new_tokens.tolist()
        return [
            Request(r, p, int(n), s, c)
            for r, p, n, s, c in zip(self.rids, self.prompts, budgets, stops, params, strict=True)
        ]


_Fail = Callable[..., DisaggError]


def _int_field(name: str, tensor: object, bs: int, fail: _Fail) -> torch.Tensor:
    if (
        not isinstance(tensor, torch.Tensor)
        or tensor.dtype != torch.int64
        or tuple(tensor.shape) != (bs,)
    ):
        got = describe(tensor)
        raise fail(f"{name} is {got}; expected torch.int64 [{bs}]")
    return tensor


def check_transfer(
    batch: TransferBatch,
    *,
    shape: ModelShape,
    prefill_fields: frozenset[str],
    known_rids: set[str],
    room: int,
) -> None:
    """Refuse a batch whose fields disagree with the decode engine, before anything changes.

    Checks ids (unique, new), prompts and tokens (in the vocabulary), budgets (each request fits
    ``room`` = context positions), KV shape, dtype and finiteness, and the payload fields the
    drafter needs (present, one row each, finite, indices in the vocabulary). Raises
    :class:`~specstrat.errors.DisaggError` naming the requests and the field.
    """
    if not isinstance(batch, TransferBatch):
        raise DisaggError(f"batch={type(batch).__name__}; pass a TransferBatch")
    rids = list(batch.rids)

    def fail(problem: str, who: Sequence[str] = rids) -> DisaggError:
        return DisaggError(f"requests {list(who)}: {problem}; the batch was not admitted")

    bs, vocab = len(rids), shape.vocab_size
    if any(not isinstance(r, str) or not r for r in rids) or len(set(rids)) != bs:
        raise fail("request ids must be distinct non-empty strings")
    again = sorted(set(rids) & known_rids)
    if again:
        raise fail(f"request ids {again} were already submitted", again)
    if len(batch.prompts) != bs or any(not p for p in batch.prompts):
        raise fail("every request needs a non-empty prompt")
    if any(not isinstance(t, int) or not 0 <= t < vocab for p in batch.prompts for t in p):
        raise fail(f"prompt tokens must be ints in 0..{vocab - 1}")
    budgets = _int_field("max_new_tokens", batch.max_new_tokens, bs, fail)
    first = _int_field("bonus_tokens", batch.bonus_tokens, bs, fail)
    if bool(((first < 0) | (first >= vocab)).any()):
        raise fail(f"bonus_tokens={first.tolist()} outside the vocabulary 0..{vocab - 1}")
    too_big = [
        r
        for r, p, n in zip(rids, batch.prompts, budgets.tolist(), strict=True)
        if n < 1 or len(p) + n > room
    ]
    if too_big:
        raise fail(f"max_new_tokens < 1, or prompt + max_new_tokens > {room} positions", too_big)
    if batch.stop_token_ids and len(batch.stop_token_ids) != bs:
        raise fail("stop_token_ids needs one set per request")
    if batch.sampling and (
        len(batch.sampling) != bs or any(not isinstance(p, SamplingParams) for p in batch.sampling)
    ):
        raise fail("sampling needs one SamplingParams per request")
    want = (shape.layers, sum(batch.kv_lens), shape.num_kv_heads, shape.head_dim)
    for name in ("k", "v"):
        tensor = getattr(batch, name)
        if (
            not isinstance(tensor, torch.Tensor)
            or tuple(tensor.shape) != want
            or not tensor.dtype.is_floating_point
        ):
            got = describe(tensor)
            raise fail(f"{name} is {got}, expected floating point {want}")
        if not bool(torch.isfinite(tensor).all()):
            raise fail(f"{name} holds NaN or infinite values")
    _check_payload(batch.payload, prefill_fields, bs, shape, fail)


def _check_payload(
    payload: RelayPayload, needed: frozenset[str], bs: int, shape: ModelShape, fail: _Fail
) -> None:
    present = payload.present()
    missing = sorted(needed - set(present))
    if missing:
        raise fail(f"{', '.join(missing)} did not arrive; the algorithm's drafter needs them")
    if present and payload.num_rows != bs:
        raise fail(f"the payload has {payload.num_rows} rows for {bs} requests")
    for name, tensor in present.items():
        if tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
            raise fail(f"{name} holds NaN or infinite values")
    if payload.topk_index is not None and bool(
        ((payload.topk_index < 0) | (payload.topk_index >= shape.vocab_size)).any()
    ):
        raise fail(f"topk_index holds ids outside the vocabulary 0..{shape.vocab_size - 1}")
    if (
        payload.topk_p is not None
        and payload.topk_index is not None
        and payload.topk_p.shape != payload.topk_index.shape
    ):
        raise fail("topk_p and topk_index must both be [bs, k]")
    # The relayed hidden state is the target's (hidden_size wide) or a head's own; a target
    # returning k fused layers (an EAGLE-3 head's input) is k times its head's width.
    hidden = payload.hidden_states
    if hidden is not None and (hidden.dim() != 2 or shape.hidden_size % max(hidden.shape[1], 1)):
        raise fail(
            f"hidden_states is {tuple(hidden.shape)}, expected ({bs}, {shape.hidden_size}) or "
            f"({bs}, W) for a W dividing {shape.hidden_size}"
        )
