"""Train an EAGLE-3-style head for a Hugging Face causal LM on a CPU budget, and measure it.

:func:`train_head` generates the target's own responses to the prompts, capturing the fused
layers' features while it generates (one :class:`~specstrat.train.GenerationCapturer`), picks the
draft vocabulary from the tokens the target produced, and trains a fresh
:class:`~specstrat.train.Eagle3Head` with training-time test (TTT): the head is unrolled over
its own hidden states for ``ttt_steps`` steps, step ``i`` fed the sequence's next token and
weighted ``0.8 ** i``, each step a soft cross-entropy against the target's next-token
distribution restricted to the draft vocabulary. AdamW, a linear warm-up then cosine learning
rate, gradient-norm clipping, everything seeded. A held-out share of the prompts is generated
greedily and measured with :func:`~specstrat.train.evaluate` (the file's ``tau`` and
acceptance by position). A run can write a :class:`~specstrat.train.Checkpoint` after each
epoch and resume from one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specstrat.errors import InvalidConfig
from specstrat.train._ttt import batch_of, ttt_loss
from specstrat.train.agreement import evaluate
from specstrat.train.artifact import TrainedHead, target_name, target_sha256, trained_fields
from specstrat.train.capture import (
    CapturedData,
    CapturedSequence,
    Generation,
    check_layers,
    default_layers,
    draft_data,
    draft_vocab,
    raw_model,
    target_vocab,
    token_counts,
)
from specstrat.train.checkpoint import Checkpoint, save_checkpoint
from specstrat.train.eagle3 import Eagle3Head
from specstrat.train.fit import FitState, fit
from specstrat.train.generation import GenerationCapturer, fitting_prompts
from specstrat.train.head_config import HeadConfig, head_intermediate_size
from specstrat.train.head_init import start_from_target
from specstrat.train.prompts import interleave
from specstrat.train.self_written import self_written_prompts, written_source

__all__ = ["TrainingRun", "check_head_data", "collect", "train_head"]

#: Prompts generated (as one engine batch) and captured between two checks of the budget.
_GENERATE_BATCH = 64


def _split(prompts: Sequence[str], share: float) -> tuple[list[str], list[str]]:
    """Train and held-out prompts: the last ``round(share * n)`` (at least one when ``share``
    is above zero and there are two prompts or more) are held out."""
    n = len(prompts)
    held = 0 if share == 0 or n < 2 else min(n - 1, max(1, round(share * n)))
    return list(prompts[: n - held]), list(prompts[n - held :])


def train_head(
    config: HeadConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    progress: bool = True,
    source: str = "prompts",
    command: str = "",
    checkpoint: str | os.PathLike[str] | None = None,
    resume: Checkpoint | None = None,
    captured: Checkpoint | None = None,
) -> TrainedHead:
    """A head trained for ``model`` (a transformers causal LM, or an
    :class:`~specstrat.hf.HFCausalLM`) on its own responses to ``prompts`` (see the module
    docstring); ``source`` and ``command`` are recorded in the result. ``progress``: a tqdm bar
    showing the loss and each unrolled step's accuracy. ``checkpoint``: a file to write the
    run's :class:`~specstrat.train.Checkpoint` to after each epoch; ``resume``: a checkpoint to
    continue from (its data is used, ``prompts`` are not generated again), refused for another
    target or a config that differs where it matters, before any work. ``captured``: a
    checkpoint whose data to train on instead of generating (its layers, draft vocabulary and
    context rows must be this config's: :func:`check_head_data`), so heads that differ in
    training settings (TTT steps, learning rate, batch, epochs) or MLP width alone compare on
    the same data."""
    from tqdm.auto import tqdm

    if config.kind != "eagle3":
        raise InvalidConfig(
            f"HeadConfig.kind={config.kind!r}; train_head trains kind='eagle3' (a draft LM: "
            "train_draft_lm, a block drafter: train_block_lm)"
        )
    if isinstance(prompts, str) or not prompts:
        raise InvalidConfig(f"prompts={prompts!r}; pass a non-empty sequence of prompt strings")
    if resume is not None:
        resume.check_resumes(config, source)
    start = time.monotonic()
    budget = config.budget_seconds
    deadline = None if budget is None else start + budget
    with raw_model(model) as lm:
        head_intermediate_size(lm.config, config.intermediate_size)  # refused before any work
        name, digest = target_name(model), target_sha256(lm)
    if resume is not None:
        resume.check_target(name, digest)
        data, held = resume.data, resume.held
    elif captured is not None:
        captured.check_target(name, digest, "data")
        with raw_model(model) as lm:
            check_head_data(captured, config, int(lm.config.num_hidden_layers))
        data, held = captured.data, captured.held
    else:  # outside raw_model: an HFCausalLM generates through the engine's own attention
        data, held = collect(config, model, tokenizer, prompts, source, start, progress and tqdm)
    with raw_model(model) as lm, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        head = Eagle3Head.from_target(
            lm,
            layers=data.layers,
            d2t=data.d2t,
            context=config.context,
            intermediate_size=config.intermediate_size,
        )
        began = start_from_target(head, lm) if config.init == "target" else "random"
        order_gen = torch.Generator().manual_seed(config.seed)
    state = TrainingRun(config, name, digest, data, held, checkpoint, resume)
    steps, loss = _fit(head, state, deadline, order_gen, progress and tqdm)
    agreement = evaluate(head, held, depth=config.eval_depth) if held.sequences else None
    facts = trained_fields(
        (name, digest), (data.positions, data.source), (steps, loss), agreement, command
    )
    return TrainedHead(head=head, start=began, **facts)


def check_head_data(captured: Checkpoint, config: HeadConfig, num_layers: int) -> None:
    """Refuses (:class:`~specstrat.errors.InvalidConfig`) a checkpoint's data that a head of
    ``config`` cannot train on: features of other layers, another draft vocabulary size, or
    prompt rows captured (or not) other than ``config.context`` reads them."""
    layers = config.layers if config.layers is not None else default_layers(num_layers)
    data, where = captured.data, f"data={captured.file!r}"
    has_context = any(s.context for s in data.sequences)
    if tuple(layers) != tuple(data.layers):
        raise InvalidConfig(
            f"{where} holds the features of layers {list(data.layers)}, not {list(layers)}; pass "
            f"--layers={','.join(map(str, data.layers))}, or drop --data to capture these"
        )
    if config.draft_vocab != data.d2t.numel():
        raise InvalidConfig(
            f"{where} holds a draft vocabulary of {data.d2t.numel()} tokens, not "
            f"{config.draft_vocab}; pass --draft-vocab {data.d2t.numel()}, or drop --data"
        )
    if config.context != has_context:
        flag = "--context" if has_context else "--no-context"
        raise InvalidConfig(
            f"{where} holds generations captured {'with' if has_context else 'without'} the "
            f"prompt's rows; pass {flag} to train on them, or drop --data"
        )


def collect(
    config: HeadConfig,
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    source: str,
    start: float,
    bar: Any,
) -> tuple[CapturedData, CapturedData]:
    """The training and held-out data for ``config`` from ``model``'s responses to
    ``prompts`` (``start``: the run's ``time.monotonic()`` start, which the budget counts from):
    captured a batch of prompts at a time, in the passes :func:`_passes` gives (generation and
    capture stop at half the budget; when that cuts the first pass short, the held-out prompts
    keep their share of what was generated); ``bar``: a tqdm to show it in, or falsy. With
    ``config.self_written``, the prompts the target writes (those not among ``prompts``) are
    split the same way and answered first, one for one with ``prompts``; ``source`` then
    records how many it wrote (:func:`~specstrat.train.self_written.written_source`)."""
    budget = config.budget_seconds
    data_deadline = None if budget is None else start + budget / 2
    train_prompts, held_prompts = _split(prompts, config.held_out)
    if config.self_written:
        given = set(prompts)
        own = [p for p in _self_written(config, model, tokenizer, start) if p not in given]
        if bar:
            bar.write(f"the target wrote {len(own)} prompts ({config.self_written} asked)")
        source = written_source(source, len(own))
        own_train, own_held = _split(own, config.held_out)
        mixed = len(own_train)  # one for one while they last, so they are answered first
        train_prompts = [*interleave(own_train, train_prompts[:mixed]), *train_prompts[mixed:]]
        held_prompts = list(interleave(held_prompts, own_held))
    with raw_model(model) as lm:
        num_layers = int(lm.config.num_hidden_layers)
        vocab = target_vocab(lm, tokenizer)
    layers = config.layers if config.layers is not None else default_layers(num_layers)
    check_layers(layers, num_layers)
    capturer = GenerationCapturer(  # sized and reserved once, for every prompt it will see
        model,
        tokenizer,
        [*train_prompts, *held_prompts],
        layers=layers,
        max_new_tokens=config.max_new_tokens,
        batch=_GENERATE_BATCH,
        prompt_rows=config.context,
    )
    gens: list[Generation] = []
    sequences: list[CapturedSequence] = []
    positions = 0
    pbar = bar(total=len(train_prompts), desc="generate", unit="prompt") if bar else None
    for temperature, seed, first in _passes(config, len(train_prompts)):
        if data_deadline is not None and time.monotonic() > data_deadline:
            break
        if pbar is not None and first == 0 and gens:  # a further pass over the prompts
            pbar.total += len(train_prompts)
        chunk, captured = capturer.capture(
            train_prompts[first : first + _GENERATE_BATCH], temperature=temperature, seed=seed
        )
        gens += chunk
        sequences += captured
        positions += sum(int(s.tokens.numel()) - s.context for s in captured)
        if pbar is not None:
            pbar.update(len(chunk))
            pbar.set_postfix_str(f"{positions} positions")
    if pbar is not None:
        pbar.close()
    if not gens:
        raise InvalidConfig(
            f"budget_seconds={config.budget_seconds} ended before one response was "
            "generated; raise the budget or lower max_new_tokens"
        )
    if len(gens) < len(train_prompts) and held_prompts:  # the budget cut generation short
        share = config.held_out / (1.0 - config.held_out)
        held_prompts = held_prompts[: max(1, round(len(gens) * share))]
    d2t = draft_vocab(token_counts(gens, vocab), min(config.draft_vocab, vocab))
    _, held_rows = capturer.capture(held_prompts)
    del capturer  # its KV cache is not needed while the head trains
    data = draft_data(model, sequences, layers=layers, d2t=d2t, source=source)
    held = draft_data(model, held_rows, layers=layers, d2t=d2t, source=source)
    return data, held


def _self_written(config: HeadConfig, model: Any, tokenizer: Any, start: float) -> tuple[str, ...]:
    """``config.self_written`` prompts the target writes itself
    (:func:`~specstrat.train.self_written_prompts`, seeded with ``config.seed``, sampled at
    ``repeat_temperature`` or 1.0, written by the first quarter of the budget), those too long
    for the model's positions dropped."""
    budget = config.budget_seconds
    own = self_written_prompts(
        model,
        tokenizer,
        config.self_written,
        seed=config.seed,
        temperature=max(config.temperature, config.repeat_temperature) or 1.0,
        deadline=None if budget is None else start + budget / 4,
    )
    return fitting_prompts(model, tokenizer, own, config.max_new_tokens)


def _passes(config: HeadConfig, prompts: int) -> Iterator[tuple[float, int, int]]:
    """(temperature, seed, first prompt) of each batch to generate: one pass over the prompts
    at ``config.temperature``, then, with a budget (its deadline ends them), endless further
    passes at ``max(temperature, repeat_temperature)``, each pass seeded after the last. A
    greedy run with ``repeat_temperature=0`` makes one pass: another would repeat it."""
    again = max(config.temperature, config.repeat_temperature)
    passes = itertools.count() if config.budget_seconds is not None and again > 0 else range(1)
    for n in passes:
        temperature = config.temperature if n == 0 else again
        for first in range(0, prompts, _GENERATE_BATCH):
            yield temperature, config.seed + n * prompts + first, first


@dataclass(frozen=True, slots=True)
class TrainingRun:
    """What a training run's fit needs beside the model it trains (a head's or a draft LM's):
    the run's facts for its checkpoints, and the checkpoint it resumes from."""

    config: HeadConfig
    target: str
    digest: str
    data: CapturedData
    held: CapturedData
    path: str | os.PathLike[str] | None
    resume: Checkpoint | None

    def save(self, head: torch.nn.Module, opt: Any, order: torch.Generator, at: FitState) -> None:
        """The run after ``at``'s epochs, at the checkpoint path (nothing without one);
        ``head``'s trainable tensors (a draft LM's: its layers and norm) are what it keeps."""
        if self.path is None:
            return
        trainable = getattr(head, "trainable", None)
        weights = trainable() if callable(trainable) else head.state_dict()
        save_checkpoint(
            self.path,
            Checkpoint(
                config=json.loads(json.dumps(dataclasses.asdict(self.config))),
                target=self.target,
                target_sha256=self.digest,
                data=self.data,
                held=self.held,
                head={k: v.detach().clone() for k, v in weights.items()},
                optimizer=opt.state_dict(),
                order=order.get_state(),
                epoch=at.epoch,
                step=at.step,
                recent=tuple(at.recent),
            ),
        )


def _fit(
    head: Eagle3Head,
    state: TrainingRun,
    deadline: float | None,
    order: torch.Generator,
    bar: Any,
) -> tuple[int, float]:
    """:func:`~specstrat.train.fit.fit` of the head with training-time test; (steps, final
    loss), the loss an average of the last steps'."""
    config, data = state.config, state.data
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)
    seqs = [s for s in data.sequences if s.tokens.numel() >= s.context + 2]
    at = FitState()
    if state.resume is not None:
        head.load_state_dict(state.resume.head)
        opt.load_state_dict(state.resume.optimizer)
        order.set_state(state.resume.order)
        resume = state.resume
        at = FitState(resume.epoch, resume.step, list(resume.recent))

    def loss_of(picked: list[int]) -> tuple[torch.Tensor, str]:
        batch = batch_of(data, [seqs[i] for i in picked])
        loss, accuracy = ttt_loss(head, batch, config.ttt_steps, config.context)
        return loss, "acc " + " ".join(f"{a:.2f}" for a in accuracy)

    fit(
        head,
        opt,
        params,
        loss_of,
        count=len(seqs),
        config=config,
        state=at,
        order=order,
        deadline=deadline,
        save=lambda done: state.save(head, opt, order, done),
        bar=bar,
        desc="train head",
    )
    return at.step, at.loss
