"""The Hugging Face demo sizes its default context with the engine's own KV reservation."""

from dataclasses import replace

import specstrat
from specstrat.hf.hf_demo import default_context_len
from specstrat.runtime import Request, kv_reservation
from specstrat.strategies import TopkTree


def test_the_default_context_is_the_smallest_that_admits_every_request() -> None:
    """default_context_len is the longest prompt + max_new_tokens + kv_reservation's margin."""
    requests = [Request("a", (1, 2, 3), 10), Request("b", (1,) * 7, 4)]
    tree = replace(specstrat.EAGLE, name="EAGLE_TREE", tree=TopkTree(topk=2, num_steps=3))
    assert default_context_len(requests, tree, 6) == 3 + 10 + 2 * 6 + 2 * (3 - 1)
    assert default_context_len(requests, "NONE", 4) == 13 + kv_reservation("NONE").margin == 15
