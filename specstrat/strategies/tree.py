"""Tree policies: the draft tree an algorithm verifies (``SpecAlgorithm.tree``).

:class:`ChainTree` (the default) drafts a chain of ``num_draft_tokens - 1`` nodes, as every
algorithm did before trees. :class:`TopkTree` is EAGLE-2's dynamic tree: ``topk`` children per
kept node for ``num_steps`` steps, then the ``num_draft_tokens - 1`` best nodes by cumulative
log-probability (SGLang's ``speculative_eagle_topk`` / ``speculative_num_steps`` /
``speculative_num_draft_tokens``). The verify budget ``num_draft_tokens`` is the target's
TARGET_VERIFY width ``T``, root included.
"""

from __future__ import annotations

from dataclasses import dataclass

from specstrat.drafting import TreeShape
from specstrat.errors import InvalidConfig

__all__ = ["ChainTree", "TopkTree"]


@dataclass(frozen=True, slots=True)
class ChainTree:
    """A chain: topk 1, ``num_draft_tokens - 1`` steps (every drafter can draft it)."""

    def tree_shape(self, num_draft_tokens: int) -> TreeShape:
        """``TreeShape(topk=1, num_steps=num_draft_tokens - 1, ...)``."""
        return TreeShape.chain(num_draft_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopkTree:
    """EAGLE-2's top-k tree: ``topk`` children per kept node, ``num_steps`` deep.

    The budget comes from the engine (``T``); :meth:`tree_shape` refuses one the tree cannot
    fill (``num_draft_tokens - 1 > topk + (num_steps - 1) * topk**2``). ``topk=1`` is a chain of
    ``num_steps`` nodes cut to the budget.
    """

    topk: int
    num_steps: int

    def __post_init__(self) -> None:
        for name in ("topk", "num_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"TopkTree.{name}={value!r} must be an int >= 1")

    def tree_shape(self, num_draft_tokens: int) -> TreeShape:
        """The shape for a verify budget of ``num_draft_tokens`` tokens per request."""
        return TreeShape(
            topk=self.topk, num_steps=self.num_steps, num_draft_tokens=num_draft_tokens
        )
