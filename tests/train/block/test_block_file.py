"""A trained block drafter's file and attachment on a tiny 4-layer llama (no download): bound to
its target, told apart from a draft LM's, replayed in the prefill process, picked by the CLI,
and every refusal by name."""

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specstrat
from specstrat import InvalidConfig
from specstrat.cli import main
from specstrat.errors import ModelLoadError
from specstrat.hf import HFCausalLM, HFModels
from specstrat.hf.process_loader import HFLoader
from specstrat.train import (
    Attachers,
    BlockAttacher,
    BlockLM,
    BlockVocabLM,
    DraftAttacher,
    HeadConfig,
    HeadMismatch,
    TrainedDraftLM,
    attach_block,
    attach_files,
    block_for,
    block_lm_metadata,
    draft_lm_metadata,
    load_block_lm,
    reads_block,
    save_draft_lm,
    train_block_lm,
    trained_files,
)
from tests.hf import tiny
from tests.train.block.conftest import TRAIN, llama4


def test_the_file_round_trips_and_stores_only_what_the_target_lacks(
    trained: TrainedDraftLM, block_file: Path, target: HFCausalLM
) -> None:
    """The loaded drafter has the trained tensors (float16-rounded), its placeholders and the
    same facts; the file holds the trained tensors and d2t only, and says its format."""
    loaded = load_block_lm(block_file, target)
    assert isinstance(loaded.draft, BlockLM)
    assert loaded.draft.block == 3
    for name, value in trained.draft.trainable().items():
        assert torch.equal(loaded.draft.trainable()[name], value.half().float()), name
    meta = block_lm_metadata(block_file)
    assert (meta["format"], meta["block"], meta["layers"]) == ("specstrat-block-lm/1", "3", "[0]")
    from safetensors import safe_open

    with safe_open(str(block_file), framework="pt") as f:
        assert set(f.keys()) == {*trained.draft.trainable(), "d2t"}


def test_a_drafter_for_another_target_is_refused(block_file: Path, tokenizer: Any) -> None:
    """A block drafter trained for the tiny llama is refused on another model, naming both."""
    other = HFCausalLM(llama4(seed=3), vocab_size=tiny.VOCAB, name="other")
    with pytest.raises(HeadMismatch, match=r"block=.* was trained for target .* but target 'oth"):
        attach_block(HFModels(target=other, tokenizer=tokenizer), block_file)


def test_a_draft_lm_file_and_a_block_file_are_told_apart(
    block_file: Path, target: HFCausalLM, tmp_path: Path
) -> None:
    """A block file is not a draft LM, a draft-LM file is not a block drafter, and a missing
    --block is refused naming it."""
    from specstrat.train import DraftLM

    with pytest.raises(ModelLoadError, match=r"not a specstrat draft LM \(format='specstrat-bl"):
        draft_lm_metadata(block_file)
    facts = load_block_lm(block_file, target)
    draft = DraftLM.from_target(llama4(), (0,), torch.arange(50))
    draft_file = save_draft_lm(tmp_path / "draft.safetensors", replace(facts, draft=draft))
    with pytest.raises(ModelLoadError, match=r"not a specstrat block drafter \(format='specs"):
        load_block_lm(draft_file, target)
    with pytest.raises(ModelLoadError, match=r"block=.*missing.safetensors'?: no such file"):
        block_for("smollm2", str(block_file.with_name("missing.safetensors")), ["DFLASH"])


@pytest.mark.parametrize("block", ["", "0", "x"])
def test_a_file_with_bad_block_metadata_is_refused(
    block: str, block_file: Path, target: HFCausalLM, tmp_path: Path
) -> None:
    """Metadata ``block`` that is not a count >= 1 is refused naming the file and the value."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(block_file), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata={**meta, "block": block})
    with pytest.raises(ModelLoadError, match=rf"bad\.safetensors'? has metadata block='{block}'"):
        load_block_lm(path, target)


def test_a_second_block_drafter_is_refused(models: HFModels, block_file: Path) -> None:
    """Models that already have a block drafter get no second one."""
    with pytest.raises(InvalidConfig, match=r"the models already have a block drafter"):
        attach_block(models, block_file)


def test_a_draft_and_a_block_drafter_are_both_replayed(
    block_file: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """attach_files records a draft LM's and a block drafter's attachers in one picklable
    attacher; replayed on freshly loaded models (as the disaggregation prefill process does)
    it attaches both again."""
    from specstrat.train import DraftLM, save_draft_lm

    def fresh() -> HFModels:
        return HFModels(target=HFCausalLM(llama4(), vocab_size=tiny.VOCAB), tokenizer=tokenizer)

    models = fresh()
    draft = DraftLM.from_target(llama4(), (0,), torch.arange(50))
    facts = load_block_lm(block_file, models.target)
    draft_file = save_draft_lm(tmp_path / "draft.safetensors", replace(facts, draft=draft))
    models = attach_files(models, None, str(draft_file), str(block_file))
    steps = (DraftAttacher(str(draft_file)), BlockAttacher(str(block_file)))
    assert models.attach == Attachers(steps)
    loader = HFLoader("some/model", "float32", models.attach)
    assert pickle.loads(pickle.dumps(loader)) == loader
    replayed = models.attach(fresh())
    assert isinstance(replayed.block, BlockVocabLM)
    assert replayed.draft is not None


def test_the_cli_picks_the_flag_then_the_shipped_drafter_for_a_block_drafter(
    block_file: Path,
) -> None:
    """--block wins; without it DFLASH and DSPARK on smollm2 get the shipped drafter, others
    none; trained_files answers head, draft LM and block drafter together."""
    assert block_for("smollm2", str(block_file), ["NGRAM"]) == str(block_file)
    assert block_for("smollm2", None, ["NGRAM", "STANDALONE", "EAGLE"]) is None
    assert block_for("/some/model", None, ["DFLASH"]) is None
    assert reads_block(specstrat.DSPARK)
    assert not reads_block(specstrat.STANDALONE)
    head, draft, block = trained_files("smollm2", None, None, None, ["DFLASH"])
    assert head is None
    assert draft is None
    assert block is not None
    assert block.endswith("smollm2-block.safetensors")


def test_the_block_trainer_refuses_another_kind(target: HFCausalLM, tokenizer: Any) -> None:
    """train_block_lm refuses kind='draft-lm', before any work."""
    with pytest.raises(InvalidConfig, match=r"train_block_lm trains kind='block'"):
        train_block_lm(HeadConfig(kind="draft-lm"), target, tokenizer, TRAIN)


def test_demo_and_bench_refuse_a_block_drafter_on_the_embedded_models(
    block_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--block without --model is refused naming the flag and the fix, before any run."""
    with pytest.raises(SystemExit, match=r"--block .* pass --model smollm2 or --model PATH"):
        main(["demo", "--block", str(block_file)])
    argv = ["bench", "--algo", "DFLASH", "--block", str(block_file), "--requests", "1"]
    assert main(argv) == 2
    assert "specstrat bench: InvalidConfig: --block" in capsys.readouterr().err
