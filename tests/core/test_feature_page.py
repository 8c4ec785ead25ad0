"""The page of every built-in on a real model is rendered from its bench document: a row per
built-in (the ones a run left out say so), the command rebuilt from the setup, and the committed
page equal to a fresh rendering of the committed JSON (it cannot drift from its data)."""

import json
import shlex
from pathlib import Path
from typing import Any

from specstrat.bench.feature_page import bench_command, main, render

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "algorithms-on-real-models.md"
DATA = ROOT / "docs" / "data" / "algorithms-on-real-models.json"
SETUP: dict[str, Any] = {
    "algorithms": ["NONE", "NGRAM", "STANDALONE"],
    "model": "/cache/SmolLM2-135M-Instruct.Q4_1.gguf (draft LM /x/draft.safetensors)",
    "workload": "spec-bench:q.jsonl",
    "requests_per_category": 1,
    "max_new_tokens": 32,
    "batch_sizes": [1, 8],
    "draft_tokens": [3, 4],
    "warmup": 0,
    "repeats": 1,
    "baseline": "hf",
}


def _row(algo: str, bs: int, d: int, tau: float, speedup: float, lossless: bool = True) -> Any:
    return {
        "algorithm": algo,
        "category": "overall",
        "batch_size": bs,
        "draft_tokens": d,
        "tau": tau,
        "speedup": speedup,
        "lossless": lossless,
    }


def test_a_synthetic_document_renders_every_builtin() -> None:
    """Each built-in gets a row; the best width per batch size is shown; a left-out built-in
    says "not run"; a lossy row is flagged; transformers' rows are listed under the table."""
    rows = [
        _row("NONE", 1, 0, 1.0, 1.0),
        _row("NGRAM", 1, 3, 1.4, 1.1),
        _row("NGRAM", 1, 4, 1.6, 1.2),
        _row("NGRAM", 8, 3, 1.3, 0.9),
        _row("STANDALONE", 1, 3, 1.5, 0.8, lossless=False),
        _row("hf-assisted", 1, 3, 1.5, 0.7),
        {**_row("NGRAM", 1, 3, 9.0, 9.0), "category": "qa"},
    ]
    page = render({"setup": SETUP, "environment": {"device": "cpu"}, "rows": rows})
    lines = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines()}
    assert "τ 1.60, 1.20x (D=4) | τ 1.30, 0.90x (D=3) | yes |" in lines["NGRAM"]
    assert lines["STANDALONE"].endswith("| **no** |")
    assert "| not run | not run | - |" in lines["DFLASH"]
    assert "the shipped block drafter" in lines["DSPARK"]
    assert "- `hf-assisted` D=3, batch size 1: τ 1.50, 0.70x target-only" in page


def test_the_command_is_rebuilt_from_the_setup() -> None:
    """The model path with its attached files becomes --model smollm2; NONE is implied."""
    words = shlex.split(bench_command(SETUP))
    assert words[:4] == ["specstrat", "bench", "--model", "smollm2"]
    assert words.count("--algo") == 2
    assert "--batch-size" in words
    assert words[words.index("--batch-size") + 1] == "1,8"
    assert words[-2:] == ["--baseline", "hf"]


def test_the_committed_page_is_its_documents_rendering(tmp_path: Path) -> None:
    """docs/algorithms-on-real-models.md equals a fresh rendering of the committed JSON (run
    `python -m specstrat.bench.feature_page` on it after a new bench run)."""
    out = tmp_path / "page.md"
    assert main([str(DATA), str(out)]) == 0
    assert out.read_text(encoding="utf-8") == PAGE.read_text(encoding="utf-8")
    assert json.loads(DATA.read_text(encoding="utf-8"))["setup"]["model"] != "embedded"


def test_usage_errors_exit_2() -> None:
    """Anything but two paths is a usage error."""
    assert main(["only-one"]) == 2


def test_a_compiled_run_rebuilds_its_compile_flag() -> None:
    """A document whose target ran compiled gives --compile with its counts; one that ran
    eager (``compile`` null) gives none."""
    words = shlex.split(bench_command({**SETUP, "compile": [1, 4]}))
    assert words[words.index("--compile") + 1] == "1,4"
    assert "--compile" not in shlex.split(bench_command({**SETUP, "compile": None}))
