"""`specstrat train` end to end on a tiny saved llama (no download): the head file, its
checkpoint, the summary and the recorded command line; bad flags refused by name before any
work; a resume that continues from the checkpoint without generating again."""

import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import NoReturn

import pytest
import torch

import specstrat.hf
import specstrat.train.loop
from specstrat.cli import main
from specstrat.hf import load
from specstrat.train import (
    block_lm_metadata,
    draft_lm_metadata,
    load_block_lm,
    load_draft_lm,
    load_head,
    read_checkpoint,
)
from specstrat.train.self_written import written_source
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT

PROMPTS = [f"Say something about the number {i}." for i in range(8)]
FLAGS = ["--draft-vocab", "64", "--max-new-tokens", "8", "--batch-size", "4", "--no-progress"]


def _saved(directory: Path, seed: int) -> Path:
    return tiny.save_model(tiny.model("llama", seed, initializer_range=LEARNABLE_INIT), directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny learnable llama saved with its tokenizer."""
    return _saved(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL file of PROMPTS."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def _argv(model_dir: Path, out: Path, prompts: Path, *extra: str) -> list[str]:
    head = ["train", "--model", str(model_dir), "--out", str(out), "--prompts", str(prompts)]
    return [*head, *FLAGS, "--epochs", "2", "--threads", "1", *extra]


@pytest.fixture(scope="module")
def trained(
    model_dir: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[str], Path, str]:
    """One `specstrat train` run: its argv, the head path and what it printed."""
    out = tmp_path_factory.mktemp("run") / "head.safetensors"
    argv = _argv(model_dir, out, prompts_file)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return argv, out, printed.getvalue()


def test_train_writes_the_head_its_checkpoint_and_a_summary(
    trained: tuple[list[str], Path, str], model_dir: Path, prompts_file: Path
) -> None:
    """The head loads for its target and records the command line and the prompts file; the
    checkpoint of the last epoch lies beside it; the summary names data, steps, loss, the
    held-out τ and acceptance by position (unconditional and conditional), the layer the head
    started from and the path."""
    argv, out, printed = trained
    head = load_head(out, load(model_dir).target)
    assert head.command == shlex.join(["specstrat", *argv])
    assert head.data_source == str(prompts_file.resolve())
    assert head.steps == 2 * 2  # 7 training prompts (1 held out) in batches of 4, 2 epochs
    assert len(head.acceptance) == 5
    checkpoint = read_checkpoint(out.with_suffix(".ckpt"))
    assert (checkpoint.epoch, checkpoint.step) == (2, 4)
    split = (re.split(r" {2,}", line, maxsplit=1) for line in printed.splitlines())
    rows = {label: value for label, value in split}
    assert list(rows) == [
        "data",
        "steps",
        "final loss",
        "held-out τ",
        "held-out acceptance (unconditional)",
        "held-out acceptance (conditional)",
        "layers",
        "started from",
        "head",
        "checkpoint",
    ]
    assert rows["started from"] == head.start == "random"
    assert rows["head"] == str(out)
    assert rows["data"] == f"{head.data_size} positions from {prompts_file.resolve()}"
    assert rows["held-out τ"].startswith(f"{head.tau:.3f} ")
    unconditional = " ".join(f"{a:.3f}" for a in head.acceptance)
    assert rows["held-out acceptance (unconditional)"] == f"{unconditional} (by draft position)"
    assert rows["held-out acceptance (conditional)"].endswith(" (by draft position)")


def _no_generation(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("generation started")


def test_resume_continues_from_the_checkpoint_without_generating(
    trained: tuple[list[str], Path, str],
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--resume` of the finished run's checkpoint trains no further step, generates nothing
    and writes the same head."""
    argv, out, _ = trained
    again = tmp_path / "again.safetensors"
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    argv = [str(again) if a == str(out) else a for a in argv]
    assert main([*argv, "--resume", str(out.with_suffix(".ckpt"))]) == 0
    target = load(model_dir).target
    first, second = load_head(out, target), load_head(again, target)
    assert (second.steps, second.tau, second.final_loss) == (
        first.steps,
        first.tau,
        first.final_loss,
    )
    for name, value in first.head.state_dict().items():
        assert torch.equal(second.head.state_dict()[name], value), name


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def _unreachable(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError("the model was loaded before the flags were checked")


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("plain.txt/head.safetensors", r"is under '.*plain\.txt', a plain file, not a directory"),
        ("missing/head.safetensors", r"its directory '.*missing' does not exist; create it"),
        ("head.bin", r"does not end in \.safetensors; name the head file, e.g\. --out .*head"),
    ],
)
def test_a_bad_out_is_refused_before_loading(
    out: str,
    message: str,
    tmp_path: Path,
    prompts_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An --out under a plain file, in a missing directory or not .safetensors is refused by
    name before the model loads."""
    (tmp_path / "plain.txt").write_text("a file")
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    err = _refused(_argv(tmp_path, tmp_path / out, prompts_file), capsys)
    assert err.startswith("specstrat train: InvalidConfig: --out ")
    assert re.search(message, err), err


def test_a_bad_prompts_line_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --prompts line that is not JSON is refused naming the file and line, before loading."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    err = _refused(_argv(tmp_path, tmp_path / "h.safetensors", bad), capsys)
    assert f"InvalidConfig: {bad}:2 is not JSON" in err


@pytest.mark.parametrize("layers", [",", "1,x", "-1,2"])
def test_bad_layers_are_refused_by_argparse(
    layers: str, tmp_path: Path, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--layers that are not indices >= 0 exit with status 2 and the flag named."""
    argv = _argv(tmp_path, tmp_path / "h.safetensors", prompts_file, f"--layers={layers}")
    with pytest.raises(SystemExit, match=r"^2$"):
        main(argv)
    assert f"argument --layers: {layers!r} is not comma-separated" in capsys.readouterr().err


def test_one_layer_is_refused_for_a_head_before_loading(
    tmp_path: Path,
    prompts_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head fuses two layers or more: --layers=3 is refused naming the field (a draft LM may
    start from one layer)."""
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    err = _refused(_argv(tmp_path, tmp_path / "h.safetensors", prompts_file, "--layers=3"), capsys)
    assert "HeadConfig.layers=(3,) must be None (the default rule) or at least 2" in err


@pytest.mark.parametrize(
    ("extra", "messages"),
    [
        (["--layers", "0,5"], ["InvalidConfig: layers=(0, 5) must be non-empty indices in [0, 1]"]),
        (
            ["--intermediate-size", "769"],
            [
                "HeadConfig.intermediate_size=769 (--intermediate-size) is more than 8x the",
                "pass at most 768",
            ],
        ),
    ],
    ids=["layers-past-the-model", "head-wider-than-eight-target-mlps"],
)
def test_a_head_the_target_cannot_have_is_refused_before_generating(
    extra: list[str],
    messages: list[str],
    model_dir: Path,
    prompts_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--layers beyond the target's 2 layers, or --intermediate-size past 8x its MLP (96 here),
    are refused once it loads, naming the value and what it takes, before generation."""
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    argv = _argv(model_dir, tmp_path / "h.safetensors", prompts_file, *extra)
    err = _refused(argv, capsys)
    assert all(m in err for m in messages), err


def test_resume_for_another_target_is_refused(
    trained: tuple[list[str], Path, str],
    prompts_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkpoint written for another model is refused by HeadMismatch before generation."""
    other = _saved(tmp_path / "other", seed=1)
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    ckpt = str(trained[1].with_suffix(".ckpt"))
    argv = _argv(other, tmp_path / "h.safetensors", prompts_file, "--resume", ckpt)
    err = _refused(argv, capsys)
    assert f"HeadMismatch: resume={ckpt!r} was written for target" in err


def test_a_resume_with_another_lr_is_refused_before_loading(
    trained: tuple[list[str], Path, str],
    model_dir: Path,
    prompts_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A --resume written with another --lr is refused, naming both values, before loading."""
    ckpt = str(trained[1].with_suffix(".ckpt"))
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    argv = _argv(model_dir, tmp_path / "h.safetensors", prompts_file, "--lr", "0.01")
    err = _refused([*argv, "--resume", ckpt], capsys)
    assert "InvalidConfig: resume=" in err
    assert "HeadConfig lr=0.001 (this run: 0.01); rerun with the checkpoint's values" in err


def test_a_missing_resume_is_refused_before_loading(
    model_dir: Path,
    prompts_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A --resume file that does not exist is refused by name before the model loads."""
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    ckpt = tmp_path / "nowhere.ckpt"
    argv = _argv(model_dir, tmp_path / "h.safetensors", prompts_file, "--resume", str(ckpt))
    err = _refused(argv, capsys)
    assert f"ModelLoadError: resume={str(ckpt)!r}: no such file" in err


def test_the_default_pool_under_a_budget(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --prompts the built-in pool is used, less the prompts too long for the tiny
    model's 512 positions (said on stderr), and --budget (minutes) with no --epochs trains
    until the budget ends."""
    out = tmp_path / "head.safetensors"
    argv = ["train", "--model", str(model_dir), "--out", str(out), *FLAGS, "--budget", "0.1"]
    assert main([*argv, "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert "positions from default pool" in captured.out
    assert re.search(
        r"skipping [1-9]\d* of the built-in pool's \d+ prompts: with --max-new-tokens \d+ they "
        r"pass the model's 512 positions",
        captured.err,
    )
    assert load_head(out, load(model_dir).target).steps >= 1


def test_a_negative_repeat_temperature_is_refused_by_argparse(
    tmp_path: Path, prompts_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--repeat-temperature below 0 exits with status 2 and the flag named."""
    argv = _argv(tmp_path, tmp_path / "h.safetensors", prompts_file, "--repeat-temperature=-1")
    with pytest.raises(SystemExit, match=r"^2$"):
        main(argv)
    assert "argument --repeat-temperature" in capsys.readouterr().err


def test_kind_draft_lm_writes_a_draft_lm_and_its_checkpoint(
    model_dir: Path, prompts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--kind draft-lm --layers=1 writes a draft-LM file that loads for its target, a checkpoint
    after each epoch, and a summary that names the draft LM."""
    out = tmp_path / "draft.safetensors"
    assert main(_argv(model_dir, out, prompts_file, "--kind", "draft-lm", "--layers=1")) == 0
    draft = load_draft_lm(out, load(model_dir).target)
    assert (draft.layers, draft.steps) == ((1,), 4)
    assert draft_lm_metadata(out)["command"].endswith("--kind draft-lm --layers=1")
    assert read_checkpoint(out.with_suffix(".ckpt")).epoch == 2
    rows = dict(
        re.split(r" {2,}", line, maxsplit=1) for line in capsys.readouterr().out.splitlines()
    )
    assert rows["draft LM"] == str(out)


def test_resuming_a_head_as_a_draft_lm_is_refused(
    trained: tuple[list[str], Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A head's checkpoint resumed with --kind draft-lm is refused naming the kind."""
    argv, out, _ = trained
    argv = [str(tmp_path / "d.safetensors") if a == str(out) else a for a in argv]
    resume = ["--resume", str(out.with_suffix(".ckpt")), "--kind", "draft-lm"]
    err = _refused([*argv, *resume], capsys)
    assert "kind='eagle3' (this run: 'draft-lm')" in err


def test_a_draft_lm_resume_continues_without_generating(
    model_dir: Path, prompts_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--resume` of a finished draft-LM run's checkpoint loads the draft's layers, trains no
    further step, generates nothing and writes the same draft."""
    whole, again = tmp_path / "whole.safetensors", tmp_path / "again.safetensors"
    kind = ["--kind", "draft-lm", "--layers=1"]
    assert main(_argv(model_dir, whole, prompts_file, *kind)) == 0
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    resume = ["--resume", str(whole.with_suffix(".ckpt"))]
    assert main([*_argv(model_dir, again, prompts_file, *kind), *resume]) == 0
    target = load(model_dir).target
    one, two = load_draft_lm(whole, target), load_draft_lm(again, target)
    assert (two.steps, two.tau, two.final_loss) == (one.steps, one.tau, one.final_loss)
    for name, value in one.draft.trainable().items():
        assert torch.equal(two.draft.trainable()[name], value), name


def _without_prompts(argv: list[str]) -> list[str]:
    """``argv`` with its ``--prompts FILE`` dropped (--data brings the prompts' data)."""
    at = argv.index("--prompts")
    return argv[:at] + argv[at + 2 :]


@pytest.fixture(scope="module")
def draft_ckpt(
    model_dir: Path, prompts_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The checkpoint of a --kind draft-lm run (its data has the prompts' rows)."""
    draft = tmp_path_factory.mktemp("draft") / "draft.safetensors"
    assert main(_argv(model_dir, draft, prompts_file, "--kind", "draft-lm", "--layers=1")) == 0
    return draft.with_suffix(".ckpt")


def test_kind_block_trains_on_another_runs_data_without_generating(
    model_dir: Path,
    prompts_file: Path,
    draft_ckpt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--kind block --data CKPT trains a block drafter on the generations a draft-LM run
    captured, generating nothing, and writes a block file that loads for its target."""
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    out = tmp_path / "block.safetensors"
    extra = ["--kind", "block", "--layers=1", "--block-size", "2", "--data", str(draft_ckpt)]
    capsys.readouterr()
    assert main(_without_prompts(_argv(model_dir, out, prompts_file, *extra))) == 0
    block = load_block_lm(out, load(model_dir).target)
    assert (block.layers, block.steps, block_lm_metadata(out)["block"]) == ((1,), 4, "2")
    assert block.data_size == read_checkpoint(draft_ckpt).data.positions
    rows = dict(
        re.split(r" {2,}", line, maxsplit=1) for line in capsys.readouterr().out.splitlines()
    )
    assert rows["block drafter"] == str(out)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kind", "block", "--resume", "RESUME"], r"--resume brings its own data"),
        (["--kind", "block"], r"the checkpoint's prompts are the data's"),
        (["--kind", "draft-lm", "--self-written", "4"], r"the checkpoint's prompts are the"),
    ],
)
def test_data_is_refused_with_a_resume_or_prompts(
    trained: tuple[list[str], Path, str],
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--data is refused beside --resume, --prompts or --self-written, before any file is
    read or model loaded."""
    argv, out, _ = trained
    ckpt = str(out.with_suffix(".ckpt"))
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    extra = [ckpt if a == "RESUME" else a for a in extra]
    err = _refused([*argv, *extra, "--data", ckpt], capsys)
    assert re.search(rf"InvalidConfig: --data .* cannot be used here \({message}", err), err


def test_a_head_trains_on_another_runs_data_without_generating(
    trained: tuple[list[str], Path, str],
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--data CKPT trains a head of other settings (TTT steps, a wider MLP and a start from the
    target's layer here) on the data a head's run captured, generating nothing; the head loads,
    as wide, with that data's size and its start recorded (the MLP too wide to copy)."""
    argv, out, _ = trained
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    again = tmp_path / "again.safetensors"
    argv = [str(again) if a == str(out) else a for a in _without_prompts(argv)]
    ckpt = read_checkpoint(out.with_suffix(".ckpt"))
    extra = ["--ttt-steps", "2", "--intermediate-size", "40", "--init", "target"]
    assert main([*argv, *extra, "--data", str(out.with_suffix(".ckpt"))]) == 0
    head = load_head(again, load(model_dir).target)
    assert head.start == "layer 1 (attention, norms)"
    assert head.head.config.intermediate_size == 40
    assert head.head.down_proj.weight.shape[1] == 40
    assert head.data_size == ckpt.data.positions
    assert head.data_source == ckpt.data.source
    assert tuple(head.layers) == ckpt.data.layers


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers=0,1"], r"holds the features of layers \[.*\], not \[0, 1\]; pass --layers="),
        (["--draft-vocab", "32"], r"holds a draft vocabulary of 64 tokens, not 32; pass --draft-v"),
        (["--context"], r"holds generations captured without the prompt's rows; pass --no-con"),
    ],
    ids=["layers", "draft-vocab", "context"],
)
def test_a_head_refuses_data_it_cannot_read(
    trained: tuple[list[str], Path, str],
    extra: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A head's --data must hold its layers' features, its draft vocabulary and its kind of
    rows: each mismatch names the data's value and the flag that fits, before any training."""
    argv, out, _ = trained
    monkeypatch.setattr(specstrat.train.loop, "GenerationCapturer", _no_generation)
    argv = [str(tmp_path / "x.safetensors") if a == str(out) else a for a in argv]
    data = ["--data", str(out.with_suffix(".ckpt"))]
    err = _refused([*_without_prompts(argv), *data, *extra], capsys)
    assert re.search(rf"InvalidConfig: data='.*head\.ckpt' {message}", err), err


def test_data_without_the_prompts_rows_is_refused(
    trained: tuple[list[str], Path, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A head's checkpoint (captured from the last prompt row on) is no data for a block
    drafter: refused naming it, before the model loads."""
    argv, out, _ = trained
    ckpt = str(out.with_suffix(".ckpt"))
    monkeypatch.setattr(specstrat.hf, "load", _unreachable)
    err = _refused([*_without_prompts(argv), "--kind", "block", "--data", ckpt], capsys)
    assert "captured without the prompt's rows" in err, err


def test_data_for_another_target_is_refused(
    draft_ckpt: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A --data checkpoint captured from another model is refused naming the flag, both
    targets and the fix."""
    other = _saved(tmp_path / "other", seed=5)
    argv = ["train", "--model", str(other), "--out", str(tmp_path / "b.safetensors")]
    err = _refused([*argv, "--kind", "block", "--data", str(draft_ckpt)], capsys)
    assert re.search(r"data='.*draft\.ckpt' was written for target .* drop --data", err), err


def test_self_written_prompts_are_recorded_in_the_source(
    model_dir: Path, prompts_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--self-written N has the target write N prompts before the others are generated, and the
    head's data source says so."""
    asked: list[int] = []

    def written(model: object, tokenizer: object, count: int, **kwargs: object) -> tuple[str, ...]:
        asked.append(count)
        return ("Why do rivers bend on their way to the sea?",)

    monkeypatch.setattr(specstrat.train.loop, "self_written_prompts", written)
    out = tmp_path / "head.safetensors"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(_argv(model_dir, out, prompts_file, "--self-written", "3")) == 0
    head = load_head(out, load(model_dir).target)
    assert asked == [3]
    assert head.data_source == written_source(str(prompts_file.resolve()), 1)
