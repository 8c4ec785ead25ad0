"""``specstrat bench`` end to end on the embedded models, kept tiny: the Python function, the
JSON schema (pinned against docs/bench.md), forced acceptance 0 and 1, Spec-Bench's table, the
CLI's acceptance command and its refusals of bad input (exit 2, the value named)."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from specstrat import EAGLE, NGRAM, SamplingParams
from specstrat.bench.run import BenchConfig, BenchResult, run_bench
from specstrat.cli import main
from specstrat.errors import InvalidConfig
from specstrat.runtime import EmbeddedModels
from tests.conftest import SPEC_BENCH, needs_spec_bench
from tests.typing.readme_drafter import BIGRAM

ROOT = Path(__file__).resolve().parents[2]
#: What every result row holds, in this order (docs/bench.md's schema table lists the same).
ROW_KEYS = [
    "algorithm",
    "category",
    "batch_size",
    "draft_tokens",
    "requests",
    "tokens",
    "rounds",
    "seconds",
    "tokens_per_s",
    "speedup",
    "speedup_range",
    "tau",
    "acceptance_by_position",
    "acceptance_conditional",
    "accepted_histogram",
    "verified_per_step",
    "ttft_ms",
    "tpot_ms",
    "step_split_ms",
    "lossless",
    "lossless_check",
    "ties",
    "acceptance_rule_lossless",
    "width_histogram",
    "widths",
    "plain_step_share",
    "weight_bytes_per_token",
    "roofline_tokens_per_s",
    "roofline_fraction",
    "decode_roofline_fraction",
    "roofline_bound",
    "speedup_ceiling",
    "noisy",
    "noisy_reason",
]
TINY: dict[str, Any] = {"requests": 2, "max_new_tokens": 12, "repeats": 1, "warmup": 0}


@pytest.fixture(scope="module")
def models() -> EmbeddedModels:
    """The embedded models."""
    return EmbeddedModels.load()


@pytest.fixture(scope="module")
def result(models: EmbeddedModels) -> BenchResult:
    """NGRAM and the README's bigram drafter on two code prompts, two counted rounds."""
    config = BenchConfig(algorithms=(NGRAM, BIGRAM), **{**TINY, "repeats": 2})
    return run_bench(config, models)


def test_rows_hold_every_key_with_the_documented_shapes(result: BenchResult) -> None:
    """Each row (target-only too) has exactly the schema's keys: numbers, lists indexed by
    position with None where unobserved, the histogram keyed by the number proposed."""
    assert [r.algorithm for r in result.rows] == ["NONE", "NGRAM", "BIGRAM"]
    for row in result.rows:
        data = json.loads(json.dumps(row.as_dict()))
        assert list(data) == ROW_KEYS
        for key in ("tau", "tokens_per_s", "speedup"):
            assert isinstance(data[key], float)
        assert set(data["ttft_ms"]) == set(data["tpot_ms"]) == {"median", "p90"}
        for proposed, counts in data["accepted_histogram"].items():
            assert len(counts) == int(proposed) + 1
        assert all(v is None or 0 <= v <= 1 for v in data["acceptance_conditional"])
        assert data["lossless"] is True
    none = result.rows[0]
    assert (none.tau, none.speedup, none.lossless, none.verified_per_step) == (1.0, 1.0, True, 1.0)
    assert none.acceptance_by_position == []
    assert result.rows[2].tau > 1.0
    assert all(r.rounds == 2 and r.step_split_ms is not None for r in result.rows)


def test_the_docs_schema_lists_exactly_the_row_keys() -> None:
    """docs/bench.md's row table names every key of a row, in order, and nothing else."""
    text = (ROOT / "docs" / "bench.md").read_text()
    section = text.split("## Result rows", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", section, flags=re.MULTILINE)
    assert documented == ROW_KEYS
    assert "github.com/hemingkx/Spec-Bench" in text


def test_environment_and_setup_are_recorded(result: BenchResult) -> None:
    """The JSON records versions, threads, date, load average and every sampling parameter."""
    doc = result.as_dict()
    env = doc["environment"]
    for key in ("specstrat", "torch", "transformers", "torch_threads", "git_commit", "date"):
        assert key in env
    assert len(env["load_average"]) == 3
    for key in ("temperature", "top_p", "top_k", "seed", "batch_sizes", "draft_tokens"):
        assert key in doc["setup"]
    assert "before any cut" in doc["formulas"]["tau"]


@pytest.mark.parametrize(
    ("rate", "tau", "conditional"), [(0.0, 1.0, [0.0, None, None]), (1.0, 4.0, [1.0, 1.0, 1.0])]
)
def test_forced_acceptance_gives_tau_exactly(
    models: EmbeddedModels, rate: float, tau: float, conditional: list[float | None]
) -> None:
    """--force-accept 0: tau 1 and positions past the first never reached (None); 1.0: tau
    k + 1 = D; every request generates exactly max_new_tokens; lossy and marked so."""
    config = BenchConfig(algorithms=(EAGLE,), force_accept=rate, **TINY)
    forced = run_bench(config, models).rows[1]
    assert forced.tau == tau
    assert forced.acceptance_conditional == conditional
    assert forced.tokens == 2 * 12
    assert (forced.lossless, forced.acceptance_rule_lossless) == (False, False)


@needs_spec_bench
def test_spec_bench_on_the_byte_models_prints_its_table(
    models: EmbeddedModels, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two Spec-Bench categories: a row each plus the overall row, Spec-Bench's table with
    speedup and tau per cell, the byte encoding said in the output."""
    workload = f"spec-bench:{SPEC_BENCH}:qa,translation"
    args = [
        "bench",
        "--algo",
        "NGRAM",
        "--workload",
        workload,
        "--requests",
        "1",
        "--max-new-tokens",
        "8",
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "byte-encoded, no chat template, left-truncated" in out
    table = out.split("batch size 1, D=4: speedup over target-only / tau", 1)[1]
    assert re.search(r"^qa\s+\d+\.\d\dx / \d\.\d\d", table, flags=re.MULTILINE)
    assert re.search(r"^overall\s+\d+\.\d\dx / \d\.\d\d", table, flags=re.MULTILINE)


def test_the_acceptance_command_reduced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command with fewer requests and tokens: the table, JSON with every key for
    each algorithm and target-only, and the two PNGs, listed in the summary."""
    out_json, plots = tmp_path / "out.json", tmp_path / "plots"
    args = [
        "bench",
        "--algo",
        "NGRAM",
        "--algo",
        "tests.typing.readme_drafter:BIGRAM",
        "--model",
        "embedded",
        "--workload",
        "code",
        "--requests",
        "2",
        "--max-new-tokens",
        "8",
        "--repeats",
        "2",
        "--warmup",
        "0",
        "--json",
        str(out_json),
        "--plot",
        str(plots),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "speedup (range)" in out
    doc: dict[str, Any] = json.loads(out_json.read_text())
    assert [r["algorithm"] for r in doc["rows"]] == ["NONE", "NGRAM", "BIGRAM"]
    assert all(list(r) == ROW_KEYS for r in doc["rows"])
    for name in ("acceptance_by_position.png", "speedup.png", "roofline.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(plots / name) in out
        assert str(plots / name) in doc["plots"]


def test_a_sweep_writes_its_plot(models: EmbeddedModels, tmp_path: Path) -> None:
    """A draft-width sweep gives a row per width and the tau/speedup-against-width plot."""
    from specstrat.bench.plots import write_plots

    config = BenchConfig(algorithms=(NGRAM,), draft_tokens=(2, 3), **TINY)
    swept = run_bench(config, models)
    assert [r.draft_tokens for r in swept.rows] == [0, 2, 3]
    names = [p.name for p in write_plots(swept, tmp_path)]
    assert "tau_speedup_vs_draft_tokens.png" in names
    assert "draft_width_over_time.png" in names  # D per step, fixed here
    assert swept.rows[2].width_histogram == {"3": len(swept.rows[2].widths)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "MEDUSA"], r"MEDUSA"),
        (["--algo", "specstrat.builtins:MEDUSA"], r"has no attribute 'MEDUSA'"),
        (["--algo", "specstrat:__version__"], r"is a str, not a SpecAlgorithm"),
        (["--algo", "NGRAM", "--workload", "chat"], r"workload='chat' is not a workload"),
        (
            ["--algo", "NGRAM", "--workload", "spec-bench:/no/such.jsonl"],
            r"spec-bench path /no/such.jsonl: No such file.*Spec-Bench",
        ),
        pytest.param(
            ["--algo", "NGRAM", "--workload", f"spec-bench:{SPEC_BENCH}:poetry"],
            r"category 'poetry' is not in .*pick from",
            marks=needs_spec_bench,
        ),
        (["--algo", "NGRAM", "--baseline", "hf"], r"baseline_hf=True needs a Hugging Face model"),
        (["--algo", "NGRAM", "--algo", "NGRAM"], r"pass distinct algorithms"),
        (
            ["--algo", "NGRAM", "--adaptive", "sometimes"],
            r"--adaptive 'sometimes' is not one of fixed, ema, schedule, goodput or MODULE:ATTR",
        ),
        (
            ["--algo", "NGRAM", "--adaptive", "specstrat:__version__"],
            r"--adaptive 'specstrat:__version__' is a str, not a SpeculationPolicy",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_value(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown algorithm, a bad workload, a missing Spec-Bench file, an unknown category or
    a baseline the model cannot run: one stderr line naming it, exit 2, no traceback."""
    assert main(["bench", *args, "--requests", "1", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err)
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0,x"], r"--batch-size: '0,x' is not an int >= 1 or a comma-separated"),
        (["--draft-tokens", "4,0"], r"--draft-tokens: '4,0' is not an int >= 1"),
        (["--force-accept", "2"], r"--force-accept: '2' is not a number in \[0, 1\]"),
        (["--request-rate", "0"], r"--request-rate: '0' is not a number > 0"),
    ],
)
def test_bad_sweeps_and_rates_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad sweep or rate is argparse's usage error (exit 2) naming the value and the form."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--algo", "NGRAM", *args])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_bad_configs_are_refused_by_name() -> None:
    """BenchConfig checks its values eagerly, naming each."""
    with pytest.raises(InvalidConfig, match=r"batch_sizes=\(\) must be a non-empty tuple"):
        BenchConfig(algorithms=(NGRAM,), batch_sizes=())
    with pytest.raises(InvalidConfig, match=r"warmup=-1 must be an int >= 0"):
        BenchConfig(algorithms=(NGRAM,), warmup=-1)
    with pytest.raises(InvalidConfig, match=r"request_rate=0 must be a number > 0"):
        BenchConfig(algorithms=(NGRAM,), request_rate=0)
    with pytest.raises(InvalidConfig, match=r"rate=3 must be a number in \[0, 1\]"):
        BenchConfig(algorithms=(NGRAM,), force_accept=3)
    with pytest.raises(InvalidConfig, match=r"baseline_hf=True with temperature=0.7"):
        BenchConfig(algorithms=(NGRAM,), baseline_hf=True, sampling=SamplingParams(temperature=0.7))


def test_requests_can_arrive_at_a_rate(models: EmbeddedModels) -> None:
    """With a request rate the requests arrive over time and TTFT is measured from each one's
    arrival; outputs stay lossless."""
    config = BenchConfig(algorithms=(NGRAM,), request_rate=50.0, **TINY)
    rows = run_bench(config, models).rows
    assert all(r.lossless for r in rows)
    assert rows[0].ttft_ms["median"] is not None
