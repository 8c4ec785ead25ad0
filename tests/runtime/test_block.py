"""Block drafting (DFLASH, DSPARK): one draft-worker TARGET_VERIFY forward per step, the mapping
from its positions to the drafts the target verifies, DSPARK's confidence cut, and refusals."""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specstrat
from specstrat import (
    DFLASH,
    DSPARK,
    Drafter,
    DrafterContext,
    DrafterFactory,
    DrafterNeeds,
    InvalidConfig,
    InvalidStrategy,
    LoadedModels,
    ModelSet,
    SpecAlgorithm,
)
from specstrat.drafting import DraftAdmission, DraftStep
from specstrat.relay import RelayPayload
from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, run_disaggregated, workload
from specstrat.strategies import (
    BlockDrafter,
    BlockDrafterFactory,
    OffsetVerifyPolicy,
    block_layout,
)
from specstrat.testing import check_lossless_in_distribution

CONFIG = EngineConfig(context_len=512, max_running_requests=8)
#: Four requests (the last stops at its first newline), 40 tokens at most each.
REQUESTS = [replace(r, max_new_tokens=40) for r in workload(4, seed=3)]


def run(algo: SpecAlgorithm[Any], models: Any, **kw: Any) -> tuple[dict[str, list[int]], Engine]:
    """Outputs of one engine run over REQUESTS, and the engine."""
    engine = Engine(algo, models, replace(CONFIG, **kw))
    return engine.run(REQUESTS), engine


@pytest.fixture(scope="module")
def target_only(models: EmbeddedModels) -> dict[str, list[int]]:
    """Target-only greedy output of REQUESTS (the same for every D)."""
    return run(specstrat.NONE, models)[0]


@pytest.mark.parametrize("d", [2, 4])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", [DFLASH, DSPARK], ids=lambda a: a.name)
def test_block_drafting_is_lossless_and_verifies_on_the_draft_worker(
    algo: SpecAlgorithm[Any],
    overlap: bool,
    d: int,
    models: EmbeddedModels,
    target_only: dict[str, list[int]],
) -> None:
    """Greedy output equals target-only; the draft worker ran one TARGET_VERIFY of T_draft
    tokens (D for DFLASH, D - 1 for DSPARK) per step; every slot and KV index is returned."""
    outputs, engine = run(algo, models, overlap=overlap, num_draft_tokens=d)
    assert outputs == target_only
    stats = engine.stats
    assert stats.draft_worker_tokens_per_req == (d if algo is DFLASH else d - 1)
    assert 0 < stats.draft_worker_verify_forwards <= stats.decode_steps
    assert stats.acceptance_length > 1.0
    assert (engine.free_slots, engine.free_kv_tokens) == (16, 16 * 512)


def test_dspark_ragged_verify_runs_fewer_target_tokens(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """DSPARK's confidence cut verifies fewer target tokens than its uniform twin (no cut),
    with the same output."""
    uncut = replace(DSPARK, name="DSPARK_UNCUT", drafter=BlockDrafterFactory())
    cut_out, cut = run(DSPARK, models)
    full_out, full = run(uncut, models)
    assert cut_out == full_out == target_only
    assert full.stats.verify_forward_tokens == 4 * full.stats.verified_requests
    assert cut.stats.verify_forward_tokens < 4 * cut.stats.verified_requests


def test_at_one_draft_token_the_block_drafter_runs_no_forward(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """D = 1: the target verifies the anchor alone, so no block is drafted (T_draft = 1)."""
    outputs, engine = run(DSPARK, models, num_draft_tokens=1)
    assert outputs == target_only
    assert engine.stats.draft_worker_verify_forwards == 0
    assert engine.stats.draft_worker_tokens_per_req == 1


def test_disaggregated_block_drafting_is_lossless(
    models: EmbeddedModels, target_only: dict[str, list[int]]
) -> None:
    """DSPARK prefilled in another process and decoded here (overlap) equals target-only."""
    config = replace(CONFIG, overlap=True)
    result = run_disaggregated(DSPARK, REQUESTS, config, models=models, batch_size=2, timeout=120)
    assert result.outputs == target_only
    assert result.stats.draft_worker_verify_forwards > 0


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3, 8])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algo", [DFLASH, DSPARK], ids=lambda a: a.name)
def test_disaggregated_block_matrix(
    algo: SpecAlgorithm[Any], overlap: bool, d: int, models: EmbeddedModels
) -> None:
    """Every block algorithm x mode x D disaggregated equals single-process target-only."""
    requests = workload(6, seed=11)
    config = replace(CONFIG, overlap=overlap, num_draft_tokens=d)
    want = Engine(specstrat.NONE, models, config).run(requests)
    result = run_disaggregated(algo, requests, config, models=models, batch_size=4, timeout=120)
    assert result.outputs == want


@pytest.mark.slow
def test_sampled_block_drafting_is_lossless_in_distribution(models: EmbeddedModels) -> None:
    """DSPARK (cut blocks, sampled drafts with q) passes the chi-square check at temperature 1."""
    report = check_lossless_in_distribution(
        DSPARK, temperature=1.0, num_samples=2000, models=models
    )
    assert report.p_value >= report.significance


# -- the mapping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("d", range(2, 9))
@pytest.mark.parametrize("algo", [DFLASH, DSPARK], ids=lambda a: a.name)
def test_layout_maps_every_position_to_one_verified_draft(algo: SpecAlgorithm[Any], d: int) -> None:
    """For D = 2..8 the block has T_draft rows and yields exactly the T_target - 1 drafts the
    target verifies: DFLASH's block starts with the anchor, DSPARK's is placeholders only."""
    t_draft = algo.get_num_tokens_per_req_for_target_verify(d, True)
    t_target = algo.get_num_tokens_per_req_for_target_verify(d, False)
    layout = block_layout(t_draft, t_target)
    assert layout.rows == t_draft
    assert layout.drafts == t_target - 1
    assert layout.anchor_in_block is (algo is DFLASH)


@pytest.mark.parametrize(
    ("t_draft", "t_target", "message"),
    [
        (5, 4, r"T_draft=5 .* T_target=4 would invent 1 draft\(s\) the target never verifies"),
        (2, 4, r"T_draft=2 .* T_target=4 gives 2 drafts for the 3 the target verifies"),
        (0, 4, r"T_draft=0 must be an int >= 1"),
        (3, True, r"T_target=True must be an int >= 1"),
    ],
)
def test_mismatched_layouts_are_refused(t_draft: int, t_target: int, message: str) -> None:
    """A policy pairing that would invent or leave out drafts is refused, never padded."""
    with pytest.raises(InvalidConfig, match=message):
        block_layout(t_draft, t_target)


class RecordingRunner:
    """A BlockKV double: tokens per draft row, recording catch-ups and blocks; its logits put all
    mass on each row's own input id, so a draft reveals which row it came from."""

    def __init__(self, tokens_per_req: int, vocab: int = 2048) -> None:
        self.tokens_per_req, self.vocab = tokens_per_req, vocab
        self.tokens: dict[int, list[int]] = {}
        self.held: dict[int, int] = {}  # the target's slot -> its draft row
        self.blocks: list[list[list[int]]] = []

    def alloc(self, count: int) -> list[int]:
        fresh = list(range(len(self.tokens), len(self.tokens) + count))
        self.tokens.update({s: [] for s in fresh})
        return fresh

    def free(self, rows: Sequence[int]) -> None:
        for row in rows:
            del self.tokens[row]

    def alloc_for(self, slots: Sequence[int]) -> list[int]:
        fresh = self.alloc(len(slots))
        self.held.update(zip(slots, fresh, strict=True))
        return fresh

    def rows_for(self, slots: Sequence[int]) -> list[int]:
        return [self.held[s] for s in slots]

    def free_for(self, slots: Sequence[int]) -> None:
        self.free([self.held.pop(s) for s in slots if s in self.held])

    def rewind(self, row: int, new_len: int) -> None:
        del self.tokens[row][new_len:]

    def cached(self, rows: Sequence[int]) -> list[int]:
        return [len(self.tokens[r]) for r in rows]

    def extend(
        self, rows: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for row, new in zip(rows, tokens, strict=True):
            self.tokens[row].extend(new)
        return self._logits([t for new in tokens for t in new])

    def extend_tree(
        self,
        rows: Sequence[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise AssertionError("a block drafter drafts chains: it never extends a tree")

    def verify(
        self, rows: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert tokens.shape[1] == self.tokens_per_req
        self.blocks.append(tokens.tolist())
        return self.extend(rows, tokens.tolist())

    def _logits(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.zeros(len(ids), self.vocab, dtype=torch.float64)
        logits[torch.arange(len(ids)), torch.tensor(ids, dtype=torch.int64)] = 20.0
        return logits, torch.zeros(len(ids), 1)


class Placeholders:
    """A BlockDraftModel stand-in: placeholder k is id 1000 + k."""

    def placeholder(self, offset: int) -> int:
        return 1000 + offset


@pytest.mark.parametrize("d", range(2, 9))
@pytest.mark.parametrize("algo", [DFLASH, DSPARK], ids=lambda a: a.name)
def test_drafts_come_from_their_placeholders(algo: SpecAlgorithm[Any], d: int) -> None:
    """Draft j is placeholder j + 1's output, one per verified position: the block row is the
    anchor (DFLASH) and the placeholders; DSPARK's catch-up took the anchor; the placeholders
    are rewound and the anchor kept."""
    t_draft = algo.get_num_tokens_per_req_for_target_verify(d, True)
    t_target = algo.get_num_tokens_per_req_for_target_verify(d, False)
    runner = RecordingRunner(t_draft)
    history = {7: [1, 2, 3], 9: [4, 5]}
    drafter = BlockDrafter(
        runner,
        Placeholders(),  # type: ignore[arg-type]  # a double: only what the drafter calls
        history.__getitem__,
        block_layout(t_draft, t_target),
        None,
    )
    empty = torch.zeros(0, dtype=torch.int64)
    drafter.admit(
        DraftAdmission(
            slots=(7, 9), bonus_tokens=empty, seq_lens=empty, hidden=None, draft_input=None
        )
    )
    step = DraftStep(
        slots=(7, 9),
        bonus_tokens=torch.tensor([11, 12]),
        seq_lens=torch.tensor([3, 2]),
        payload=RelayPayload(),
        max_nodes=t_target - 1,
        sampling=(specstrat.GREEDY,) * 2,
    )
    tree = drafter.propose(step)
    blanks = [1000 + k for k in range(1, t_target)]
    assert tree.tokens.tolist() == [blanks, blanks]
    assert tree.lengths.tolist() == [t_target - 1] * 2
    anchor = [[11], [12]] if algo is DFLASH else [[], []]
    assert runner.blocks == [[[*a, *blanks] for a in anchor]]
    assert list(runner.tokens.values()) == [[1, 2, 3, 11], [4, 5, 12]]


def test_the_confidence_cut_keeps_each_block_up_to_its_first_unsure_draft() -> None:
    """With a threshold, lengths stop before the first node whose confidence is below it."""
    runner = RecordingRunner(4, vocab=1004)
    drafter = BlockDrafter(
        runner,
        Placeholders(),  # type: ignore[arg-type]
        {0: [1]}.__getitem__,
        block_layout(4, 4),
        0.5,
    )
    drafter.admit(
        DraftAdmission(
            slots=(0,),
            bonus_tokens=torch.tensor([0]),
            seq_lens=torch.tensor([1]),
            hidden=None,
            draft_input=None,
        )
    )
    step = DraftStep(
        slots=(0,),
        bonus_tokens=torch.tensor([2]),
        seq_lens=torch.tensor([1]),
        payload=RelayPayload(),
        max_nodes=3,
        sampling=(specstrat.GREEDY,),
    )
    real = runner._logits

    # Placeholder 2 and 3: mass spread over two ids (confidence 0.5 - tiny); 1: sure.
    def spread(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        logits, hidden = real(ids)
        logits[2:, 0] = 20.0 - 1e-6
        return logits, hidden

    runner._logits = spread  # type: ignore[method-assign]
    tree = drafter.propose(step)
    assert tree.confidence is not None
    assert tree.confidence[0, 0] > 0.99 > 0.5 > tree.confidence[0, 1]
    assert tree.lengths.tolist() == [1]


# -- refusals ------------------------------------------------------------------------------------


def test_a_policy_refusing_draft_worker_verify_cannot_use_the_block_drafter() -> None:
    """An algorithm whose policy says supports_target_verify_for_draft() is False is refused
    at construction, naming the drafter's need, the policy and the fix."""
    with pytest.raises(
        InvalidStrategy,
        match=r"MY_BLOCK: drafter=BlockDrafterFactory needs draft_worker_verify .* "
        r"target_verify=OffsetVerifyPolicy.supports_target_verify_for_draft\(\) is False; "
        r"use a policy that allows it",
    ):
        replace(DFLASH, name="MY_BLOCK", target_verify=OffsetVerifyPolicy())


class UndeclaredBlockFactory(BlockDrafterFactory):
    """The block drafter, not declaring that it verifies on the draft worker."""

    @property
    def needs(self) -> DrafterNeeds:
        return DrafterNeeds(draft_model=True)


def test_the_draft_worker_graph_runner_refuses_at_engine_start(models: EmbeddedModels) -> None:
    """A drafter that asks for a draft-worker runner without declaring it is refused when the
    engine starts (the draft worker's graph runner), not mid-run."""
    algo = replace(
        DFLASH,
        name="SNEAKY",
        target_verify=OffsetVerifyPolicy(),
        drafter=UndeclaredBlockFactory(),
    )
    with pytest.raises(InvalidConfig, match=r"SNEAKY does not allow TARGET_VERIFY on the draft"):
        Engine(algo, models, CONFIG)


def test_models_without_a_block_model_are_refused(models: EmbeddedModels) -> None:
    """Engines over models without a block draft model refuse DFLASH by name."""
    mine = ModelSet(target=models.target, draft=models.draft)
    with pytest.raises(InvalidConfig, match=r"needs a block draft model but models.block is None"):
        Engine(DFLASH, mine, CONFIG)
    with pytest.raises(InvalidConfig, match=r"ModelSet.block=TinyLM is not a BlockDraftModel"):
        ModelSet(target=models.target, block=models.draft)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match=r"block head file .*missing.pt is missing"):
        EmbeddedModels.load(block=Path("missing.pt"))


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), True, "0.3"])
def test_confidence_threshold_is_checked(bad: Any) -> None:
    """A threshold that is not a probability is refused, naming it."""
    with pytest.raises(
        InvalidConfig, match=r"confidence_threshold=.* must be a number in \[0, 1\]"
    ):
        BlockDrafterFactory(confidence_threshold=bad)


@dataclass(frozen=True, slots=True)
class _Keeping:
    """A drafter factory that keeps the drafter it creates (a test double)."""

    inner: DrafterFactory[Any]
    made: list[Drafter[Any]] = field(default_factory=list)

    @property
    def needs(self) -> DrafterNeeds:
        """The inner factory's needs."""
        return self.inner.needs

    def create_drafter(self, context: DrafterContext) -> Drafter[Any]:
        """The inner factory's drafter, kept."""
        self.made.append(self.inner.create_drafter(context))
        return self.made[-1]

    def prefill_payload(
        self, models: LoadedModels, bonus_tokens: torch.Tensor, hidden: torch.Tensor
    ) -> RelayPayload:
        """The inner factory's prefill payload."""
        return self.inner.prefill_payload(models, bonus_tokens, hidden)


def test_block_runner_and_placeholder_errors(models: EmbeddedModels) -> None:
    """A block of the wrong width, a placeholder offset below 1 and a step wider than the
    layout are refused by name."""
    keeping = _Keeping(DFLASH.drafter)
    Engine(replace(DFLASH, drafter=keeping), models, CONFIG)
    drafter = keeping.made[0]
    assert isinstance(drafter, BlockDrafter)
    with pytest.raises(
        InvalidConfig, match=r"tokens have 2 per draft row; this draft worker verifies T_draft=4"
    ):
        drafter.runner.verify([1], torch.zeros(1, 2, dtype=torch.int64))
    block = models.block
    assert block is not None
    with pytest.raises(InvalidConfig, match=r"offset=0 must be an int >= 1"):
        block.placeholder(0)
    step = DraftStep(
        slots=(),
        bonus_tokens=torch.zeros(0, dtype=torch.int64),
        seq_lens=torch.zeros(0, dtype=torch.int64),
        payload=RelayPayload(),
        max_nodes=5,
        sampling=(),
    )
    with pytest.raises(
        InvalidConfig, match=r"max_nodes=5 drafts but this block drafter was laid out for 3"
    ):
        drafter.propose(step)


def test_block_rows_reproduce_the_draft_lm(models: EmbeddedModels) -> None:
    """Rows of bytes through the block model give exactly the draft LM's logits (the head only
    changes placeholder rows)."""
    from specstrat.runtime._models.model import CausalAttention

    block = models.block
    assert block is not None
    tokens = torch.tensor(list(b"def f(x):\n"))
    positions = torch.arange(len(tokens))
    with torch.no_grad():
        want, _ = models.draft(tokens, positions, CausalAttention(1))
        got, _ = block(tokens, positions, CausalAttention(1))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert isinstance(block, specstrat.BlockDraftModel)


def test_the_block_head_ships_beside_untouched_weights() -> None:
    """block.pt records the embedded.pt it was trained against (still the shipped one, byte for
    byte), and all embedded weights together stay under 5 MB."""
    import hashlib

    from specstrat.runtime._models.weights import BLOCK_WEIGHTS, EMBEDDED_WEIGHTS

    frozen = torch.load(BLOCK_WEIGHTS, weights_only=True)["frozen"]
    assert frozen["sha256"] == hashlib.sha256(EMBEDDED_WEIGHTS.read_bytes()).hexdigest()
    assert EMBEDDED_WEIGHTS.stat().st_size + BLOCK_WEIGHTS.stat().st_size < 5 * 1024 * 1024
