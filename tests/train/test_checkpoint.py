"""A run interrupted after an epoch and resumed from its checkpoint ends with the weights of an
uninterrupted run, without generating again; a checkpoint is refused for another target, for a
config or prompts that differ, and when missing or foreign."""

import dataclasses
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch

import specstrat.train.checkpoint
import specstrat.train.loop
from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.train import (
    Checkpoint,
    HeadConfig,
    HeadMismatch,
    TrainedHead,
    default_prompts,
    read_checkpoint,
    train_head,
)
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT

PROMPTS = default_prompts()[:10]
CONFIG = HeadConfig(draft_vocab=64, max_new_tokens=8, epochs=4, batch_size=4, held_out=0.2)


class Interrupted(Exception):
    """Stands for a run killed after a checkpoint was written."""


@pytest.fixture(scope="module")
def uninterrupted(
    llama: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> TrainedHead:
    """CONFIG's run on the tiny llama, start to end, writing its checkpoints."""
    path = tmp_path_factory.mktemp("whole") / "head.ckpt"
    return train_head(CONFIG, llama, tokenizer, PROMPTS, progress=False, checkpoint=path)


@pytest.fixture(scope="module")
def after_two(llama: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """CONFIG's run stopped right after the checkpoint of epoch 2 was written, read back."""
    path = tmp_path_factory.mktemp("cut") / "head.ckpt"
    real = specstrat.train.checkpoint.save_checkpoint

    def save_then_stop(file: Path, checkpoint: Checkpoint) -> Path:
        real(file, checkpoint)
        if checkpoint.epoch == 2:
            raise Interrupted
        return Path(file)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(specstrat.train.loop, "save_checkpoint", save_then_stop)
        with pytest.raises(Interrupted, match=r"^$"):
            train_head(CONFIG, llama, tokenizer, PROMPTS, progress=False, checkpoint=path)
    return read_checkpoint(path)


def _no_generation(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("a resumed run generated responses again")


def test_a_resumed_run_ends_with_the_uninterrupted_weights(
    uninterrupted: TrainedHead,
    after_two: Checkpoint,
    llama: Any,
    tokenizer: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resuming after epoch 2 of 4 runs epochs 3 and 4 on the stored data (nothing generated)
    and ends with exactly the uninterrupted run's weights, steps, loss and tau."""
    assert (after_two.epoch, after_two.step) == (2, 2 * 2)  # 8 training prompts, batches of 4
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    again = tmp_path / "again.ckpt"
    resumed = train_head(
        CONFIG, llama, tokenizer, PROMPTS, progress=False, resume=after_two, checkpoint=again
    )
    ours, theirs = resumed.head.state_dict(), uninterrupted.head.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    assert (resumed.steps, resumed.final_loss) == (uninterrupted.steps, uninterrupted.final_loss)
    assert resumed.tau == uninterrupted.tau
    assert resumed.acceptance == uninterrupted.acceptance
    assert read_checkpoint(again).epoch == 4


def test_a_checkpoint_is_refused_for_another_target(
    after_two: Checkpoint, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another model's weights are refused by HeadMismatch naming both hashes, before any
    generation."""
    other = tiny.model("llama", seed=1, initializer_range=LEARNABLE_INIT)
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    with pytest.raises(HeadMismatch, match=r"was written for target .* but target .* has weights"):
        train_head(CONFIG, other, tokenizer, PROMPTS, progress=False, resume=after_two)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"lr": 2e-3}, r"HeadConfig lr=0\.001 \(this run: 0\.002\); rerun with the checkpoint"),
        ({"layers": (0, 1)}, r"layers=None \(this run: \[0, 1\]\)"),
        ({"epochs": 5}, r"epochs=4 \(this run: 5\)"),
    ],
)
def test_a_config_that_matters_is_refused(
    after_two: Checkpoint, llama: Any, tokenizer: Any, change: dict[str, Any], match: str
) -> None:
    """A field that shapes the data or the training is refused, naming both values."""
    config = HeadConfig(**{**_fields(CONFIG), **change})
    with pytest.raises(InvalidConfig, match=match):
        train_head(config, llama, tokenizer, PROMPTS, progress=False, resume=after_two)


def test_budget_and_eval_depth_may_differ(after_two: Checkpoint) -> None:
    """A budget and a measuring depth of its own do not stop a run from resuming."""
    config = HeadConfig(**{**_fields(CONFIG), "budget_seconds": 60.0, "eval_depth": 3})
    after_two.check_resumes(config, "prompts")


def test_a_setting_an_older_checkpoint_lacks_counts_as_its_default(after_two: Checkpoint) -> None:
    """A checkpoint written before repeat_temperature existed resumes at the default and is
    refused, naming the default, for another value."""
    older = dataclasses.replace(
        after_two, config={k: v for k, v in after_two.config.items() if k != "repeat_temperature"}
    )
    older.check_resumes(CONFIG, "prompts")
    hotter = HeadConfig(**{**_fields(CONFIG), "repeat_temperature": 1.0})
    with pytest.raises(InvalidConfig, match=r"repeat_temperature=0\.7 \(this run: 1\.0\)"):
        older.check_resumes(hotter, "prompts")


def test_other_prompts_are_refused(after_two: Checkpoint) -> None:
    """Data from another prompt source is refused, naming both sources."""
    with pytest.raises(InvalidConfig, match=r"holds data from prompts 'prompts', but this run"):
        after_two.check_resumes(CONFIG, "my.jsonl")


def test_missing_foreign_and_broken_files_are_refused(tmp_path: Path) -> None:
    """A missing file, a torch file of something else and a file of garbage are each refused
    by ModelLoadError naming the file."""
    with pytest.raises(ModelLoadError, match=r"resume='.*nothing\.ckpt': no such file"):
        read_checkpoint(tmp_path / "nothing.ckpt")
    torch.save({"x": 1}, tmp_path / "other.ckpt")
    with pytest.raises(ModelLoadError, match=r"not a specstrat training checkpoint \(format=None"):
        read_checkpoint(tmp_path / "other.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match=r"junk\.ckpt' is not a readable checkpoint"):
        read_checkpoint(tmp_path / "junk.ckpt")


def _fields(config: HeadConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in HeadConfig.__dataclass_fields__}
