"""The ``specstrat train`` subcommand: the run from parsed flags to the head file,
its checkpoint and the printed summary (:mod:`specstrat.cli` dispatches here; the flags are
:mod:`specstrat.train.train_flags`).

Every flag is checked before the model loads: the numbers by argparse, the config by
:class:`~specstrat.train.HeadConfig`, ``--out`` (a ``.safetensors`` path in a writable
directory), ``--prompts`` (each line named when it is bad) and ``--resume`` (a checkpoint
written with this config and these prompts); the target's weights are checked against
``--resume`` and ``--layers`` against its layers right after it loads, before any generation.
"""

from __future__ import annotations

import argparse
import sys
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
from specstrat.train.head_config import HeadConfig, head_intermediate_size
from specstrat.train.loop import train_head
from specstrat.train.prompts import default_prompts, read_prompts

__all__ = ["DEFAULT_SOURCE", "checkpoint_path", "train_command"]

#: The ``data_source`` of a head trained on :func:`~specstrat.train.default_prompts`.
DEFAULT_SOURCE = "default pool (specstrat.train.default_prompts)"
_DEFAULTS = HeadConfig()


def checkpoint_path(out: Path) -> Path:
    """Where a run writing the head ``out`` keeps its checkpoint: ``out`` with ``.ckpt`` for
    ``.safetensors`` (``head.safetensors`` -> ``head.ckpt``)."""
    return out.with_suffix(".ckpt")


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
        self_written=args.self_written,
        intermediate_size=args.intermediate_size,
        **({} if args.init is None else {"init": args.init}),
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
    head_intermediate_size(models.target.model.config, config.intermediate_size)  # before work
    if args.prompts is None and captured is None:  # the pool adapts to a short-context model
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
        own = config.self_written
        if own:
            print(f"the target writes {own} prompts of its own ...", file=sys.stderr)
        more = " and those it writes" if own else ""
        print(
            f"generating the target's responses to {len(prompts)} prompts{more} ...",
            file=sys.stderr,
        )
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
            config, models.target, models.tokenizer, prompts, captured=captured, **run
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
    (which brings its own data) or beside prompts (the checkpoint's are the data's)."""
    why = (
        "--resume brings its own data"
        if args.resume is not None
        else "the checkpoint's prompts are the data's"
        if args.prompts is not None or args.self_written
        else None
    )
    if why is not None:
        raise InvalidConfig(
            f"--data {args.data} cannot be used here ({why}); drop --data, or use it with "
            "none of --resume, --prompts or --self-written"
        )
    captured = read_checkpoint(args.data)
    if config.kind != "eagle3":  # a head's data is checked against its layers at load
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
        *([("started from", trained.start)] if isinstance(trained, TrainedHead) else []),
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
