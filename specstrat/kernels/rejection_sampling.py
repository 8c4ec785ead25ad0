"""Rejection sampling of a draft chain in one launch, with its torch twin and a counter-based RNG.

For each request, draft node ``j`` proposes the token at absolute position ``P = pos + 1 + j``
(``pos``: the root's position). It is accepted with probability ``min(1, p(x) / q(x))``; at the
first rejection the token at ``P`` is drawn from the normalised residual ``max(0, p - q)``, and
after a fully accepted chain the bonus token is drawn from ``p``. A deterministic drafter has no
``q``: ``q`` is one-hot at its token. Every random number is a hash of (request seed, position,
draw index) — draw 0 decides acceptance, draw 1 samples a token, draw 2 is the drafter's — so a
request's tokens depend on its own seed and prompt only, never on the batch it shares.

``sampling_probs`` turns logits into the ``p`` (or ``q``) a request samples from: temperature,
then top-k, then top-p; temperature 0 is one-hot at the argmax (greedy).
"""

from __future__ import annotations

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._triton import Backend, jit, launch, resolve_backend, tl

__all__ = [
    "DRAW_ACCEPT",
    "DRAW_DRAFT",
    "DRAW_SAMPLE",
    "rejection_sample",
    "rejection_sample_ref",
    "sample_from",
    "sampling_probs",
    "uniform",
]

DRAW_ACCEPT, DRAW_SAMPLE, DRAW_DRAFT = 0, 1, 2
_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27: products of 32-bit values stay inside int64, no overflow anywhere


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (int64 tensors holding values in 0..2**32-1)."""
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    return (x >> 16) ^ x


def uniform(seed: torch.Tensor, position: torch.Tensor, draw: int) -> torch.Tensor:
    """A float64 in (0, 1) per element, a pure function of (seed, position, draw)."""
    seed = seed.to(torch.int64)
    h = _mix(((seed >> 32) & _MASK32) ^ 0x9E3779B9) ^ (seed & _MASK32)
    h = _mix(_mix(h) ^ (position.to(torch.int64) & _MASK32))
    h = _mix(h ^ draw)
    return (h.to(torch.float64) + 0.5) / 4294967296.0


def sampling_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    *,
    filtered: bool = True,
) -> torch.Tensor:
    """Probabilities ``[rows, V]`` (float64) after temperature, top-k and top-p, per row.

    ``logits`` is ``[rows, V]``; the parameters are ``[rows]``. Temperature 0 gives one-hot at
    the argmax; ``top_k`` 0 keeps every token; top-p keeps the smallest set of most likely
    tokens whose mass reaches ``top_p`` (ties broken by token id). ``filtered=False`` is the
    caller's host-side word that no row uses top-k or top-p: the sort is skipped (0.9 s per
    call at V=49152 and 64 rows on this CPU).
    """
    vocab = logits.shape[-1]
    scores = logits.to(torch.float64)
    greedy = temperature <= 0
    scaled = scores / torch.where(greedy, 1.0, temperature.to(torch.float64))[:, None]
    onehot = torch.zeros_like(scaled).scatter(-1, scores.argmax(-1, keepdim=True), 1.0)
    if not filtered:
        return torch.where(greedy[:, None], onehot, torch.softmax(scaled, dim=-1))
    order = torch.argsort(scaled, dim=-1, descending=True, stable=True)
    ranked = scaled.gather(-1, order)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    keep = (top_k[:, None] <= 0) | (rank < top_k[:, None])
    probs = torch.softmax(ranked.masked_fill(~keep, float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the more likely tokens
    keep &= before < top_p.to(torch.float64)[:, None]
    probs = torch.softmax(ranked.masked_fill(~keep, float("-inf")), dim=-1)
    out = torch.zeros_like(scaled).scatter(-1, order, probs)
    return torch.where(greedy[:, None], onehot, out)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample per row of ``probs`` ``[rows, V]`` (need not be normalised) with
    uniforms ``u`` ``[rows]``: the first index whose cumulative mass exceeds ``u * total``."""
    cdf = probs.cumsum(-1)
    target = u.to(cdf.dtype) * cdf[:, -1]
    return (cdf <= target[:, None]).sum(-1).clamp(max=probs.shape[-1] - 1)


def rejection_sample_ref(
    p: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch twin: accepted drafts per request and the token after them.

    ``p`` ``[bs, n + 1, V]`` target probabilities at the root and each node; ``tokens``
    ``[bs, n]`` the chain; ``lengths`` ``[bs]`` its real nodes; ``q`` ``[bs, n, V]`` the draft
    distributions (``None``: one-hot at each token); ``seeds``, ``positions`` ``[bs]``.
    """
    bs, n = tokens.shape
    rows = torch.arange(bs, device=p.device)
    accepted = torch.zeros(bs, dtype=torch.int64, device=p.device)
    stopped = torch.zeros(bs, dtype=torch.bool, device=p.device)
    bonus = torch.full((bs,), -1, dtype=torch.int64, device=p.device)
    for j in range(n):
        x = tokens[:, j]
        live = (j < lengths) & ~stopped
        p_j = p[:, j]  # reads: the target's distribution at node j's parent
        onehot = torch.zeros_like(p_j).scatter(-1, x[:, None], 1.0)
        q_j = onehot if q is None else q[:, j].to(p_j.dtype)
        at = positions + 1 + j
        ok = uniform(seeds, at, DRAW_ACCEPT) * q_j[rows, x] < p_j[rows, x]
        residual = (p_j - q_j).clamp(min=0)
        empty = residual.sum(-1, keepdim=True) <= 0  # p == q: the residual is p itself
        residual = torch.where(empty, p_j, residual)
        resampled = sample_from(residual, uniform(seeds, at, DRAW_SAMPLE))
        rejected = live & ~ok
        accepted = torch.where(live & ok, accepted + 1, accepted)
        bonus = torch.where(rejected, resampled, bonus)
        stopped |= rejected
    last = p[rows, accepted]  # reads: the distribution after the accepted chain
    tail = sample_from(last, uniform(seeds, positions + 1 + accepted, DRAW_SAMPLE))
    return accepted, torch.where(stopped, bonus, tail)


@jit
def _mix_tl(x: tl.tensor):  # type: ignore[no-untyped-def]
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return (x >> 16) ^ x


@jit
def _uniform_tl(seed, position, DRAW: tl.constexpr):  # type: ignore[no-untyped-def]
    h = _mix_tl(((seed >> 32) & 0xFFFFFFFF) ^ 0x9E3779B9) ^ (seed & 0xFFFFFFFF)
    h = _mix_tl(_mix_tl(h) ^ (position & 0xFFFFFFFF))
    h = _mix_tl(h ^ DRAW)
    return (h.to(tl.float64) + 0.5) / 4294967296.0


@jit
def _sample_tl(row_ptr, cols, mask, u, V: tl.constexpr):  # type: ignore[no-untyped-def]
    probs = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float64)
    cdf = tl.cumsum(probs, axis=0)
    target = u * tl.sum(probs, axis=0)
    index = tl.sum(((cdf <= target) & mask).to(tl.int64), axis=0)
    return tl.minimum(index, V - 1)


@jit
def _rejection_sample_kernel(  # type: ignore[no-untyped-def]
    p_ptr,
    q_ptr,
    tokens_ptr,
    lengths_ptr,
    seeds_ptr,
    positions_ptr,
    accepted_ptr,
    bonus_ptr,
    N: tl.constexpr,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_Q: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    length = tl.load(lengths_ptr + row)
    seed = tl.load(seeds_ptr + row)
    position = tl.load(positions_ptr + row)
    cols = tl.arange(0, BLOCK_V)
    mask = cols < V
    accepted = length * 0
    stopped = length * 0
    bonus = length * 0 - 1
    for j in tl.static_range(N):
        x = tl.load(tokens_ptr + row * N + j)
        p_row = p_ptr + (row * (N + 1) + j) * V
        p_j = tl.load(p_row + cols, mask=mask, other=0.0).to(tl.float64)
        if HAS_Q:
            q_j = tl.load(q_ptr + (row * N + j) * V + cols, mask=mask, other=0.0).to(tl.float64)
        else:
            q_j = (cols == x).to(tl.float64)
        px = tl.sum(tl.where(cols == x, p_j, 0.0), axis=0)
        qx = tl.sum(tl.where(cols == x, q_j, 0.0), axis=0)
        at = position + 1 + j
        ok = _uniform_tl(seed, at, 0) * qx < px
        residual = tl.maximum(p_j - q_j, 0.0)
        residual = tl.where(tl.sum(residual, axis=0) <= 0.0, p_j, residual)
        cdf = tl.cumsum(residual, axis=0)
        target = _uniform_tl(seed, at, 1) * tl.sum(residual, axis=0)
        resampled = tl.minimum(tl.sum(((cdf <= target) & mask).to(tl.int64), axis=0), V - 1)
        live = (j < length) & (stopped == 0)
        rejected = live & (ok == 0)
        accepted = tl.where(live & ok, accepted + 1, accepted)
        bonus = tl.where(rejected, resampled, bonus)
        stopped = tl.where(rejected, 1, stopped)
    u = _uniform_tl(seed, position + 1 + accepted, 1)
    tail = _sample_tl(p_ptr + (row * (N + 1) + accepted) * V, cols, mask, u, V)
    tl.store(accepted_ptr + row, accepted)
    tl.store(bonus_ptr + row, tl.where(stopped == 1, bonus, tail))


def _check(
    p: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor | None,
) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise InvalidConfig(f"tokens is {tokens.dtype} {tuple(tokens.shape)}; need int64 [bs, n]")
    bs, n = tokens.shape
    if (
        p.dim() != 3
        or tuple(p.shape[:2]) != (bs, n + 1)
        or not p.dtype.is_floating_point
        or not p.shape[2]
    ):
        raise InvalidConfig(
            f"p is {p.dtype} {tuple(p.shape)}; need floating [bs={bs}, n + 1={n + 1}, vocab]"
        )
    if q is not None and (tuple(q.shape) != (bs, n, p.shape[2]) or not q.dtype.is_floating_point):
        raise InvalidConfig(f"q is {q.dtype} {tuple(q.shape)}; need floating {(bs, n, p.shape[2])}")
    for name, tensor in (("lengths", lengths), ("seeds", seeds), ("positions", positions)):
        if tuple(tensor.shape) != (bs,) or tensor.dtype != torch.int64:
            raise InvalidConfig(
                f"{name} is {tensor.dtype} {tuple(tensor.shape)}; need int64 [{bs}]"
            )
    if tokens.device.type == "cpu" and bs:  # value checks read tensors: CPU only
        if bool(((lengths < 0) | (lengths > n)).any()):
            raise InvalidConfig(f"lengths={lengths.tolist()} must lie in 0..{n}")
        if n and bool(((tokens < 0) | (tokens >= p.shape[2])).any()):
            raise InvalidConfig(f"tokens hold ids outside the vocabulary 0..{p.shape[2] - 1}")


def rejection_sample(
    p: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    q: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted drafts ``[bs]`` and the next token ``[bs]`` for a batch of chains; one launch,
    no host sync on the Triton path (see :func:`rejection_sample_ref` for the arguments)."""
    _check(p, tokens, lengths, seeds, positions, q)
    if resolve_backend(backend, p, tokens) == "torch":
        return rejection_sample_ref(p, tokens, lengths, seeds, positions, q)
    bs, n = tokens.shape
    vocab = p.shape[2]
    accepted = torch.empty(bs, dtype=torch.int64, device=p.device)
    bonus = torch.empty(bs, dtype=torch.int64, device=p.device)
    if bs:
        p_c = p.contiguous()
        q_c = q.contiguous() if q is not None else p_c  # unread when HAS_Q is False
        launch(
            _rejection_sample_kernel,
            (bs,),
            p_c,
            q_c,
            tokens.contiguous(),
            lengths,
            seeds,
            positions,
            accepted,
            bonus,
            N=n,
            V=vocab,
            BLOCK_V=max(16, 1 << (vocab - 1).bit_length()),
            HAS_Q=q is not None,
        )
    return accepted, bonus
