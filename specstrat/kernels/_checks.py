"""Launcher-side validation shared by the kernels: every message names the value and the fix."""

from __future__ import annotations

import torch

from specstrat._ints import is_int
from specstrat.errors import InvalidConfig

_INDEX_DTYPES = (torch.int32, torch.int64)


def host_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else ``InvalidConfig``."""
    if not is_int(value):
        raise InvalidConfig(f"{name}={value!r} must be an int >= {minimum}")
    if value < minimum:
        raise InvalidConfig(f"{name}={value} must be >= {minimum}")
    return value


def index_tensor(
    name: str,
    tensor: object,
    *,
    ndim: int,
    device: torch.device | None = None,
    rows: int | None = None,
) -> torch.Tensor:
    """A contiguous int32/int64 tensor of rank ``ndim`` (on ``device``, with ``rows`` rows)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidConfig(f"{name}={type(tensor).__name__} must be a torch.Tensor")
    if tensor.dim() != ndim:
        raise InvalidConfig(f"{name}.shape={tuple(tensor.shape)} must have rank {ndim}")
    if tensor.dtype not in _INDEX_DTYPES:
        raise InvalidConfig(f"{name}.dtype={tensor.dtype} must be torch.int32 or torch.int64")
    if not tensor.is_contiguous():
        raise InvalidConfig(f"{name} is not contiguous; pass {name}.contiguous()")
    if device is not None and tensor.device != device:
        raise InvalidConfig(
            f"{name}.device={tensor.device} differs from {device}; put every input on one device"
        )
    if rows is not None and tensor.shape[0] != rows:
        raise InvalidConfig(f"{name} has {tensor.shape[0]} rows; expected {rows} (one per request)")
    return tensor


def static_buffer(
    name: str, tensor: object, *, shape: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    """A caller-owned int32 output buffer of exactly ``shape`` on ``device``."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidConfig(f"{name}={type(tensor).__name__} must be a torch.Tensor")
    if tensor.dtype != torch.int32 or tuple(tensor.shape) != shape or not tensor.is_contiguous():
        raise InvalidConfig(
            f"{name} is {tensor.dtype} {tuple(tensor.shape)}; it must be a contiguous "
            f"torch.int32 buffer of shape {shape}"
        )
    if tensor.device != device:
        raise InvalidConfig(f"{name}.device={tensor.device} differs from the inputs' {device}")
    return tensor


def reads_values(validate: bool, *tensors: torch.Tensor) -> bool:
    """Whether the value checks may read ``tensors``: always on the CPU, elsewhere on opt-in.

    On the CPU the checks read the tensors directly at no sync cost. On CUDA each read would be a
    host sync, so there they run only with ``validate=True`` (meta tensors have no values at all).
    """
    if not isinstance(validate, bool):
        raise InvalidConfig(f"validate={validate!r} must be True or False")
    return validate or all(t.device.type == "cpu" for t in tensors)
