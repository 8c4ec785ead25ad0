"""mypy --strict accepts every built-in strategy as its Protocol and every built-in algorithm."""

from collections.abc import Iterator, Sequence
from dataclasses import replace
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
    AcceptanceRule,
    AttentionBackend,
    CausalLM,
    DisaggDraftBuilder,
    Drafter,
    DrafterFactory,
    DraftHead,
    DraftKV,
    FutureMap,
    FutureMapFactory,
    LoadedModels,
    ModelSet,
    ModelShape,
    RowLogitsLM,
    SpecAlgorithm,
    SpeculationPolicy,
    TargetVerifyPolicy,
    TreePolicy,
    TreeShape,
    WidthChooser,
)
from specstrat.hf import HFCausalLM
from specstrat.strategies import (
    BatchScheduleSpeculationPolicy,
    BlockDrafterFactory,
    ChainTree,
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DraftModelDrafter,
    DraftModelDrafterFactory,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    EagleHeadDrafter,
    EagleHeadDrafterFactory,
    EarlyExitDrafterFactory,
    EmaLadderSpeculationPolicy,
    FixedSpeculationPolicy,
    GoodputSpeculationPolicy,
    GreedyAcceptance,
    NgramDrafter,
    NgramDrafterFactory,
    NoDrafter,
    NoDrafterFactory,
    NoDraftStateDisaggDraftBuilder,
    OffsetVerifyPolicy,
    RingFutureMap,
    RingFutureMapFactory,
    SlotFutureMap,
    SlotFutureMapFactory,
    TopkTree,
)

fixed: TargetVerifyPolicy = OffsetVerifyPolicy(allow_on_draft_worker=True, draft_worker_offset=-1)
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

# Drafter factories (the `drafter` hook) and the acceptance rule (the `acceptance` hook).
eagle_drafters: DrafterFactory[EagleDraftInput] = EagleHeadDrafterFactory()
ngram_drafters: DrafterFactory[None] = NgramDrafterFactory()
draft_lm_drafters: DrafterFactory[None] = DraftModelDrafterFactory()
early_exit_drafters: DrafterFactory[None] = EarlyExitDrafterFactory(exit_layer=4)
no_drafters: DrafterFactory[None] = NoDrafterFactory()
# The block drafter admits any draft input: DFLASH's and DSPARK's builders both feed it.
block_drafters_for_dflash: DrafterFactory[DflashDraftInput] = BlockDrafterFactory()
block_drafters_for_dspark: DrafterFactory[DsparkDraftInput] = BlockDrafterFactory(
    confidence_threshold=0.3
)
dspark_drafter_field: DrafterFactory[DsparkDraftInput] = DSPARK.drafter
# The tree hook: a policy, and the shape it answers.
chain_policy: TreePolicy = ChainTree()
tree_policy: TreePolicy = TopkTree(topk=2, num_steps=3)
tree: TreeShape = tree_policy.tree_shape(4)
eagle_tree: SpecAlgorithm[EagleDraftInput] = SpecAlgorithm(
    name="EAGLE_TREE",
    capabilities=EAGLE.capabilities,
    target_verify=EAGLE.target_verify,
    future_map=EAGLE.future_map,
    disagg=EAGLE.disagg,
    drafter=EAGLE.drafter,
    acceptance=EAGLE.acceptance,
    tree=tree_policy,
)
# Contravariance: NoDrafterFactory's drafter admits any draft input, so it fits any algorithm.
no_drafters_for_eagle: DrafterFactory[EagleDraftInput] = NoDrafterFactory()
no_drafters_for_dspark: DrafterFactory[DsparkDraftInput] = NoDrafterFactory()
greedy: AcceptanceRule = GreedyAcceptance()
eagle_drafter_field: DrafterFactory[EagleDraftInput] = EAGLE.drafter
eagle_acceptance: AcceptanceRule = EAGLE.acceptance
lossless: bool = EAGLE.lossless


class ToyLM:
    """A one-layer causal LM over 4 tokens that never attends (for typing only)."""

    shape = ModelShape(vocab_size=4, hidden_size=2, layers=1, heads=1, head_dim=2, max_positions=8)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = tokens.shape[0]
        return torch.zeros(n, 4), torch.zeros(n, 2)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        return iter(())


def toy_head(hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE-style head that always predicts token 0 and keeps the hidden state."""
    return torch.zeros(tokens.shape[0], 4), hidden


def no_history(slot: int) -> Sequence[int]:
    """The target's committed tokens of a slot: none."""
    return ()


def draft_lm_drafter(runner: DraftKV) -> Drafter[None]:
    """A draft-LM drafter needs a KV runner, which only the engine makes."""
    return DraftModelDrafter(runner, no_history)


def row_logits(model: HFCausalLM) -> RowLogitsLM:
    """A wrapped Hugging Face model leaves the LM head out of rows a prefill does not read."""
    return model


lm: CausalLM = ToyLM()
head: DraftHead = toy_head
models: LoadedModels = ModelSet(target=ToyLM(), draft=ToyLM(), head=toy_head)
no_drafter: Drafter[None] = NoDrafter()
no_drafter_for_eagle: Drafter[EagleDraftInput] = NoDrafter()
ngram_drafter: Drafter[None] = NgramDrafter(2, 4, no_history)
eagle_drafter: Drafter[EagleDraftInput] = EagleHeadDrafter(toy_head, topk=2, vocab_size=16)

# Speculation policies and their choosers satisfy their Protocols (and compose, trees too).
fixed_policy: SpeculationPolicy = FixedSpeculationPolicy()
ema_policy: SpeculationPolicy = EmaLadderSpeculationPolicy()
schedule_policy: SpeculationPolicy = BatchScheduleSpeculationPolicy()
goodput_policy: SpeculationPolicy = GoodputSpeculationPolicy()
ema_chooser: WidthChooser = ema_policy.create_chooser((1, 2, 4), 4)
adaptive_tree: SpecAlgorithm[EagleDraftInput] = replace(
    EAGLE, name="ADAPTIVE_TREE", tree=TopkTree(topk=2, num_steps=3), speculation=ema_policy
)
