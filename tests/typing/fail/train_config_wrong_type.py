# expect: arg-type Argument "draft_vocab" to "HeadConfig" has incompatible type "str"; expected "int"
"""A draft vocabulary given as text is refused by mypy, before any training runs."""

from specstrat.train import HeadConfig

CONFIG = HeadConfig(draft_vocab="8k")
