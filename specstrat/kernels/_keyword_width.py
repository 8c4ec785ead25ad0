"""The uniform builders take their width by keyword; the 0.3 positional form still works.

``build_verify_metadata(seq_lens, num_tokens)`` took a *total* token count where
``build_verify_metadata_into(buffers, seq_lens, tokens_per_req)`` took a *per-request* width in
the same position, so one was easily passed for the other. Both widths are keyword-only now;
the positional form keeps working with a :class:`DeprecationWarning` through 0.4.x.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["width_by_keyword"]

_F = TypeVar("_F", bound=Callable[..., Any])


def width_by_keyword(name: str, positional: int) -> Callable[[_F], _F]:
    """Let a function whose ``name`` is keyword-only, after ``positional`` positional
    parameters, still take ``name`` as one more positional argument, with a warning."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) == positional + 1 and name not in kwargs:
                warnings.warn(
                    f"{fn.__name__}: passing {name} positionally is deprecated and stops "
                    f"working in 0.5; pass {name}={args[-1]!r} by keyword",
                    DeprecationWarning,
                    stacklevel=2,
                )
                *args_list, value = args
                return fn(*args_list, **kwargs, **{name: value})
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # same signature as fn, by functools.wraps

    return decorate
