"""Tree policies: the draft tree an algorithm verifies (``SpecAlgorithm.tree``).

:class:`ChainTree` (the default, defined with the core types in :mod:`specstrat.drafting`) drafts a
chain of ``T - 1`` nodes. :class:`TopkTree` is EAGLE-2's dynamic tree: ``topk`` children per kept
node for ``num_steps`` steps, then the ``T - 1`` best nodes by cumulative log-probability (SGLang's
``speculative_eagle_topk`` / ``speculative_num_steps`` / ``speculative_num_draft_tokens``). ``T``
(``tokens_per_req``) is the tokens per request the target's TARGET_VERIFY forward verifies, root
included.
"""

from __future__ import annotations

from dataclasses import dataclass

from specstrat._ints import is_int
from specstrat.drafting import ChainTree as ChainTree
from specstrat.drafting import TreeShape, checked_tokens_per_req
from specstrat.errors import InvalidConfig

__all__ = ["ChainTree", "TopkTree"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopkTree:
    """EAGLE-2's top-k tree: ``topk`` children per kept node, ``num_steps`` deep.

    The budget comes from the engine (``T``); :meth:`tree_shape` refuses one the tree cannot
    fill (``tokens_per_req - 1 > topk + (num_steps - 1) * topk**2``). ``topk=1`` is a chain of
    ``num_steps`` nodes cut to the budget.
    """

    topk: int
    num_steps: int

    def __post_init__(self) -> None:
        for name in ("topk", "num_steps"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise InvalidConfig(f"TopkTree.{name}={value!r} must be an int >= 1")

    def tree_shape(self, tokens_per_req: int) -> TreeShape:
        """The shape for ``tokens_per_req`` (T) verified tokens per request."""
        t = checked_tokens_per_req("TopkTree.tree_shape", tokens_per_req)
        return TreeShape(topk=self.topk, num_steps=self.num_steps, tokens_per_req=t)
