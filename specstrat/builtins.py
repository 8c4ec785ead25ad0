"""The built-in algorithms, composed from built-in strategies.

| name       | on draft | T      | builder | topk | hidden | draft KV | ragged | drafter       |
|------------|----------|--------|---------|------|--------|----------|--------|---------------|
| NONE       | no       | -      | none    | no   | no     | no       | no     | none          |
| EAGLE      | no       | D, D   | EAGLE   | yes  | yes    | yes      | no     | EAGLE head    |
| EAGLE3     | no       | D, D   | EAGLE   | yes  | yes    | yes      | no     | EAGLE head    |
| STANDALONE | no       | D, D   | none    | yes  | no     | yes      | no     | draft LM      |
| NGRAM      | no       | D, D   | none    | no   | no     | no       | no     | prompt lookup |
| DFLASH     | yes      | D, D   | DFLASH  | no   | no     | yes      | no     | block         |
| DSPARK     | yes      | D, D-1 | DSPARK  | no   | no     | yes      | yes    | block, cut    |

"on draft": whether a draft worker may run TARGET_VERIFY; "T": the tokens per request the
target and a draft worker verify; "builder": the disagg draft builder.

DFLASH and DSPARK draft a block per step in one TARGET_VERIFY forward on the draft worker
(:class:`~specstrat.strategies.block.BlockDrafterFactory`, ``T_draft`` positions: D for DFLASH,
D - 1 for DSPARK, each giving the D - 1 drafts the target verifies); DSPARK cuts each block at
its first draft whose confidence is below ``DSPARK_CONFIDENCE`` and verifies what it kept
through ragged metadata ("block, cut").

Every built-in accepts by rejection sampling (``RejectionSamplingAcceptance``: lossless in
distribution, and exactly greedy decoding for requests with temperature 0).

The rows match SGLang 0.5.23's enum, ``supports_ragged_verify`` included: DSPARK is the one
built-in with it, NGRAM is not (prompt lookup with ragged verify is a composition:
docs/concepts/builtins.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from specstrat.algorithm import Capabilities, SpecAlgorithm
from specstrat.strategies.acceptance import RejectionSamplingAcceptance
from specstrat.strategies.block import BlockDrafterFactory
from specstrat.strategies.disagg import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    NoDraftStateDisaggDraftBuilder,
)
from specstrat.strategies.drafters import (
    DraftModelDrafterFactory,
    NgramDrafterFactory,
    NoDrafterFactory,
)
from specstrat.strategies.eagle_head import EagleHeadDrafterFactory
from specstrat.strategies.future_map import SlotFutureMapFactory
from specstrat.strategies.verify_policies import OffsetVerifyPolicy

__all__ = [
    "BUILTINS",
    "DFLASH",
    "DSPARK",
    "DSPARK_CONFIDENCE",
    "EAGLE",
    "EAGLE3",
    "NGRAM",
    "NONE",
    "STANDALONE",
]

_TARGET_ONLY = OffsetVerifyPolicy()
_SLOTS = SlotFutureMapFactory()
_NO_STATE = NoDraftStateDisaggDraftBuilder()
_EAGLE_CAPS = Capabilities(has_draft_kv=True, carries_draft_hidden_states=True, need_topk=True)
_SAMPLING = RejectionSamplingAcceptance()
_DRAFT_LM = DraftModelDrafterFactory()
#: DSPARK's confidence threshold: a block ends before its first draft the block head gives less
#: than this probability. On the demo workload (16 requests, D=4) it cuts the target's tokens
#: per request per verify from 4.00 to 2.28 for a τ of 1.69 instead of 1.79
#: (0.2: 2.96 and 1.77; 0.5: 1.66 and 1.49).
DSPARK_CONFIDENCE: Final = 0.3

NONE: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="NONE",
    capabilities=Capabilities(speculative=False),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
    drafter=NoDrafterFactory(),
    acceptance=_SAMPLING,
)
EAGLE: Final[SpecAlgorithm[EagleDraftInput]] = SpecAlgorithm(
    name="EAGLE",
    capabilities=_EAGLE_CAPS,
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=EagleDisaggDraftBuilder(),
    drafter=EagleHeadDrafterFactory(),
    acceptance=_SAMPLING,
)
#: EAGLE3 is EAGLE under SGLang's other name (the engine's hooks do not tell them apart).
EAGLE3: Final[SpecAlgorithm[EagleDraftInput]] = replace(EAGLE, name="EAGLE3")
STANDALONE: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="STANDALONE",
    capabilities=Capabilities(has_draft_kv=True, need_topk=True),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
    drafter=_DRAFT_LM,
    acceptance=_SAMPLING,
)
NGRAM: Final[SpecAlgorithm[None]] = SpecAlgorithm(
    name="NGRAM",
    capabilities=Capabilities(),
    target_verify=_TARGET_ONLY,
    future_map=_SLOTS,
    disagg=_NO_STATE,
    drafter=NgramDrafterFactory(),
    acceptance=_SAMPLING,
)
DFLASH: Final[SpecAlgorithm[DflashDraftInput]] = SpecAlgorithm(
    name="DFLASH",
    capabilities=Capabilities(has_draft_kv=True),
    target_verify=OffsetVerifyPolicy(allow_on_draft_worker=True),
    future_map=_SLOTS,
    disagg=DflashDisaggDraftBuilder(),
    drafter=BlockDrafterFactory(),
    acceptance=_SAMPLING,
)
DSPARK: Final[SpecAlgorithm[DsparkDraftInput]] = SpecAlgorithm(
    name="DSPARK",
    capabilities=Capabilities(has_draft_kv=True, supports_ragged_verify=True),
    target_verify=OffsetVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=-1),
    future_map=_SLOTS,
    disagg=DsparkDisaggDraftBuilder(),
    drafter=BlockDrafterFactory(confidence_threshold=DSPARK_CONFIDENCE),
    acceptance=_SAMPLING,
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
