"""Load a Hugging Face model directory or a ``.gguf`` file for the engine, local files only.

A ``.gguf`` file is dequantised by transformers (it needs the ``gguf`` and ``accelerate``
packages) once; the converted weights and tokenizer are kept in a per-user cache directory
(``$SPECSTRAT_CACHE``, else ``$XDG_CACHE_HOME/specstrat``, else ``~/.cache/specstrat``), keyed by
the file's content (its SHA-256, with the converter's versions), so later loads read plain
weights in seconds and a copy of the file in another environment reuses the conversion.
``specstrat cache`` lists the converted models and their sizes; ``specstrat cache --clear``
removes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specstrat.drafting import GREEDY, SamplingParams
from specstrat.errors import InvalidConfig, ModelLoadError, SpecstratError
from specstrat.hf.adapter import HFCausalLM
from specstrat.hf.file_checks import (
    check_declared_size,
    check_gguf_file,
    check_load_args,
    check_loading_info,
    check_safetensors_files,
    check_tokenizer_width,
    tokenizer_hint,
)
from specstrat.hf.text_io import chat_request, decode, text_request
from specstrat.models import BlockDraftModel, CausalLM, DraftHead
from specstrat.runtime import Request

__all__ = ["CONVERSION_FORMAT", "HFModels", "cache_dir", "eos_token_ids", "load"]

_CORRUPT_GGUF = "the file's tokenizer fields may be corrupt: copy the .gguf file again"
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
    EAGLE-style ``head``, an optional ``block`` drafter (DFLASH's and DSPARK's), the
    ``tokenizer``, and the ids that end a request by default (``eos_token_ids``: the
    tokenizer's and the generation config's EOS). ``attach``: how these
    models were made from what :func:`load` returned (e.g. a trained head attached by
    ``specstrat.train.attach_head``), a picklable callable the prefill process of
    disaggregation replays after its own :func:`load`; ``None``: nothing was attached."""

    target: HFCausalLM
    tokenizer: Any
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    draft: CausalLM | None = None
    head: DraftHead | None = None
    block: BlockDraftModel | None = None
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


def _loaded(source: str, build: Callable[[], Any], hint: str = "") -> Any:
    """``build()``, its failures as :class:`~specstrat.errors.ModelLoadError` naming ``source``
    (the first line of transformers' message, then ``hint``)."""
    try:
        return build()
    except SpecstratError:
        raise
    except ImportError as exc:
        raise ModelLoadError(f"loading {source} failed: {exc}; {_INSTALL}") from exc
    except Exception as exc:  # whatever transformers, tokenizers, safetensors or torch raise
        raise ModelLoadError(
            f"model={source!r} cannot be loaded: {_first_line(exc)}" + (f"; {hint}" if hint else "")
        ) from exc


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, and of its root cause's when it has one (a library
    that rewraps an error, e.g. transformers' "not a valid JSON file" around a GGUF decoding
    error, hides the cause otherwise)."""

    def line(e: BaseException) -> str:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    root, seen = exc, {id(exc)}
    while (inner := root.__cause__ or root.__context__) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(inner))
    if root is exc:
        return line(exc)
    return f"{line(exc)} (caused by {type(root).__name__}: {line(root)})"


def _from_dir(
    directory: Path, dtype: torch.dtype, gguf_file: str | None = None, values: int | None = None
) -> tuple[Any, Any]:
    tf = _transformers()
    if gguf_file is None and not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"model={str(directory)!r} has no config.json; pass a Hugging Face model directory "
            "(config.json, weights, tokenizer files) or a .gguf file"
        )
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    source = str(directory / gguf_file) if gguf_file else str(directory)
    if gguf_file is None:
        values = check_safetensors_files(directory)
    if values is not None:
        check_declared_size(
            source,
            lambda: tf.AutoConfig.from_pretrained(directory, local_files_only=True, **extra),
            values,
        )
    model, info = _loaded(
        source,
        lambda: tf.AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, dtype=dtype, output_loading_info=True, **extra
        ),
    )
    check_loading_info(source, info)
    tokenizer = _loaded(
        source,
        lambda: tf.AutoTokenizer.from_pretrained(directory, local_files_only=True, **extra),
        tokenizer_hint(directory) if gguf_file is None else _CORRUPT_GGUF,
    )
    # transformers builds a tokenizer of nothing but its special tokens from a directory with no
    # tokenizer files (for some model types); every prompt would encode to unknown ids.
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise ModelLoadError(
            f"model={source!r}: its tokenizer has only {len(tokenizer)} id(s), its special "
            f"tokens; {tokenizer_hint(directory)}"
        )
    check_tokenizer_width(source, tokenizer, model)
    return model, tokenizer


#: Bumped when the conversion's output changes, so older cache entries are not reused.
CONVERSION_FORMAT = 1


def _content_key(file: Path) -> str:
    """A key for ``file``'s conversion: the SHA-256 of its bytes with the converter's versions
    (transformers' and :data:`CONVERSION_FORMAT`). The hash is remembered under the file's
    path, size and modification time, so only a new or changed file is read to hash it."""
    import transformers

    stat = file.stat()
    seen = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    index = cache_dir() / "index" / hashlib.sha256(seen.encode()).hexdigest()[:32]
    try:
        content = index.read_text(encoding="ascii").strip()
    except OSError:
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
        content = digest.hexdigest()
        with contextlib.suppress(OSError):  # an unwritable cache only costs a hash next time
            index.parent.mkdir(parents=True, exist_ok=True)
            write = index.with_name(f".{index.name}.{os.getpid()}")
            write.write_text(content, encoding="ascii")
            os.replace(write, index)
    versions = f"{content}|transformers {transformers.__version__}|format {CONVERSION_FORMAT}"
    return hashlib.sha256(versions.encode()).hexdigest()[:16]


def _gguf_cached(file: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """The GGUF file's model, from the cache when a file of the same bytes was converted before
    (by any path or environment), converted now otherwise."""
    target = cache_dir() / "models" / f"{file.stem}-{_content_key(file)}"
    if not (target / "config.json").is_file():
        values = check_gguf_file(file)
        model, tokenizer = _from_dir(file.parent, torch.float32, gguf_file=file.name, values=values)
        # transformers dequantises GGUF weights at load but keeps the quantizer, which refuses
        # save_pretrained; the weights are plain tensors by now, saved as such.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _write_cache(model, tokenizer, target)
        size = sum(f.stat().st_size for f in target.iterdir()) / 1e6
        print(
            f"converted {file.name} into {target} ({size:.0f} MB); `specstrat cache --clear` "
            "removes the converted models",
            file=sys.stderr,
        )
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
    cannot run, a file cut short or corrupt, or weight files that leave a weight out (see
    :mod:`specstrat.hf.file_checks`); a bad argument or a device this machine lacks is an
    :class:`~specstrat.errors.InvalidConfig` raised before any work. ``shape.vocab_size`` is
    the tokenizer's vocabulary (a wider LM head's extra logits are sliced off).
    """
    where = check_load_args(path, dtype, device)
    p = _resolve(path)
    if p.is_file():
        if p.suffix != ".gguf":
            raise ModelLoadError(
                f"model={str(p)!r} is a file but not a .gguf; pass a model directory or a .gguf"
            )
        model, tokenizer = _gguf_cached(p, dtype)
    else:
        model, tokenizer = _from_dir(p, dtype)
    model = _loaded(str(p), lambda: model.to(where).eval())
    target = HFCausalLM(model, vocab_size=len(tokenizer), name=p.name)
    return HFModels(
        target=target,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids(model, tokenizer),
        source=str(p),
    )
