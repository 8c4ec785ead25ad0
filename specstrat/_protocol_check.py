"""Whether an object satisfies a hook's Protocol: every member, the Protocol's own and those it
inherits, exists; methods take the Protocol's positional arguments; properties can be read.

``typing.runtime_checkable``'s ``isinstance`` checks names only, and only the members the
Protocol class itself defines; :class:`~specstrat.protocols.Drafter` defines none (it inherits
them all), so the walk below goes over the Protocol's whole MRO.
"""

from __future__ import annotations

import inspect
from typing import Any

from specstrat.errors import InvalidStrategy

__all__ = ["check_strategy", "protocol_members", "read_member"]


def protocol_members(protocol: type) -> dict[str, inspect.Signature | None]:
    """Every public member of ``protocol`` and of the Protocols it inherits: methods with their
    signatures (``self`` dropped), properties as ``None``."""
    members: dict[str, inspect.Signature | None] = {}
    for klass in reversed(protocol.__mro__):
        if not getattr(klass, "_is_protocol", False):  # object, Generic, plain bases
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                members[name] = None
            elif inspect.isfunction(member):
                sig = inspect.signature(member)
                members[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return members


def read_member(hook: str, protocol: type, strategy: object, name: str) -> Any:
    """``strategy.name``, or ``None`` when it has no such member; a member that raises while
    read is an InvalidStrategy naming the hook and the member, with the original chained."""
    try:
        return getattr(strategy, name)
    except Exception as exc:
        if isinstance(exc, AttributeError) and not hasattr(type(strategy), name):
            return None
        raise InvalidStrategy(
            f"{hook}={type(strategy).__name__}.{name} raised {type(exc).__name__}: {exc}; "
            f"{protocol.__name__}.{name} must be readable (a constant property)"
        ) from exc


def check_strategy(hook: str, protocol: type, strategy: object) -> None:
    """Refuse ``strategy`` unless every member of ``protocol`` (inherited ones included)
    exists, every method takes the Protocol's positional arguments and every property reads.

    The scheduler passes hook arguments positionally, so a method must accept exactly as many
    positional arguments as the Protocol's method declares (extra parameters need defaults).
    """
    members = protocol_members(protocol)
    if strategy is None:
        raise InvalidStrategy(
            f"{hook} is None; pass an object that satisfies {protocol.__name__} (members: "
            f"{', '.join(members)})"
        )
    kind = type(strategy).__name__
    for name, expected in members.items():
        found = read_member(hook, protocol, strategy, name)
        if expected is None:  # a property: read above; what it holds is the caller's to check
            if found is None and not hasattr(type(strategy), name):
                raise InvalidStrategy(
                    f"{hook}={kind} has no property {name}; {protocol.__name__} needs it"
                )
            continue
        if found is None:
            raise InvalidStrategy(
                f"{hook}={kind} has no method {name}{expected}; "
                f"{protocol.__name__} needs it (found attributes: "
                f"{sorted(a for a in dir(strategy) if not a.startswith('_'))})"
            )
        if not callable(found):
            raise InvalidStrategy(
                f"{hook}={kind}.{name} is a {type(found).__name__}, not a method; "
                f"{protocol.__name__} needs {name}{expected}"
            )
        try:
            actual = inspect.signature(found)
        except (TypeError, ValueError):  # builtins without signatures: cannot check arity
            continue
        try:
            actual.bind(*([None] * len(expected.parameters)))
        except TypeError:
            raise InvalidStrategy(
                f"{hook}={kind}.{name}{actual} cannot take the "
                f"{len(expected.parameters)} positional arguments of "
                f"{protocol.__name__}.{name}{expected}"
            ) from None
