"""Launcher-side checks of the TARGET_VERIFY metadata inputs; each message names the value and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specstrat.errors import InvalidConfig
from specstrat.kernels._checks import host_int, index_tensor
from specstrat.kernels._triton import cdiv

__all__ = ["Paging", "as_list", "check_paging", "mirror_max", "uniform_tokens"]


@dataclass(frozen=True, slots=True)
class Paging:
    """Validated page-table inputs: token table, the batch's rows of it, and the page size."""

    req_pool_indices: torch.Tensor
    req_to_token: torch.Tensor
    page_size: int

    @property
    def max_pages(self) -> int:
        return cdiv(self.req_to_token.shape[1], self.page_size)


def check_paging(
    req_pool_indices: torch.Tensor | None,
    req_to_token: torch.Tensor | None,
    page_size: int,
    seq_lens: torch.Tensor,
) -> Paging | None:
    page_size = host_int("page_size", page_size, minimum=1)
    if req_pool_indices is None and req_to_token is None:
        return None
    if req_pool_indices is None or req_to_token is None:
        missing = "req_pool_indices" if req_pool_indices is None else "req_to_token"
        raise InvalidConfig(f"{missing}=None; pass req_pool_indices and req_to_token together")
    bs, dev = seq_lens.shape[0], seq_lens.device
    rpi = index_tensor("req_pool_indices", req_pool_indices, ndim=1, device=dev, rows=bs)
    rtt = index_tensor("req_to_token", req_to_token, ndim=2, device=dev)
    if rtt.shape[1] == 0 or rtt.shape[0] == 0:
        raise InvalidConfig(f"req_to_token.shape={tuple(rtt.shape)} is empty; size it [pool, ctx]")
    if rpi.device.type == "cpu" and bs:
        lo, hi = int(rpi.min()), int(rpi.max())
        if lo < 0 or hi >= rtt.shape[0]:
            raise InvalidConfig(
                f"req_pool_indices range {lo}..{hi} is outside req_to_token's "
                f"{rtt.shape[0]} rows; every index must lie in 0..{rtt.shape[0] - 1}"
            )
    return Paging(rpi, rtt, page_size)


def mirror_max(name: str, mirror: Sequence[int] | torch.Tensor, bs: int) -> int:
    """Max of a host mirror (0 for an empty batch); refuses device tensors and wrong lengths."""
    if isinstance(mirror, torch.Tensor):
        if mirror.device.type != "cpu":
            raise InvalidConfig(
                f"{name}.device={mirror.device}; the mirror must live on the CPU (reading a "
                "device tensor here would be a host sync)"
            )
        values = [int(v) for v in mirror.reshape(-1).tolist()]
    else:
        values = [int(v) for v in mirror]
    if len(values) != bs:
        raise InvalidConfig(f"{name} has {len(values)} entries; expected bs={bs}")
    return max(values, default=0)


def uniform_tokens(num_tokens: int, bs: int) -> int:
    num_tokens = host_int("num_tokens", num_tokens, minimum=0)
    if bs == 0:
        if num_tokens != 0:
            raise InvalidConfig(f"num_tokens={num_tokens} with bs=0; an empty batch has 0 tokens")
        return 0
    if num_tokens % bs != 0:
        raise InvalidConfig(
            f"num_tokens={num_tokens} is not a multiple of bs={bs}; "
            "pass bs * tokens_per_req tokens (use the ragged form for per-request widths)"
        )
    if num_tokens == 0:
        raise InvalidConfig(
            f"num_tokens=0 with bs={bs}; TARGET_VERIFY needs >= 1 token per request"
        )
    return num_tokens // bs


def as_list(mirror: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(mirror, torch.Tensor):
        return [int(v) for v in mirror.reshape(-1).tolist()]
    return [int(v) for v in mirror]
