# expect: arg-type Argument "topk" to "TopkTree" has incompatible type "str"; expected "int"
"""A 0.3.0 name kept as a deprecated alias keeps its static type: a wrong argument is caught."""

from specstrat import TopkTree  # the 0.3.0 top-level path (now specstrat.strategies)

TREE = TopkTree(topk="2", num_steps=3)
