"""Which hook last wrote each relay field of each request, so a bad value names its writer.

The relay (the algorithm's FutureMap) carries what the drafter's ``admit``/``commit`` and the
disagg builder returned, next to what the engine writes itself (each step's bonus tokens and
the slot table's sequence lengths). A value that comes back wrong at ``resolve``, or that a
relay refuses at ``stash``, is blamed on the hook that wrote it; only a field the engine wrote
itself is blamed on the relay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specstrat.relay import RelayField

__all__ = ["RelayWriters"]


class RelayWriters:
    """Per relay field, the hook that last wrote it at each running slot (absent: the engine);
    a field only the engine writes costs a dictionary check per step."""

    def __init__(self) -> None:
        self._by_field: dict[RelayField, dict[int, str]] = {}

    def wrote(self, hook: str | None, slots: Sequence[int], fields: Iterable[RelayField]) -> None:
        """``hook`` (``None``: the engine) wrote ``fields`` at ``slots``."""
        for name in fields:
            writers = self._by_field.get(name)
            if hook is not None:
                if writers is None:
                    writers = self._by_field[name] = {}
                writers.update(dict.fromkeys(slots, hook))
            elif writers:
                for slot in slots:
                    writers.pop(slot, None)

    def writer(self, slots: Iterable[int], field: RelayField) -> str | None:
        """The hook that last wrote ``field`` at the first of ``slots`` a hook wrote it at
        (``None``: the engine wrote it at all of them)."""
        writers = self._by_field.get(field) or {}
        for slot in slots:
            hook = writers.get(slot)
            if hook is not None:
                return hook
        return None

    def forget(self, slots: Iterable[int]) -> None:
        """Finished requests: nothing of theirs is in the relay any more."""
        gone = list(slots)
        for writers in self._by_field.values():
            for slot in gone:
                writers.pop(slot, None)
