"""Optional Triton: imported when installed, absent otherwise, and the per-call backend choice.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so it must be set before this
module is first imported for the kernel bodies to run on the CPU (the tests do that in
``conftest.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

from specstrat.errors import InvalidConfig, KernelError

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is not installed
    triton = None
    tl = None

__all__ = ["HAS_TRITON", "INTERPRETED", "Backend", "cdiv", "jit", "launch", "resolve_backend", "tl"]

#: Whether ``import triton`` worked in this process.
HAS_TRITON: bool = triton is not None
#: Whether kernel bodies run in Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import).
INTERPRETED: bool = HAS_TRITON and os.environ.get("TRITON_INTERPRET", "0") == "1"

Backend = Literal["auto", "triton", "torch"]
_BACKENDS = ("auto", "triton", "torch")

F = TypeVar("F", bound=Callable[..., Any])


def jit(fn: F) -> F:
    """``triton.jit`` when Triton is installed; the plain function (never launched) otherwise."""
    return triton.jit(fn) if triton is not None else fn


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def resolve_backend(backend: str, *tensors: torch.Tensor) -> Literal["triton", "torch"]:
    """Pick the path for one call: Triton for CUDA tensors when it imports, the twin otherwise.

    ``backend="triton"`` forces the kernel (on CUDA tensors, or on CPU tensors when
    :data:`INTERPRETED`); ``backend="torch"`` forces the torch twin.
    """
    if backend not in _BACKENDS:
        raise InvalidConfig(f"backend={backend!r} is not one of {_BACKENDS}")
    if backend == "torch":
        return "torch"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    if backend == "auto":
        return "triton" if HAS_TRITON and on_cuda else "torch"
    if not HAS_TRITON:
        raise KernelError(
            "backend='triton' but triton is not importable; install triton or pass backend='torch'"
        )
    if not on_cuda and not INTERPRETED:
        raise KernelError(
            "backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is "
            "imported to run kernel bodies on the CPU; or pass backend='torch'"
        )
    return "triton"


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **constexprs: Any) -> None:
    """The one place kernels are launched: wraps any Triton/CUDA failure in ``KernelError``."""
    try:
        kernel[grid](*args, **constexprs)
    except Exception as exc:
        name = getattr(kernel, "__name__", None) or getattr(
            getattr(kernel, "fn", None), "__name__", "kernel"
        )
        raise KernelError(f"{name} launch with grid={grid} failed: {exc}") from exc
