"""The built-in algorithms, composed from built-in strategies (DESIGN.md §3's table).

| name       | verify on draft worker | T (target, draft worker) | disagg builder | topk | hidden | draft KV |
|------------|------------------------|--------------------------|----------------|------|--------|----------|
| NONE       | no                     | -                        | none           | no   | no     | no       |
| EAGLE      | no                     | D, D                     | EAGLE          | yes  | yes    | yes      |
| EAGLE3     | no                     | D, D                     | EAGLE          | yes  | yes    | yes      |
| STANDALONE | no                     | D, D                     | none           | yes  | no     | yes      |
| NGRAM      | no                     | D, D                     | none           | no   | no     | no       |
| DFLASH     | yes                    | D, D                     | DFLASH         | no   | no     | yes      |
| DSPARK     | yes                    | D, D-1                   | DSPARK         | no   | no     | yes      |

NGRAM is the one built-in with ``supports_ragged_verify``: prompt lookup may find fewer than D
tokens for a request.
"""

from __future__ import annotations

from typing import Any, Final

from specstrat.algorithm import Capabilities, SpecAlgorithm
from specstrat.strategies.disagg import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    NoDraftStateDisaggDraftBuilder,
)
from specstrat.strategies.future_map import SlotFutureMapFactory
from specstrat.strategies.verify import FixedWidthVerifyPolicy

__all__ = [
    "BUILTINS",
    "DFLASH",
    "DSPARK",
    "EAGLE",
    "EAGLE3",
    "NGRAM",
    "NONE",
    "STANDALONE",
]

_TARGET_ONLY = FixedWidthVerifyPolicy()
_SLOTS = SlotFutureMapFactory()
_NO_STATE = NoDraftStateDisaggDraftBuilder()
_EAGLE_CAPS = Capabilities(has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True)

NONE: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="NONE",
    capabilities=Capabilities(speculative=False),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
)
EAGLE: Final[SpecAlgorithm[EagleDraftInput]] = SpecAlgorithm(
    name="EAGLE",
    capabilities=_EAGLE_CAPS,
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=EagleDisaggDraftBuilder(),
)
EAGLE3: Final[SpecAlgorithm[EagleDraftInput]] = SpecAlgorithm(
    name="EAGLE3",
    capabilities=_EAGLE_CAPS,
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=EagleDisaggDraftBuilder(),
)
STANDALONE: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="STANDALONE",
    capabilities=Capabilities(has_draft_kv=True, need_topk=True),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
)
NGRAM: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="NGRAM",
    capabilities=Capabilities(supports_ragged_verify=True),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
)
DFLASH: Final[SpecAlgorithm[DflashDraftInput]] = SpecAlgorithm(
    name="DFLASH",
    capabilities=Capabilities(has_draft_kv=True),
    target_verify=FixedWidthVerifyPolicy(allow_on_draft_worker=True),
    future_map=_SLOTS,
    disagg=DflashDisaggDraftBuilder(),
)
DSPARK: Final[SpecAlgorithm[DsparkDraftInput]] = SpecAlgorithm(
    name="DSPARK",
    capabilities=Capabilities(has_draft_kv=True),
    target_verify=FixedWidthVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=-1),
    future_map=_SLOTS,
    disagg=DsparkDisaggDraftBuilder(),
)

#: Every built-in, in the table's order.
BUILTINS: Final[tuple[SpecAlgorithm[Any], ...]] = (
    NONE,
    EAGLE,
    EAGLE3,
    STANDALONE,
    NGRAM,
    DFLASH,
    DSPARK,
)
