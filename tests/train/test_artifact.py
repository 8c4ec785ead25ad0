"""A head file round-trips (float16 weights, d2t, metadata), is refused for another target by
HeadMismatch, and a truncated or foreign safetensors file is refused by name."""

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf.matmul_padding import PlannedLinears
from specstrat.train import (
    Eagle3DraftHead,
    Eagle3Head,
    HeadMismatch,
    TrainedHead,
    chained_conditional,
    load_head,
    save_head,
    target_sha256,
)
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT


@pytest.fixture
def trained(llama: Any) -> TrainedHead:
    """An untrained head wrapped as a trained one, bound to the tiny llama."""
    torch.manual_seed(0)
    head = Eagle3Head.from_target(llama, layers=(0, 1, 1), d2t=torch.tensor([3, 1, 4, 15, 9]))
    return TrainedHead(
        head=head,
        target="tiny-llama",
        target_sha256=target_sha256(llama),
        data_size=12,
        data_source="default pool",
        steps=7,
        final_loss=1.5,
        tau=1.25,
        command="specstrat train",
    )


def test_round_trip_keeps_weights_map_and_metadata(
    tmp_path: Path, llama: Any, trained: TrainedHead
) -> None:
    """Weights come back as their float16 rounding, d2t and every recorded fact exactly."""
    path = save_head(tmp_path / "head.safetensors", trained)
    loaded = load_head(path, llama)
    assert loaded.d2t.tolist() == [3, 1, 4, 15, 9]
    assert loaded.head.config == trained.head.config
    for name, value in trained.head.state_dict().items():
        torch.testing.assert_close(loaded.head.state_dict()[name], value.half().to(value.dtype))
    facts = (loaded.target, loaded.data_size, loaded.steps, loaded.command)
    assert facts == ("tiny-llama", 12, 7, "specstrat train")
    assert (loaded.final_loss, loaded.tau, loaded.data_source) == (1.5, 1.25, "default pool")
    x = torch.randn(2, 192)
    a, _ = trained.draft_head()(x, torch.tensor([1, 2]))
    b, _ = loaded.draft_head()(x, torch.tensor([1, 2]))
    torch.testing.assert_close(a, b, atol=5e-2, rtol=0)  # float16 storage of the weights


def test_hash_reads_the_weights_not_their_dtype(llama: Any) -> None:
    """The model in bfloat16 hashes like the model in float32; other weights hash otherwise."""
    digest = target_sha256(llama)
    assert target_sha256(tiny.model("llama", initializer_range=LEARNABLE_INIT).bfloat16()) == digest
    assert target_sha256(tiny.model("llama", seed=1, initializer_range=LEARNABLE_INIT)) != digest


def test_a_head_for_another_target_is_refused(tmp_path: Path, trained: TrainedHead) -> None:
    """Loading for a model with other weights raises HeadMismatch naming both and the fix."""
    path = save_head(tmp_path / "head.safetensors", trained)
    other = tiny.model("llama", seed=1, initializer_range=LEARNABLE_INIT)
    assert issubclass(HeadMismatch, ModelLoadError)
    assert issubclass(HeadMismatch, InvalidConfig)
    with pytest.raises(
        HeadMismatch, match=r"trained for target 'tiny-llama'.*sha256.*specstrat train"
    ):
        load_head(path, other)


def test_a_truncated_file_is_refused(tmp_path: Path, llama: Any, trained: TrainedHead) -> None:
    """A file cut short is refused naming it."""
    path = save_head(tmp_path / "head.safetensors", trained)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"head\.safetensors' is not a readable safetensors"):
        load_head(path, llama)


def test_a_foreign_safetensors_file_is_refused(tmp_path: Path, llama: Any) -> None:
    """A safetensors file without the head format is refused as not a specstrat head."""
    from safetensors.torch import save_file

    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ModelLoadError, match=r"weights\.safetensors' .*not a specstrat head"):
        load_head(path, llama)
    with pytest.raises(ModelLoadError, match=r"no such file"):
        load_head(tmp_path / "absent.safetensors", llama)


def test_tau_may_be_unmeasured(tmp_path: Path, llama: Any, trained: TrainedHead) -> None:
    """A head trained without held-out data records tau as NaN and loads it back so."""
    from dataclasses import replace

    path = save_head(tmp_path / "head.safetensors", replace(trained, tau=math.nan))
    assert math.isnan(load_head(path, llama).tau)


def test_conditional_acceptance_derives_from_the_stored_acceptance(
    tmp_path: Path, llama: Any, trained: TrainedHead
) -> None:
    """TrainedHead.conditional is each position's acceptance over the previous one's (every
    anchor proposes every position), None past the last position any anchor reached, and comes
    back from the file with the acceptance it derives from."""
    from dataclasses import replace

    head = replace(trained, acceptance=(0.5, 0.25, 0.0, 0.0))
    assert head.conditional == (0.5, 0.5, 0.0, None)
    assert head.conditional == tuple(chained_conditional(head.acceptance))
    assert load_head(save_head(tmp_path / "head.safetensors", head), llama).conditional == (
        head.conditional
    )


def test_a_draft_head_refuses_a_narrow_that_is_not_a_bool(trained: TrainedHead) -> None:
    """Eagle3DraftHead's narrow must be True or False, on any device, refused by name."""
    with pytest.raises(InvalidConfig, match=r"narrow=1: pass True \(a draft model\) or False"):
        Eagle3DraftHead(trained.head, tiny.VOCAB, narrow=1)  # type: ignore[arg-type]


def test_a_draft_head_keeps_float32_when_not_narrow(trained: TrainedHead) -> None:
    """draft_head(narrow=False) plans the head's matmuls without the bfloat16 form, so its
    drafts are float32's whatever this machine runs faster."""
    drafted = trained.head.draft_head(tiny.VOCAB, narrow=False)
    assert isinstance(drafted.project, PlannedLinears)
    assert drafted.project.plan.packed_form() != "packed-bf16"
