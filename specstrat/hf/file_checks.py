"""What :func:`specstrat.hf.load` checks before and after transformers reads a model, so a bad
argument, a cut-short or corrupt file, or a file whose tensors do not fill the model is a named
error, never a raw exception from another library or a model with silently random weights.

Before any work: the arguments' types, the dtype, and the device (parsed by torch, and present
on this machine). Before transformers reads the files: each ``*.safetensors`` file's header
(through ``safetensors.safe_open``, which checks the header's length, JSON and offsets against
the file's size) and a ``.gguf`` file's header and tensor table (``gguf.GGUFReader``), and
that the layer count and vocabulary the config declares are no more than the weights hold
(transformers would exhaust memory building such a model). After it
reads them: no weight of the model was left out of the files (transformers would initialise it
at random and go on), and the tokenizer has no id the model's embedding lacks.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf.gguf_header import gguf_header_problem

__all__ = [
    "TOKENIZER_FILES",
    "check_declared_size",
    "check_device",
    "check_gguf_file",
    "check_load_args",
    "check_loading_info",
    "check_safetensors_files",
    "check_tokenizer_width",
    "tokenizer_hint",
]

#: The files a transformers tokenizer is built from (any one of them may be present).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
)

#: A numbered layer in a weight's dotted name (``model.layers.7.mlp.up_proj.weight``: 7).
_LAYER = re.compile(r"\.(\d+)\.")

_CORRUPT = "it may be cut short or corrupt: copy it again from where the model came from"


def check_device(device: object) -> torch.device:
    """``device`` as a :class:`torch.device` that exists on this machine; an unknown string or
    an accelerator that is absent (or an index past the ones present) raises
    :class:`~specstrat.errors.InvalidConfig` naming it."""
    if not isinstance(device, str | torch.device):
        raise InvalidConfig(
            f"device={device!r} is a {type(device).__name__}; pass a string such as 'cpu' or "
            "'cuda:0', or a torch.device"
        )
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise InvalidConfig(
            f"device={device!r} is not a device torch knows ({str(exc).splitlines()[0]}); pass "
            "'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from exc
    if parsed.type in ("cpu", "meta"):
        return parsed
    backend: Any = torch.backends.mps if parsed.type == "mps" else getattr(torch, parsed.type, None)
    if backend is None or not backend.is_available():
        raise InvalidConfig(
            f"device={device!r}: this machine has no {parsed.type} device (torch "
            f"{torch.__version__} sees none); pass device='cpu'"
        )
    count = int(backend.device_count()) if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise InvalidConfig(
            f"device={device!r}: this machine has {count} {parsed.type} device(s), "
            f"{parsed.type}:0 to {parsed.type}:{count - 1}; pass one of them"
        )
    return parsed


def check_load_args(path: object, dtype: object, device: object) -> torch.device:
    """:func:`~specstrat.hf.load`'s arguments before any work: ``path`` a string or path,
    ``dtype`` a floating torch dtype, ``device`` as :func:`check_device`; the device parsed."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidConfig(
            f"load(path={path!r}): path is a {type(path).__name__}; pass a model directory or a "
            ".gguf file as a str or a pathlib.Path (e.g. specstrat.hf.smollm2.smollm2_path())"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InvalidConfig(
            f"dtype={dtype!r} is not a floating torch dtype; pass torch.float32, torch.bfloat16 "
            "or torch.float16"
        )
    return check_device(device)


def check_safetensors_files(directory: Path) -> int | None:
    """Each ``*.safetensors`` file in ``directory`` opens: its header is whole, valid JSON, and
    its tensors' offsets fit the file; and config.json declares no more layers and no wider a
    vocabulary than the weights transformers reads hold (:func:`_beyond_weights`). A bad file
    raises :class:`~specstrat.errors.ModelLoadError` naming it. Returns how many values those
    weights hold, or None where they are not all safetensors files present."""
    try:
        from safetensors import safe_open
    except ImportError:  # transformers then reads no safetensors file either
        return None
    shapes: dict[str, dict[str, list[int]]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as opened:
                names = opened.keys()
                shapes[file.name] = {k: list(opened.get_slice(k).get_shape()) for k in names}
        except Exception as exc:  # SafetensorError, and OSError from the file system
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelLoadError(
                f"model={str(directory)!r}: {file.name} ({file.stat().st_size} bytes) is not a "
                f"readable safetensors file ({message}); {_CORRUPT}"
            ) from exc
    read = _files_read(directory)
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # transformers names an unreadable config itself
        return None
    if read is None or not set(read) <= set(shapes) or not isinstance(config, dict):
        return None  # transformers reads other weights, or names the shard that is missing
    weights = {k: v for name in read for k, v in shapes[name].items()}
    layers, vocab = config.get("num_hidden_layers"), config.get("vocab_size")
    problem = _beyond_weights(layers, vocab, weights, "num_hidden_layers", "vocab_size")
    if problem:
        raise ModelLoadError(
            f"model={str(directory)!r}: config.json {problem}; the config is corrupt or from "
            "another model: copy the model's own config.json"
        )
    return sum(math.prod(shape) for shape in weights.values())


def _files_read(directory: Path) -> list[str] | None:
    """The safetensors files transformers reads the weights from: the shards
    ``model.safetensors.index.json`` lists, else ``model.safetensors``; None when neither is
    there (it reads ``pytorch_model.bin`` or others) or the index is unreadable."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return sorted({str(name) for name in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # transformers names the unreadable index itself
    return ["model.safetensors"] if (directory / "model.safetensors").is_file() else None


def _beyond_weights(
    layers: object, vocab: object, shapes: dict[str, list[int]], layers_key: str, vocab_key: str
) -> str:
    """What a config declares beyond its weights, or "": more layers than the weights number
    (``model.layers.7.mlp...`` is layer 7), or a vocabulary wider than every weight. transformers
    builds the model the config describes before it compares the weights, so a flipped bit
    there would have it build thousands of layers or a vocabulary of gigabytes first."""
    if isinstance(layers, int) and not isinstance(layers, bool) and layers < 1:
        return f"says {layers_key}={layers}; a model has at least one layer"
    held = len({m.group(1) for k in shapes if (m := _LAYER.search(f".{k}"))})
    if held and isinstance(layers, int) and layers > held:
        return f"says {layers_key}={layers} but the weights hold {held} layers"
    widest = max((max(shape, default=0) for shape in shapes.values()), default=0)
    if isinstance(vocab, int) and vocab > widest:
        return f"says {vocab_key}={vocab} but no weight is that wide (the widest is {widest})"
    return ""


def check_gguf_file(file: Path) -> int | None:
    """``file``'s GGUF header and tensor table read whole (``gguf.GGUFReader``); otherwise a
    :class:`~specstrat.errors.ModelLoadError` naming the file and what is wrong. Returns how
    many values its tensors hold (None without the gguf package)."""
    try:
        from gguf import GGUFReader
    except ImportError:  # transformers refuses the file with its own install hint
        return None
    with file.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"model={str(file)!r} does not start with the GGUF magic bytes (found {magic!r}); it "
            "is not a GGUF file, or it is corrupt: pass a .gguf file written by llama.cpp or the "
            "gguf package"
        )
    try:
        problem = gguf_header_problem(file)  # before the reader, which can loop for ever
        if not problem:
            reader = GGUFReader(str(file))
            problem = _gguf_problem(reader, file.stat().st_size)
    except Exception as exc:  # ValueError, struct.error, IndexError, OSError, ... from gguf
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problem = f"{type(exc).__name__}: {message}"
    if problem:
        raise ModelLoadError(
            f"model={str(file)!r} ({file.stat().st_size} bytes) is not a readable GGUF file "
            f"({problem}); {_CORRUPT}"
        )
    return sum(int(t.n_elements) for t in reader.tensors)


def check_declared_size(source: str, build_config: Callable[[], Any], values: int) -> None:
    """The model the config describes, built on the meta device (no memory), has no more
    parameters than its weight files hold ``values``; otherwise a
    :class:`~specstrat.errors.ModelLoadError`. transformers allocates the model its config
    describes before it compares the weights, so one corrupt size (an intermediate size of
    2**24, a position table of 2**24 rows) would have it allocate gigabytes first. Skipped for
    a quantized checkpoint (a packed value holds several parameters) and for a config
    transformers cannot build (it refuses that itself, named, when it loads)."""
    import transformers

    try:
        config = build_config()
        if getattr(config, "quantization_config", None) is not None:
            return
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    except Exception:  # refused again, and named, by the load that follows
        return
    declared = sum(p.numel() for p in model.parameters())
    if declared > values:
        raise ModelLoadError(
            f"model={source!r}: its config describes a model of {declared:,} parameters but its "
            f"weights hold {values:,} values; a size in the config is corrupt, or the weights "
            "are from another model: copy the model's config and weights again"
        )


def _gguf_problem(reader: Any, size: int) -> str:
    """What is wrong with a GGUF file the reader parsed, or "": a string field that is not
    UTF-8, a block count or vocabulary beyond the tensors' (:func:`_beyond_weights`), or
    tensors that do not tile the data region in order (each starts where the one before ends,
    rounded up to the alignment; the last ends inside the file)."""
    from gguf import GGUFValueType

    integers = {
        getattr(GGUFValueType, f"{sign}INT{bits}") for sign in ("", "U") for bits in (8, 16, 32, 64)
    }
    for field in reader.fields.values():
        if GGUFValueType.STRING in field.types:
            for index in field.data:
                try:
                    bytes(field.parts[index]).decode("utf-8")
                except UnicodeDecodeError as exc:
                    return f"field {field.name} holds a string that is not UTF-8 ({exc.reason})"
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field else "llama"

    def number(key: str) -> int | str | None:
        field = reader.fields.get(f"{arch}.{key}")
        if field is None:
            return None
        if len(field.types) != 1 or field.types[0] not in integers:
            kinds = "/".join(t.name for t in field.types) or "no value"
            return f"field {arch}.{key} is not one integer ({kinds})"
        return int(field.parts[field.data[0]][0])

    numbers = number("block_count"), number("vocab_size")
    for value in numbers:
        if isinstance(value, str):
            return value

    shapes = {str(t.name): [int(n) for n in t.shape] for t in reader.tensors}
    problem = _beyond_weights(
        *numbers,
        shapes,
        f"{arch}.block_count",
        f"{arch}.vocab_size",
    )
    if problem:
        return f"its metadata {problem}"
    alignment = int(getattr(reader, "alignment", 32))
    tensors = sorted(reader.tensors, key=lambda t: int(t.data_offset))
    for before, after in itertools.pairwise(tensors):
        end = int(before.data_offset) + int(before.n_bytes)
        if int(after.data_offset) != -(-end // alignment) * alignment:
            return (
                f"tensor {after.name} starts at byte {int(after.data_offset)}, not where "
                f"{before.name} ends ({end}, aligned to {alignment})"
            )
    if tensors and int(tensors[-1].data_offset) + int(tensors[-1].n_bytes) > size:
        return f"tensor {tensors[-1].name} runs past the end of the file"
    return ""


def check_loading_info(source: str, info: dict[str, Any]) -> None:
    """transformers' ``output_loading_info``: a weight the files did not hold (``missing_keys``)
    or held at another shape (``mismatched_keys``) would be left at random, and a layer's
    weight the model has no place for (``unexpected_keys`` of a numbered layer: the config
    declares fewer layers than the weights) would be dropped; refused naming it."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = [
        str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ()
    ]
    if missing or mismatched:
        names = ", ".join((missing + mismatched)[:3])
        more = len(missing) + len(mismatched) - 3
        raise ModelLoadError(
            f"model={source!r}: the weight files do not hold {names}"
            + (f" and {more} more" if more > 0 else "")
            + " (missing or of another shape); transformers would start them at random. The "
            "files are corrupt or from another model: copy them again"
        )
    unused = sorted(k for k in info.get("unexpected_keys") or () if _LAYER.search(f".{k}"))
    if unused:
        raise ModelLoadError(
            f"model={source!r}: the weight files hold {', '.join(unused[:3])}"
            + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
            + ", which the model its config describes has no place for (fewer layers than the "
            "weights); the config is corrupt or from another model: copy the model's own config"
        )


def check_tokenizer_width(source: str, tokenizer: Any, model: Any) -> None:
    """The tokenizer's vocabulary (its added tokens apart) has no id past the model's input
    embedding rows (a tokenizer from another model would index past them); otherwise a
    :class:`~specstrat.errors.ModelLoadError`."""
    rows = int(model.get_input_embeddings().weight.shape[0])
    ids = int(getattr(tokenizer, "vocab_size", None) or len(tokenizer))
    if ids > rows:
        raise ModelLoadError(
            f"model={source!r}: its tokenizer has {ids} ids but the model's embedding "
            f"has {rows} rows; the tokenizer files are from another model: copy the model's own"
        )


def tokenizer_hint(directory: Path) -> str:
    """What to do when transformers cannot build the tokenizer: copy the files when none is
    present, else name the ones present as unreadable."""
    present = [name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not present:
        return (
            "the directory lacks the tokenizer files (tokenizer.json, tokenizer.model, "
            "vocab.json and merges.txt, ...): copy them from where the model came from"
        )
    return f"its tokenizer files ({', '.join(present)}) cannot be read; {_CORRUPT}"
