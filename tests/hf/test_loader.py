"""specstrat.hf.load: a saved model directory round-trips into the engine; a hub id, a missing
or wrong path, missing weights or tokenizer files, a model on meta and an unsupported config
are refused by name; the conversion cache directory follows the environment."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from specstrat import ModelLoadError, ModelSet
from specstrat.hf import HFModels, cache_dir, compare, generate_reference, load
from specstrat.runtime import Engine, EngineConfig
from tests.hf import tiny
from tests.hf.conftest import TEXT


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny llama directory (config, weights, tokenizer with its chat template)."""
    return tiny.save("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def loaded(saved: Path) -> HFModels:
    """The saved directory, loaded."""
    return load(saved)


def test_a_saved_directory_loads_with_the_tokenizers_vocabulary_and_eos(
    loaded: HFModels, saved: Path
) -> None:
    """load() sizes the model to the tokenizer (384 ids under a 400-wide head), takes the EOS
    id from the tokenizer and generation config, and names the model after its directory."""
    assert len(loaded.tokenizer) == tiny.VOCAB
    assert loaded.target.shape.vocab_size == tiny.VOCAB
    assert loaded.target.head_width == tiny.VOCAB + 16
    assert loaded.eos_token_ids == frozenset({0})
    assert (loaded.source, loaded.target.name) == (str(saved), "tiny-llama")
    assert not loaded.target.model.training


def test_a_loaded_model_runs_losslessly_from_text(loaded: HFModels) -> None:
    """Requests built from text run through NGRAM and equal transformers' generate."""
    requests = [
        loaded.request("a", 12, text=TEXT[:40]),
        loaded.request("b", 8, text=TEXT[40:], stop_at_eos=False),
    ]
    outputs = Engine("NGRAM", ModelSet(target=loaded.target), EngineConfig(context_len=96)).run(
        requests
    )
    check = compare(loaded.target, requests, outputs, generate_reference(loaded.target, requests))
    assert check.lossless, check.line()


def test_every_eos_id_of_the_generation_config_ends_a_request(tmp_path: Path) -> None:
    """A generation config with several EOS ids (as chat models ship) adds each to the
    tokenizer's EOS in eos_token_ids, so a request built from text stops at any of them."""
    directory = tiny.save("llama", tmp_path / "multi-eos")
    config = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(
        json.dumps({**config, "eos_token_id": [5, 7]})
    )
    models = load(directory)
    assert models.eos_token_ids == frozenset({0, 5, 7})
    assert models.request("r", 4, text="x").stop_token_ids == frozenset({0, 5, 7})


def test_bfloat16_on_the_cpu_runs(saved: Path) -> None:
    """dtype=torch.bfloat16 loads bfloat16 weights and the engine runs on them (the KV cache takes
    the parameters' dtype), producing tokenizer ids."""
    models = load(saved, dtype=torch.bfloat16)
    assert next(models.target.parameters()).dtype == torch.bfloat16
    request = models.request("r", 10, text=TEXT[:30], stop_at_eos=False)
    out = Engine("NGRAM", ModelSet(target=models.target), EngineConfig(context_len=64)).run(
        [request]
    )
    assert len(out["r"]) == 10
    assert all(0 <= t < tiny.VOCAB for t in out["r"])


def _without_tokenizer(directory: Path, out: Path) -> Path:
    """A copy of ``directory``'s config and weights, without its tokenizer files."""
    out.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (out / name).write_bytes((directory / name).read_bytes())
    return out


def _no_tokenizer(saved: Path, tmp: Path) -> Path:
    """The saved llama directory without its tokenizer files (transformers fails to build one)."""
    return _without_tokenizer(saved, tmp / "no-tokenizer")


def _qwen2_no_tokenizer(saved: Path, tmp: Path) -> Path:
    """A qwen2 directory without tokenizer files (transformers builds one of 1 special token)."""
    return _without_tokenizer(tiny.save("qwen2", tmp / "qwen2"), tmp / "qwen2-no-tokenizer")


def _no_weights(saved: Path, tmp: Path) -> Path:
    """A copy of the saved directory without its weights."""
    out = tmp / "no-weights"
    out.mkdir()
    for f in saved.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _unsupported(saved: Path, tmp: Path) -> Path:
    """A tiny llama saved with attention_chunk_size=4 (chunked attention, not supported)."""
    return tiny.save_model(tiny.model("llama", attention_chunk_size=4), tmp / "chunked")


def _written(name: str, content: str) -> Callable[[Path, Path], Path]:
    def make(saved: Path, tmp: Path) -> Path:
        (tmp / name).write_text(content)
        return tmp / name

    return make


REFUSALS: list[tuple[str, Callable[[Path, Path], Any], str]] = [
    (
        "hub-id",
        lambda s, t: "HuggingFaceTB/SmolLM2-135M",
        r"model='HuggingFaceTB/SmolLM2-135M': no such path; if it is a hub id: this machine "
        r"loads local files only: download the model directory",
    ),
    ("missing", lambda s, t: t / "nowhere", r"model='.*nowhere': no such file or directory"),
    ("empty-dir", lambda s, t: t, r"model='.*' has no config\.json; pass a Hugging Face model dir"),
    ("not-gguf", _written("weights.bin", "x"), r"weights\.bin' is a file but not a \.gguf"),
    (
        "bad-gguf",
        _written("bad.gguf", "x"),
        r"model='.*bad\.gguf' does not start with the GGUF magic bytes \(found b'x'\); it is not",
    ),
    (
        "no-weights",
        _no_weights,
        r"no-weights' cannot be loaded: .*no file named model\.safetensors",
    ),
    (
        "no-tokenizer",
        _no_tokenizer,
        r"no-tokenizer' cannot be loaded: .*; the directory lacks the tokenizer files \(tokenizer",
    ),
    (
        "qwen2-no-tokenizer",
        _qwen2_no_tokenizer,
        r"no-tokenizer': its tokenizer has only 1 id\(s\), its special tokens; the directory lacks "
        r"the tokenizer files",
    ),
    (
        "chunked",
        _unsupported,
        r"chunked: config\.attention_chunk_size=4 is not supported \(specstrat's attention has no "
        r"chunked",
    ),
]


@pytest.mark.parametrize(("case", "path", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_what_cannot_be_loaded_is_refused_by_name(
    case: str, path: Callable[[Path, Path], Any], message: str, saved: Path, tmp_path: Path
) -> None:
    """Each refusal is a ModelLoadError whose message names the path or field and the fix."""
    with pytest.raises(ModelLoadError, match=message):
        load(path(saved, tmp_path))


def test_a_model_loaded_onto_meta_is_refused(saved: Path) -> None:
    """device='meta' leaves no weights to run: refused naming the meta device."""
    with pytest.raises(ModelLoadError, match=r"weights are on the meta device \(parameter model\."):
        load(saved, device="meta")


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"SPECSTRAT_CACHE": "/c/spec", "XDG_CACHE_HOME": "/c/xdg"}, "/c/spec"),
        ({"XDG_CACHE_HOME": "/c/xdg"}, "/c/xdg/specstrat"),
        ({"HOME": "/c/home"}, "/c/home/.cache/specstrat"),
    ],
    ids=["specstrat-cache", "xdg", "home"],
)
def test_the_cache_directory_follows_the_environment(
    env: dict[str, str], want: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$SPECSTRAT_CACHE wins, then $XDG_CACHE_HOME/specstrat, then ~/.cache/specstrat."""
    for name in ("SPECSTRAT_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cache_dir() == Path(want)
    assert os.fspath(cache_dir()) == want
