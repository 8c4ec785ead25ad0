"""The ``specstrat bench`` subcommand: its flags, and the run from parsed flags to the printed
report, the JSON file and the plots (:mod:`specstrat.cli` dispatches here)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specstrat._adaptive import with_policy
from specstrat._compile_flag import add_compile_flag, compile_target, int_list
from specstrat._module_attr import not_a
from specstrat._outputs import STDOUT, check_dir, check_json, write_json
from specstrat.algorithm import SpecAlgorithm
from specstrat.drafting import SamplingParams
from specstrat.errors import InvalidConfig
from specstrat.models import LoadedModels

if TYPE_CHECKING:
    from specstrat.bench.run import BenchConfig

__all__ = [
    "Loader",
    "add_bench_parser",
    "bench_command",
]


Loader = Callable[[str, str], tuple[Any, Any]]


def _bench_algorithm(spec: str, load: Loader) -> SpecAlgorithm[Any] | str:
    """``--algo``: a registered name, or MODULE:ATTR imported from the current directory."""
    if ":" not in spec:
        return spec
    try:
        algo = load(spec, "bench")[0]
    except SystemExit as exc:  # _load's messages name the command; here they are InvalidConfig
        raise InvalidConfig(str(exc.code).removeprefix("specstrat bench: ")) from None
    if not isinstance(algo, SpecAlgorithm):
        raise InvalidConfig(not_a("--algo", spec, algo, "SpecAlgorithm", SpecAlgorithm))
    return algo


def _with_policies(
    algos: tuple[SpecAlgorithm[Any] | str, ...], args: argparse.Namespace, load: Loader
) -> tuple[SpecAlgorithm[Any] | str, ...]:
    """``--adaptive``: each algorithm under each policy named (``NGRAM_EMA``, ...)."""
    specs = getattr(args, "adaptive", None)
    if not specs:
        return algos
    return tuple(with_policy(a, spec, load, "bench") for a in algos for spec in specs)


def _bench_models(
    model: str,
    given: tuple[str | None, str | None, str | None],
    algos: Sequence[SpecAlgorithm[Any] | str],
) -> tuple[Any, str]:
    """The models ``--model`` names with the head, draft LM and block drafter
    :func:`~specstrat.train.trained_files` picks attached (``given``: ``--head``, ``--draft``
    and ``--block``, else the shipped ones an algorithm drafts with), and how the output names
    them."""
    if model == "embedded":
        for flag, file in zip(("--head", "--draft", "--block"), given, strict=True):
            if file is not None:
                raise InvalidConfig(
                    f"{flag} {file} was trained for a Hugging Face model; pass --model "
                    "smollm2 or --model PATH (the embedded models have their own drafters)"
                )
        from specstrat.runtime import EmbeddedModels

        return EmbeddedModels.load(), "embedded"
    from specstrat.hf import load
    from specstrat.hf.smollm2 import model_path
    from specstrat.train import attach_files, trained_files

    files = trained_files(model, *given, algos)
    path = model_path(model)
    print(f"loading {path} ...", file=sys.stderr)
    models = attach_files(load(path), *files)
    kinds = ("head", "draft LM", "block drafter")
    extra = [f"{kind} {file}" for kind, file in zip(kinds, files, strict=True) if file]
    return models, f"{path} ({', '.join(extra)})" if extra else str(path)


def bench_command(args: argparse.Namespace, load: Loader) -> int:
    """``specstrat bench``: the table on stdout, progress on stderr, JSON and plots on
    request; ``load``: the ``MODULE:ATTR`` importer ``check`` and ``demo`` use."""
    from tqdm import tqdm

    from specstrat.bench.report import render
    from specstrat.bench.run import BenchConfig, run_bench

    torch.set_num_threads(args.threads)
    config = BenchConfig(
        algorithms=_with_policies(tuple(_bench_algorithm(a, load) for a in args.algo), args, load),
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
    if args.profile and args.plot is not None:
        raise InvalidConfig("--profile draws no plots; drop --plot (or --profile)")
    json_path = None if args.json is None else check_json("--json", args.json)
    plot_dir = None if args.plot is None else check_dir("--plot", args.plot)
    if plot_dir is not None:
        from specstrat.bench.plots import _pyplot

        _pyplot()  # a missing matplotlib is refused before any run
    models, name = _bench_models(args.model, (args.head, args.draft, args.block), config.algorithms)
    compile_target(models, args.compile)
    if args.profile:
        return _profile(args, config, models, name, json_path)
    with tqdm(unit="run", file=sys.stderr, dynamic_ncols=True, leave=False) as bar:
        result = run_bench(
            config,
            models,
            model_name=name,
            progress=lambda line: bar.write(line, sys.stderr),
            bar=bar,
        )
    # The table and the JSON are out before any plot is drawn: a plotting failure loses neither.
    table = sys.stderr if args.json == STDOUT else sys.stdout
    print(render(result), file=table, flush=True)
    document = result.as_dict()
    if args.json is not None:
        write_json("--json", json_path, {**document, "plots": []})
    if plot_dir is not None:
        from specstrat.bench.plots import write_plots

        plots = [str(p) for p in write_plots(result, plot_dir)]
        print("\nplots:\n" + "\n".join(f"  {p}" for p in plots), file=table)
        if args.json is not None:
            write_json("--json", json_path, {**document, "plots": plots})
    if json_path is not None:
        print(f"wrote {args.json}", file=sys.stderr)
    failed = [r for r in result.rows if r.acceptance_rule_lossless and not r.lossless]
    return 1 if failed else 0


def _profile(
    args: argparse.Namespace,
    config: BenchConfig,
    models: LoadedModels,
    model_name: str,
    json_path: Path | None,
) -> int:
    """``--profile``: the step profile table (stdout, or stderr under ``--json -``), and the
    JSON with what ran (``setup``), the machine and each contender's parts."""
    from specstrat.bench.environment import environment
    from specstrat.bench.step_profile import profile_bench, profile_table

    profiles = profile_bench(config, models)
    table = sys.stderr if args.json == STDOUT else sys.stdout
    print(profile_table(profiles), file=table, flush=True)
    if args.json is not None:  # a file, or stdout for -
        setup = {
            "model": model_name,
            "workload": config.workload,
            "requests_per_category": config.requests,
            "max_new_tokens": config.max_new_tokens,
            "batch_size": config.batch_sizes[0],
            "draft_tokens": list(config.draft_tokens),
            "temperature": config.sampling.temperature,
        }
        document = {
            "setup": setup,
            "environment": environment(),
            "profile": [p.as_dict() for p in profiles],
        }
        write_json("--json", json_path, document)
    return 0


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


def add_bench_parser(
    sub: Any,
    positive: Callable[[str], int],
    sampling_and_tree: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The ``bench`` subcommand's flags (``positive`` and ``sampling_and_tree``: the demo's
    int type and its sampling and tree flags, shared)."""
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
        metavar="NAME|MODULE:ATTR",
        help="a registered name or your own SpecAlgorithm (MODULE:ATTR, imported from the "
        "current directory); repeat it to compare several (target-only, NONE, always runs)",
    )
    bench.add_argument(
        "--model",
        default="embedded",
        metavar="embedded|smollm2|PATH",
        help="the embedded byte models (default), SmolLM2-135M-Instruct, or a Hugging Face model "
        "directory or .gguf file",
    )
    bench.add_argument(
        "--head",
        metavar="FILE",
        help="a draft head trained for --model (specstrat train --out FILE.safetensors) for the "
        "EAGLE drafters (default: the head the package ships for --model, smollm2's)",
    )
    bench.add_argument(
        "--draft",
        metavar="FILE",
        help="a draft LM distilled from --model (specstrat train --kind draft-lm --out "
        "FILE.safetensors) for STANDALONE (default: the one the package ships for --model)",
    )
    bench.add_argument(
        "--block",
        metavar="FILE",
        help="a block drafter trained for --model (specstrat train --kind block --out "
        "FILE.safetensors) for DFLASH and DSPARK (default: the one the package ships)",
    )
    bench.add_argument(
        "--workload",
        default="code",
        metavar="code|spec-bench:PATH[:CATEGORY,...]",
        help="code (default: the code-editing prompts) or spec-bench:PATH[:CATEGORY,...] "
        "(Spec-Bench's question.jsonl; categories default to its six tasks)",
    )
    bench.add_argument(
        "--requests",
        type=positive,
        default=8,
        metavar="N",
        help="requests per category (default %(default)s)",
    )
    bench.add_argument(
        "--max-new-tokens",
        type=positive,
        default=64,
        metavar="N",
        help="tokens per request (default %(default)s)",
    )
    bench.add_argument(
        "--batch-size",
        type=int_list,
        default=(1,),
        metavar="B",
        help="max_running_requests: one value or a sweep such as 1,4,16 (default 1)",
    )
    bench.add_argument(
        "--draft-tokens",
        type=int_list,
        default=(4,),
        metavar="D",
        help="D, num_draft_tokens: one value or a sweep such as 2,4,8 (default 4)",
    )
    sampling_and_tree(bench)
    bench.add_argument(
        "--warmup", type=int, default=1, metavar="N", help="uncounted rounds (default %(default)s)"
    )
    bench.add_argument(
        "--repeats",
        type=positive,
        default=3,
        metavar="N",
        help="counted rounds (default %(default)s)",
    )
    bench.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="overlap mode (default off; the stage split is always measured in sync mode)",
    )
    bench.add_argument(
        "--context-len",
        type=positive,
        metavar="N",
        help="positions per request (default: 512 on the embedded models, else the longest "
        "prompt + max new tokens + what the widest contender's engine reserves past them, "
        "specstrat.runtime.kv_reservation)",
    )
    add_compile_flag(bench)
    bench.add_argument(
        "--threads",
        type=positive,
        default=1,
        metavar="N",
        help="torch threads (default %(default)s)",
    )
    bench.add_argument(
        "--request-rate",
        type=_rate,
        metavar="R",
        help="requests per second, Poisson arrivals with seed 0 (default: all arrive at once)",
    )
    bench.add_argument(
        "--baseline",
        choices=("hf",),
        help="hf: add transformers' generate (hf-generate, in static left-padded batches of the "
        "batch size), its prompt lookup (hf-prompt-lookup, prompt_lookup_num_tokens = D - 1) "
        "and, when an algorithm runs the draft LM, its assisted generation with it "
        "(hf-assisted, D - 1 drafts a step), both at batch size 1 only, the only size "
        "transformers supports",
    )
    bench.add_argument(
        "--force-accept",
        type=_fraction,
        metavar="R",
        help="replace every algorithm's acceptance rule by ForcedAcceptance(rate=R): accept each "
        "draft position with probability R given the earlier ones (lossy; stop tokens off), to "
        "measure the system apart from the drafter (docs/bench.md)",
    )
    bench.add_argument(
        "--json",
        metavar="FILE",
        help="write the result as JSON to FILE, or to stdout with - (the table then goes to "
        "stderr); checked before any run",
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="instead of timing runs side by side, split each algorithm's decode steps (at the "
        "first batch size, on the first category) into scheduler, drafter, acceptance, metadata "
        "and the forward's matmuls, attention and adapter (torch.profiler; docs/bench.md)",
    )
    bench.add_argument(
        "--plot",
        metavar="DIR",
        help="write PNG plots into DIR (needs matplotlib: pip install 'specstrat[bench]'; "
        "checked before any run, drawn after the JSON is written)",
    )
