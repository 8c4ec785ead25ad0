"""What this machine allows a decode: its memory bandwidth, its matmul rate, and each row's limit.

Decode at small batch reads every weight of the target once per forward, so its tokens per
second cannot pass ``bandwidth / bytes per token``; a forward of many tokens (a wide verify, a
big batch) is bound by the matmul rate instead. :func:`measure_machine` measures both once per
bench run (a STREAM-style triad and a square float32 matmul on torch's threads), and
:func:`roofline` turns them into a row's limit:

- ``weight_bytes_per_token = weight_bytes / (batch * tokens_per_forward)``, where a forward
  serves ``batch = min(batch_size, requests)`` requests and each gains ``tokens_per_forward``
  tokens (1 for plain decoding, τ for speculation, mixed by the share of plain steps);
- ``roofline_tokens_per_s = min(bandwidth / weight_bytes_per_token, matmul_rate *
  tokens_per_forward / (2 * weights * verified))``: the memory-bound limit, or the compute-bound
  one when ``verified`` tokens per request per forward cost more matmul time than the weights'
  bytes do;
- ``roofline_fraction = tokens_per_s / roofline_tokens_per_s``;
- ``decode_roofline_fraction = batch * 1000 / tpot_ms["median"] / roofline_tokens_per_s``: the
  decode steps alone, each request's prefill (its time to first token) left out; exact at batch
  size 1, an estimate above it (it assumes ``batch`` requests decode at once, while other
  requests' prefills inside a request's decode lengthen its TPOT).

Only the target's weights count (a drafter's own reads are left out, so the limit is an upper
bound for any drafter), and prefill is not modelled in ``roofline_fraction``: a short run's
fraction is lower than its decode steps alone reach, which ``decode_roofline_fraction`` gives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from specstrat.bench.rows import BenchRow
from specstrat.errors import InvalidConfig

__all__ = [
    "Machine",
    "Roofline",
    "TargetWeights",
    "measure_machine",
    "roofline",
    "weight_bytes",
    "with_roofline",
]

# 128 MiB an array. The L3 here is 480 MiB but shared with other tenants: measured on two
# threads, arrays of 4-16 MiB gave 58 GB/s (cached), 32 MiB 46, and 128 and 256 MiB both 29,
# so from 128 MiB the triad reads memory, as decode's 538 MB of weights do.
_TRIAD_FLOATS = 32 * 2**20
# A square float32 matmul big enough for the BLAS to reach its peak (2.1 GFLOP, tens of ms).
_MATMUL_SIDE = 1024


@dataclass(frozen=True, slots=True)
class Machine:
    """This machine's measured ``memory_bandwidth_gbs`` (GB/s, 1e9 bytes) and
    ``matmul_gflops`` (float32, 1e9 multiply-adds counted as two flops), on ``threads``."""

    memory_bandwidth_gbs: float
    matmul_gflops: float
    threads: int

    def as_dict(self) -> dict[str, Any]:
        """The JSON keys of a bench run's ``environment``."""
        return {
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
            "matmul_gflops": self.matmul_gflops,
            "roofline_threads": self.threads,
        }


def _best(seconds: list[float]) -> float:
    return min(s for s in seconds if s > 0) if any(s > 0 for s in seconds) else 1e-9


def measure_machine(repeats: int = 5) -> Machine:
    """Best of ``repeats`` of a triad ``a = b + 3c`` over three 128 MiB float32 arrays (24 bytes
    moved an element, STREAM's count) and of a 1024-square float32 matmul."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidConfig(f"repeats={repeats!r} must be an int >= 1")
    a, b, c = (torch.ones(_TRIAD_FLOATS) for _ in range(3))
    triad = []
    for _ in range(repeats + 1):  # the first touches the pages
        start = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        triad.append(time.perf_counter() - start)
    x = torch.randn(_MATMUL_SIDE, _MATMUL_SIDE)
    y = torch.randn(_MATMUL_SIDE, _MATMUL_SIDE)
    out = torch.empty(_MATMUL_SIDE, _MATMUL_SIDE)
    matmul = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.mm(x, y, out=out)
        matmul.append(time.perf_counter() - start)
    moved = 3 * _TRIAD_FLOATS * a.element_size()
    flops = 2 * _MATMUL_SIDE**3
    return Machine(
        memory_bandwidth_gbs=moved / _best(triad[1:]) / 1e9,
        matmul_gflops=flops / _best(matmul[1:]) / 1e9,
        threads=torch.get_num_threads(),
    )


def weight_bytes(model: Any) -> int:
    """Bytes of ``model``'s weights one forward reads: every parameter once (tied ones once),
    less a Hugging Face input embedding that is not also the LM head (a forward gathers a row
    of it per token, not the table)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    inner = getattr(model, "model", None)
    get_in = getattr(inner, "get_input_embeddings", None)
    get_out = getattr(inner, "get_output_embeddings", None)
    if callable(get_in) and callable(get_out):
        embed, head = get_in(), get_out()
        weight = getattr(embed, "weight", None)
        tied = head is not None and getattr(head, "weight", None) is weight
        if weight is not None and not tied:
            seen.pop(weight.data_ptr(), None)
    return sum(seen.values())


@dataclass(frozen=True, slots=True)
class Roofline:
    """One row's limit (see the module docstring for the formulas)."""

    weight_bytes_per_token: float
    roofline_tokens_per_s: float
    roofline_fraction: float
    bound: str  # "memory" or "compute"


def roofline(
    machine: Machine,
    *,
    weights: int,
    element_size: int,
    batch: int,
    tokens_per_forward: float,
    verified: float,
    tokens_per_s: float,
) -> Roofline:
    """The limit of a row whose forwards read ``weights`` bytes (``element_size`` bytes a
    weight), serve ``batch`` requests that each gain ``tokens_per_forward`` tokens and verify
    ``verified`` tokens each, measured at ``tokens_per_s``."""
    if weights < 1 or element_size < 1 or batch < 1 or tokens_per_forward <= 0 or verified <= 0:
        raise InvalidConfig(
            f"roofline needs weights={weights}, element_size={element_size}, batch={batch}, "
            f"tokens_per_forward={tokens_per_forward} and verified={verified} all > 0"
        )
    per_token = weights / (batch * tokens_per_forward)
    memory = machine.memory_bandwidth_gbs * 1e9 / per_token
    flops_per_token = 2 * (weights / element_size) * verified / tokens_per_forward
    compute = machine.matmul_gflops * 1e9 / flops_per_token
    limit = min(memory, compute)
    return Roofline(
        weight_bytes_per_token=per_token,
        roofline_tokens_per_s=limit,
        roofline_fraction=tokens_per_s / limit if limit > 0 else 0.0,
        bound="memory" if memory <= compute else "compute",
    )


@dataclass(frozen=True, slots=True)
class TargetWeights:
    """What a target's forward reads: ``weight_bytes`` (:func:`weight_bytes`) and the bytes of
    one weight, ``element_size``."""

    weight_bytes: int
    element_size: int

    @classmethod
    def of(cls, target: Any) -> TargetWeights:
        """``target``'s weights (its widest parameter dtype; float32's 4 bytes if it has none)."""
        sizes = {p.element_size() for p in target.parameters()}
        return cls(weight_bytes(target), max(sizes, default=4))


def with_roofline(
    row: BenchRow, machine: Machine, weights: TargetWeights, requests: int
) -> BenchRow:
    """``row`` with its roofline fields for the target's ``weights`` on ``machine``, each
    forward serving ``min(batch_size, requests)`` requests (``requests`` per cell): tokens per
    forward and tokens verified per forward mix ``tau`` and ``verified_per_step`` with the
    share of plain steps (τ for transformers' prompt lookup, whose share is unknown)."""
    plain = row.plain_step_share or 0.0
    verified = plain + (1 - plain) * (row.verified_per_step or max(row.draft_tokens, 1))
    batch = max(1, min(row.batch_size, requests))
    limit = roofline(
        machine,
        weights=weights.weight_bytes,
        element_size=weights.element_size,
        batch=batch,
        tokens_per_forward=row.gained_per_step,
        verified=verified,
        tokens_per_s=row.tokens_per_s,
    )
    return replace(
        row,
        weight_bytes_per_token=limit.weight_bytes_per_token,
        roofline_tokens_per_s=limit.roofline_tokens_per_s,
        roofline_fraction=limit.roofline_fraction,
        decode_roofline_fraction=_decode_fraction(row, batch, limit.roofline_tokens_per_s),
        roofline_bound=limit.bound,
    )


def _decode_fraction(row: BenchRow, batch: int, limit: float) -> float | None:
    """The decode steps' share of ``limit``: ``batch`` requests a token per median TPOT each
    (``None`` where no request had two tokens)."""
    tpot = row.tpot_ms.get("median")
    if tpot is None or tpot <= 0 or limit <= 0:
        return None
    return batch * 1000.0 / tpot / limit
