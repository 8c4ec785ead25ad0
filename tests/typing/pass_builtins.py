"""mypy --strict accepts every built-in strategy as its Protocol and every built-in algorithm."""

from typing import Any

import torch

from specstrat import (
    BUILTINS,
    DFLASH,
    DSPARK,
    EAGLE,
    EAGLE3,
    NGRAM,
    NONE,
    STANDALONE,
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DisaggDraftBuilder,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    FixedWidthVerifyPolicy,
    FutureMap,
    FutureMapFactory,
    NoDraftStateDisaggDraftBuilder,
    RingFutureMapFactory,
    SlotFutureMapFactory,
    SpecAlgorithm,
    TargetVerifyPolicy,
)
from specstrat.strategies import RingFutureMap, SlotFutureMap

fixed: TargetVerifyPolicy = FixedWidthVerifyPolicy(
    allow_on_draft_worker=True, draft_worker_offset=-1
)
slots: FutureMapFactory = SlotFutureMapFactory()
ring: FutureMapFactory = RingFutureMapFactory()
slot_map: FutureMap = SlotFutureMap(4, torch.device("cpu"))
ring_map: FutureMap = RingFutureMap(8, 5, torch.device("cpu"))
eagle_builder: DisaggDraftBuilder[EagleDraftInput] = EagleDisaggDraftBuilder()
dspark_builder: DisaggDraftBuilder[DsparkDraftInput] = DsparkDisaggDraftBuilder()
dflash_builder: DisaggDraftBuilder[DflashDraftInput] = DflashDisaggDraftBuilder()
no_state: DisaggDraftBuilder[None] = NoDraftStateDisaggDraftBuilder()
# Covariance: a builder of a specific draft input is a builder of `object`.
widened: DisaggDraftBuilder[object] = EagleDisaggDraftBuilder()

none: SpecAlgorithm[None] = NONE
eagle: SpecAlgorithm[EagleDraftInput] = EAGLE
eagle3: SpecAlgorithm[EagleDraftInput] = EAGLE3
standalone: SpecAlgorithm[None] = STANDALONE
ngram: SpecAlgorithm[None] = NGRAM
dflash: SpecAlgorithm[DflashDraftInput] = DFLASH
dspark: SpecAlgorithm[DsparkDraftInput] = DSPARK
every: tuple[SpecAlgorithm[Any], ...] = BUILTINS
tokens: int = EAGLE.get_num_tokens_per_req_for_target_verify(4, False)
alias: int = EAGLE.get_num_tokens_per_bs_for_target_verify(4)
