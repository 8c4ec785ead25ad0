"""Load a Hugging Face model directory or a ``.gguf`` file for the engine, local files only.

A ``.gguf`` file is dequantised by transformers (it needs the ``gguf`` and ``accelerate``
packages) once; the converted weights and tokenizer are kept in a per-user cache directory
(``$SPECSTRAT_CACHE``, else ``$XDG_CACHE_HOME/specstrat``, else ``~/.cache/specstrat``), keyed by
the file's path, size and modification time, so later loads read plain weights in seconds.
Remove the directory to clear it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf.adapter import HFCausalLM
from specstrat.hf.text_io import chat_request, decode, text_request
from specstrat.models import CausalLM, DraftHead
from specstrat.runtime import Request

__all__ = ["HFModels", "cache_dir", "eos_token_ids", "load"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_INSTALL = "pip install 'specstrat[hf]' (transformers, tokenizers, gguf, accelerate)"


def cache_dir() -> Path:
    """Where converted models are kept: ``$SPECSTRAT_CACHE``, else ``$XDG_CACHE_HOME/specstrat``,
    else ``~/.cache/specstrat``."""
    if os.environ.get("SPECSTRAT_CACHE"):
        return Path(os.environ["SPECSTRAT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "specstrat"


@dataclass(frozen=True, slots=True)
class HFModels:
    """A loaded Hugging Face model for the engine (a :class:`~specstrat.models.LoadedModels`):
    ``target`` (an :class:`~specstrat.hf.HFCausalLM`), an optional ``draft`` LM, an optional
    EAGLE-style ``head``, the ``tokenizer``, and the ids that end a request by default
    (``eos_token_ids``: the tokenizer's and the generation config's EOS). ``attach``: how these
    models were made from what :func:`load` returned (e.g. a trained head attached by
    ``specstrat.train.attach_head``), a picklable callable the prefill process of
    disaggregation replays after its own :func:`load`; ``None``: nothing was attached."""

    target: HFCausalLM
    tokenizer: Any
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    draft: CausalLM | None = None
    head: DraftHead | None = None
    source: str = ""
    attach: Callable[[HFModels], HFModels] | None = None

    def request(
        self,
        rid: str,
        max_new_tokens: int,
        *,
        text: str | None = None,
        messages: list[dict[str, str]] | None = None,
        stop: tuple[str, ...] = (),
        stop_at_eos: bool = True,
        sampling: SamplingParams = GREEDY,
    ) -> Request:
        """A request from ``text`` (tokenised as is) or chat ``messages`` (through the
        tokenizer's chat template, generation prompt added). It stops at the EOS ids unless
        ``stop_at_eos=False``, and at each ``stop`` string that is one token (longer ones are
        cut by :meth:`decode`)."""
        eos = self.eos_token_ids if stop_at_eos else frozenset()
        if text is not None and messages is None:
            return text_request(
                self.tokenizer, rid, text, max_new_tokens, eos=eos, stop=stop, sampling=sampling
            )
        if messages is not None and text is None:
            return chat_request(
                self.tokenizer, rid, messages, max_new_tokens, eos=eos, stop=stop, sampling=sampling
            )
        raise InvalidConfig(f"request {rid!r}: pass exactly one of text= and messages=")

    def decode(self, ids: list[int], *, stop: tuple[str, ...] = ()) -> str:
        """Output ids as text, special tokens dropped, cut before the first ``stop`` string."""
        return decode(self.tokenizer, ids, stop=stop)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ModelLoadError(f"loading Hugging Face models needs transformers: {_INSTALL}") from exc
    return transformers


def _resolve(path: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    if p.exists():
        return p
    text = os.fspath(path)
    if _HUB_ID.fullmatch(text) and not text.startswith((".", "/")):
        raise ModelLoadError(
            f"model={text!r}: no such path; if it is a hub id: this machine loads local files "
            "only: download the model directory (config.json, weights, tokenizer files) or a "
            ".gguf file where you have network access and pass its path"
        )
    raise ModelLoadError(f"model={text!r}: no such file or directory")


_NO_TOKENIZER = (
    "the directory lacks the tokenizer files (tokenizer.json, tokenizer.model, vocab.json and "
    "merges.txt, ...): copy them from where the model came from"
)


def _loaded(source: str, build: Callable[[], Any], hint: str = "") -> Any:
    """``build()``, its failures as :class:`~specstrat.errors.ModelLoadError` naming ``source``
    (the first line of transformers' message, then ``hint``)."""
    try:
        return build()
    except ImportError as exc:
        raise ModelLoadError(f"loading {source} failed: {exc}; {_INSTALL}") from exc
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"model={source!r} cannot be loaded: {first}" + (f"; {hint}" if hint else "")
        ) from exc


def _from_dir(directory: Path, dtype: torch.dtype, gguf_file: str | None = None) -> tuple[Any, Any]:
    tf = _transformers()
    if gguf_file is None and not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"model={str(directory)!r} has no config.json; pass a Hugging Face model directory "
            "(config.json, weights, tokenizer files) or a .gguf file"
        )
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    source = str(directory / gguf_file) if gguf_file else str(directory)
    model = _loaded(
        source,
        lambda: tf.AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, dtype=dtype, **extra
        ),
    )
    tokenizer = _loaded(
        source,
        lambda: tf.AutoTokenizer.from_pretrained(directory, local_files_only=True, **extra),
        _NO_TOKENIZER,
    )
    # transformers builds a tokenizer of nothing but its special tokens from a directory with no
    # tokenizer files (for some model types); every prompt would encode to unknown ids.
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise ModelLoadError(
            f"model={source!r}: its tokenizer has only {len(tokenizer)} id(s), its special "
            f"tokens; {_NO_TOKENIZER}"
        )
    return model, tokenizer


def _gguf_cached(file: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The GGUF file's model, from the cache when converted before (converted now otherwise)."""
    stat = file.stat()
    key = hashlib.sha256(f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    target = cache_dir() / "models" / f"{file.stem}-{key.hexdigest()[:16]}"
    if not (target / "config.json").is_file():
        model, tokenizer = _from_dir(file.parent, torch.float32, gguf_file=file.name)
        # transformers dequantises GGUF weights at load but keeps the quantizer, which refuses
        # save_pretrained; the weights are plain tensors by now, saved as such.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _write_cache(model, tokenizer, target)
        if dtype == torch.float32:
            return model, tokenizer
        del model
    return _from_dir(target, dtype)


def _write_cache(model: Any, tokenizer: Any, target: Path) -> None:
    """The converted model and tokenizer saved at ``target``: written aside, then renamed, so an
    interrupted conversion leaves no half cache, and a process that lost the race to convert the
    same file keeps the winner's."""
    tmp: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # converted meanwhile by another process
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(
            f"cannot write the GGUF conversion cache at {target}: {exc}; set SPECSTRAT_CACHE to "
            "a writable directory"
        ) from exc
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a response: the model's generation config's ``eos_token_id`` (one or a
    list) and the tokenizer's."""
    ids: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def load(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> HFModels:
    """A Hugging Face model directory or ``.gguf`` file, loaded for the engine.

    Always ``local_files_only``: a hub id or a missing path is a
    :class:`~specstrat.errors.ModelLoadError` saying so, as is a model whose attention the engine
    cannot run. ``shape.vocab_size`` is the tokenizer's vocabulary (a wider LM head's extra
    logits are sliced off).
    """
    p = _resolve(path)
    if p.is_file():
        if p.suffix != ".gguf":
            raise ModelLoadError(
                f"model={str(p)!r} is a file but not a .gguf; pass a model directory or a .gguf"
            )
        model, tokenizer = _gguf_cached(p, dtype)
    else:
        model, tokenizer = _from_dir(p, dtype)
    model = model.to(device).eval()
    target = HFCausalLM(model, vocab_size=len(tokenizer), name=p.name)
    return HFModels(
        target=target,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids(model, tokenizer),
        source=str(p),
    )
