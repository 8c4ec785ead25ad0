"""Loading a ``.gguf`` file: converted once into the cache (keyed by the file's content), read
from it afterwards (by any path), lossless in the engine; a cache that cannot be written, or a
conversion that another process finished first, is handled by name; `specstrat cache` lists
and clears it."""

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from specstrat import ModelLoadError, ModelSet
from specstrat.hf import compare, generate_reference, load
from specstrat.hf import loader as loader_module
from specstrat.runtime import Engine, EngineConfig
from tests.hf import tiny
from tests.hf.conftest import TEXT


@pytest.fixture
def gguf_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny llama .gguf, with $SPECSTRAT_CACHE in this test's directory."""
    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    return tiny.save_gguf(tmp_path / "tiny-llama.gguf")


def conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each read of a .gguf file by the loader (a conversion)."""
    seen: list[str] = []
    real = loader_module._from_dir

    def spy(
        directory: Path, dtype: torch.dtype, gguf_file: str | None = None, values: int | None = None
    ) -> Any:
        if gguf_file is not None:
            seen.append(gguf_file)
        return real(directory, dtype, gguf_file, values)

    monkeypatch.setattr(loader_module, "_from_dir", spy)
    return seen


def test_a_gguf_file_is_converted_once_and_runs_losslessly(
    gguf_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load converts the file into one cache entry, a second (bfloat16) load reads
    the entry without converting, as do a touched file and a copy elsewhere (the key is the
    content); a file of other bytes converts again; greedy runs equal generate."""
    seen = conversions(monkeypatch)
    first = load(gguf_file)
    entries = sorted((gguf_file.parent / "cache" / "models").iterdir())
    assert [e.name.startswith("tiny-llama-") for e in entries] == [True]
    assert (entries[0] / "config.json").is_file()
    second = load(gguf_file, dtype=torch.bfloat16)
    assert seen == ["tiny-llama.gguf"]
    assert next(second.target.parameters()).dtype == torch.bfloat16
    assert first.target.shape.vocab_size == tiny.VOCAB
    assert first.eos_token_ids == frozenset({0})
    requests = [first.request("a", 10, text=TEXT[:30]), first.request("b", 6, text=TEXT[30:50])]
    outputs = Engine("NGRAM", ModelSet(target=first.target), EngineConfig(context_len=64)).run(
        requests
    )
    check = compare(first.target, requests, outputs, generate_reference(first.target, requests))
    assert check.lossless, check.line()
    os.utime(gguf_file, ns=(1, 1))
    load(gguf_file)
    copy = gguf_file.parent / "elsewhere" / "tiny-llama.gguf"
    copy.parent.mkdir()
    copy.write_bytes(gguf_file.read_bytes())
    load(copy)
    assert seen == ["tiny-llama.gguf"]
    tiny.save_gguf(gguf_file, seed=1)
    load(gguf_file)
    assert seen == ["tiny-llama.gguf"] * 2
    assert len(list((gguf_file.parent / "cache" / "models").iterdir())) == 2


def test_an_unwritable_cache_is_a_named_error(
    gguf_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache path that cannot be created (a file stands there) is a ModelLoadError naming the
    cache and SPECSTRAT_CACHE, and leaves no half-written entry."""
    blocker = gguf_file.parent / "blocked"
    blocker.write_text("a file, not a directory")
    monkeypatch.setenv("SPECSTRAT_CACHE", str(blocker))
    with pytest.raises(
        ModelLoadError,
        match=r"cannot write the GGUF conversion cache at .*blocked.*SPECSTRAT_CACHE",
    ):
        load(gguf_file)
    assert blocker.read_text() == "a file, not a directory"


def test_a_conversion_finished_meanwhile_by_another_process_is_kept(
    gguf_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the cache entry appears while this process converts (a second process won the race),
    the rename fails, the winner's entry is used and no temporary directory is left."""
    real_replace = os.replace

    def lose_the_race(src: Any, dst: Any) -> None:
        real_replace(src, dst)  # the other process's entry...
        Path(dst, "marker").write_text("winner")
        raise OSError(39, "Directory not empty")  # ...and this one's rename fails

    monkeypatch.setattr(os, "replace", lose_the_race)
    models = load(gguf_file)
    assert models.target.shape.vocab_size == tiny.VOCAB
    entries = list((gguf_file.parent / "cache" / "models").iterdir())
    assert [(e / "marker").read_text() for e in entries] == ["winner"]


def test_the_cache_command_lists_the_conversions_and_clears_them(
    gguf_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specstrat cache` lists each converted model with its size; `--clear` removes them and
    the next load converts again."""
    from specstrat.cli import main

    load(gguf_file)
    capsys.readouterr()
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"cache: 1 converted model\(s\), \d+ MB\n +\d+ MB  tiny-llama-[0-9a-f]{16}", out
    )
    assert main(["cache", "--clear"]) == 0
    assert re.match(r"removed \d+ MB of converted models from .*cache", capsys.readouterr().out)
    assert not (gguf_file.parent / "cache" / "models").exists()
    assert main(["cache"]) == 0
    assert "cache: 0 converted model(s), 0 MB" in capsys.readouterr().out
