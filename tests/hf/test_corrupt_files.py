"""Corrupt model files (cut short anywhere, a bit flipped in a header) end in a named error or a
load whose weights equal the original's, never a raw exception or silently random weights; the
loader's arguments and a mismatched tokenizer are refused by name before any work."""

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specstrat.errors import InvalidConfig, ModelLoadError
from specstrat.hf import HFModels, load
from tests.hf import tiny

#: Examples per property in make test; make test-slow runs the same properties with more.
FEW, MANY = 20, 300


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny llama directory."""
    return tiny.save("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama written as a float32 .gguf file."""
    return tiny.save_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh directory that is also the conversion cache (hypothesis runs many examples in
    one test call, so function-scoped fixtures would be shared between them)."""
    with tempfile.TemporaryDirectory() as tmp:
        before = os.environ.get("SPECSTRAT_CACHE")
        os.environ["SPECSTRAT_CACHE"] = str(Path(tmp) / "cache")
        try:
            yield Path(tmp)
        finally:
            if before is None:
                del os.environ["SPECSTRAT_CACHE"]
            else:
                os.environ["SPECSTRAT_CACHE"] = before


def _weights(models: HFModels) -> dict[str, torch.Tensor]:
    return dict(models.target.model.state_dict())


def _named_error_or_same_weights(path: Path, reference: Callable[[], HFModels]) -> None:
    """Loading ``path`` raises ModelLoadError, or loads weights equal to ``reference()``'s."""
    try:
        loaded = load(path)
    except ModelLoadError as exc:
        message = str(exc)
        assert path.name in message, message
        return
    want = _weights(reference())
    got = _weights(loaded)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), "a corrupt file loaded other weights"


def _damage(data: bytes, cut: int | None, flip: tuple[int, int] | None) -> bytes:
    """``data`` cut to ``cut`` bytes, or with bit ``flip[1]`` of byte ``flip[0]`` flipped."""
    if cut is not None:
        return data[:cut]
    assert flip is not None
    out = bytearray(data)
    out[flip[0]] ^= 1 << flip[1]
    return bytes(out)


Damage = tuple[int | None, tuple[int, int] | None]


def _damages(size: int, header: int) -> st.SearchStrategy[Damage]:
    """A cut anywhere in a file of ``size`` bytes, or a bit flip in its first ``header``."""
    cuts = st.integers(0, size - 1).map(lambda c: (c, None))
    flips = st.tuples(st.integers(0, header - 1), st.integers(0, 7)).map(lambda f: (None, f))
    return st.one_of(cuts, flips)


def _safetensors_property(saved: Path, examples: int) -> None:
    data = (saved / "model.safetensors").read_bytes()
    header = 8 + struct.unpack("<Q", data[:8])[0]
    reference = load(saved)

    @settings(max_examples=examples)
    @given(_damages(len(data), header))
    def check(damage: Damage) -> None:
        with _scratch() as tmp:
            copy = shutil.copytree(saved, tmp / "model")
            (copy / "model.safetensors").write_bytes(_damage(data, *damage))
            _named_error_or_same_weights(copy, lambda: reference)

    check()


def _gguf_property(gguf_file: Path, examples: int) -> None:
    import gguf

    data = gguf_file.read_bytes()
    header = min(int(t.data_offset) for t in gguf.GGUFReader(str(gguf_file)).tensors)
    with _scratch():
        reference = load(gguf_file)

    @settings(max_examples=examples)
    @given(_damages(len(data), header))
    def check(damage: Damage) -> None:
        with _scratch() as tmp:
            (tmp / "model.gguf").write_bytes(_damage(data, *damage))
            _named_error_or_same_weights(tmp / "model.gguf", lambda: reference)

    check()


def test_a_damaged_safetensors_file_is_named_or_loads_the_same_weights(saved: Path) -> None:
    """A safetensors file cut anywhere or with a header bit flipped: a named error or the
    original weights (a few examples; test-slow runs more)."""
    _safetensors_property(saved, FEW)


def test_a_damaged_gguf_file_is_named_or_loads_the_same_weights(gguf_file: Path) -> None:
    """A GGUF file cut anywhere or with a bit flipped before its tensor data: a named error or
    the original weights (a few examples; test-slow runs more)."""
    _gguf_property(gguf_file, FEW)


@pytest.mark.slow
def test_many_damaged_safetensors_files(saved: Path) -> None:
    """The safetensors property over many examples."""
    _safetensors_property(saved, MANY)


@pytest.mark.slow
def test_many_damaged_gguf_files(gguf_file: Path) -> None:
    """The GGUF property over many examples."""
    _gguf_property(gguf_file, MANY)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (0, r"model\.safetensors \(0 bytes\) is not a readable safetensors file \(.*header too"),
        (100, r"model\.safetensors \(100 bytes\) is not a readable safetensors file"),
        (-1, r"is not a readable safetensors file \(.*incomplete metadata.*\); it may be cut"),
    ],
    ids=["empty", "in-header", "in-data"],
)
def test_a_cut_safetensors_file_is_named(
    cut: int, message: str, saved: Path, tmp_path: Path
) -> None:
    """A safetensors file cut short is a ModelLoadError naming the file, its size and why."""
    copy = shutil.copytree(saved, tmp_path / "model")
    data = (saved / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: cut % len(data)])
    with pytest.raises(ModelLoadError, match=message):
        load(copy)


def test_a_renamed_tensor_is_refused_not_left_random(saved: Path, tmp_path: Path) -> None:
    """A header whose tensor name no longer matches the model (same length, so the file stays
    valid) is refused naming the weight transformers would have started at random."""
    copy = shutil.copytree(saved, tmp_path / "model")
    data = (saved / "model.safetensors").read_bytes()
    name = b"model.layers.0.mlp.up_proj.weight"
    assert data.count(name) == 1
    (copy / "model.safetensors").write_bytes(data.replace(name, name.replace(b"up_", b"uq_")))
    with pytest.raises(ModelLoadError, match=r"do not hold model\.layers\.0\.mlp\.up_proj\.weight"):
        load(copy)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGUF" + bytes(range(256)) * 8, r"tiny-bad\.gguf' \(2052 bytes\) is not a readable GGUF"),
        (b"GGML" + bytes(64), r"does not start with the GGUF magic bytes \(found b'GGML'\)"),
        (b"", r"does not start with the GGUF magic bytes \(found b''\)"),
    ],
    ids=["magic-then-garbage", "wrong-magic", "empty"],
)
def test_a_bad_gguf_file_is_named_as_such(
    data: bytes, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF file with garbage after the magic, another magic, or nothing is named as a bad
    GGUF file (not as a bad JSON config)."""
    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tiny-bad.gguf").write_bytes(data)
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path / "tiny-bad.gguf")


def test_a_gguf_string_that_is_not_utf8_is_named(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token string with a broken UTF-8 byte names the field, not a JSON config."""
    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    data = bytearray(gguf_file.read_bytes())
    at = data.index("Ġ".encode())  # a byte-level BPE token: two UTF-8 bytes
    data[at + 1] = 0x41  # the continuation byte replaced
    (tmp_path / "broken.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"field tokenizer\.ggml\.tokens holds a string that"):
        load(tmp_path / "broken.gguf")


@pytest.mark.parametrize(
    ("field", "byte", "bit", "message"),
    [
        ("llama.block_count", 1, 6, r"says llama\.block_count=16386 but the weights hold 2 "),
        ("llama.vocab_size", 2, 4, r"says llama\.vocab_size=1048960 but no weight is that wide"),
    ],
    ids=["blocks", "vocabulary"],
)
def test_a_gguf_model_beyond_its_tensors_is_refused_before_building(
    field: str,
    byte: int,
    bit: int,
    message: str,
    gguf_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block count or vocabulary size with one high bit flipped is named before transformers
    builds a model of that many layers or rows (a vocabulary of 2**26 ran a test run out of
    memory; these stay small enough to pass memory if the check went)."""
    import gguf

    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    reader = gguf.GGUFReader(str(gguf_file))
    part = reader.fields[field].parts[-1]
    at = int(part.ctypes.data - reader.data.ctypes.data)
    data = bytearray(gguf_file.read_bytes())
    data[at + byte] ^= 1 << bit
    (tmp_path / "big.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path / "big.gguf")


_OWN_CONFIG = r".*copy the model's own config\.json"
_SIZES = r"its config describes a model of [\d,]+ parameters but its weights hold [\d,]+ values"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "num_hidden_layers",
            100_000,
            rf"says num_hidden_layers=100000 but the weights hold 2 {_OWN_CONFIG}",
        ),
        (
            "num_hidden_layers",
            0,
            rf"says num_hidden_layers=0; a model has at least one layer{_OWN_CONFIG}",
        ),
        ("num_hidden_layers", -1, r"says num_hidden_layers=-1; a model has at least one layer"),
        ("vocab_size", 1 << 20, r"says vocab_size=1048576 but no weight is that wide \(the wid"),
        ("intermediate_size", 4096, rf"{_SIZES}; a size in the config is corrupt"),
    ],
    ids=["layers", "no-layers", "negative-layers", "vocabulary", "intermediate-size"],
)
def test_a_config_beyond_its_weights_is_refused(
    key: str, value: int, message: str, saved: Path, tmp_path: Path
) -> None:
    """config.json declaring more (or no) layers, a wider vocabulary, or any size that makes a
    model larger than the weight files hold is named before transformers builds the model (it
    would allocate the model the config describes first)."""
    copy = shutil.copytree(saved, tmp_path / "model")
    config = json.loads((copy / "config.json").read_text())
    config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        load(copy)


def test_a_gguf_feed_forward_size_past_its_tensors_is_refused(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF feed-forward size with a bit flipped is named from the model it would build."""
    import gguf

    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    reader = gguf.GGUFReader(str(gguf_file))
    part = reader.fields["llama.feed_forward_length"].parts[-1]
    data = bytearray(gguf_file.read_bytes())
    data[int(part.ctypes.data - reader.data.ctypes.data) + 1] ^= 1 << 4
    (tmp_path / "wide.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=rf"wide\.gguf': {_SIZES}"):
        load(tmp_path / "wide.gguf")


def test_a_gguf_string_turned_into_an_array_is_refused_before_the_reader(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """general.architecture's type flipped from string (8) to array (9) makes its length and
    text an array count of about 2**62: refused by the header scan, before gguf's reader
    (which looped on it, growing until the machine ran out of memory) is called."""
    import gguf

    def unreachable(*args: object) -> None:
        raise AssertionError("the reader ran on a header the scan should refuse")

    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    data = bytearray(gguf_file.read_bytes())
    at = data.index(b"general.architecture") + len(b"general.architecture")
    assert data[at] == 8  # the STRING type
    data[at] ^= 1
    (tmp_path / "array.gguf").write_bytes(bytes(data))
    monkeypatch.setattr(gguf, "GGUFReader", unreachable)
    with pytest.raises(
        ModelLoadError, match=r"field general\.architecture: its array of \d+ items runs past"
    ):
        load(tmp_path / "array.gguf")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("type-13", r"field general\.architecture: value type 13 is not a GGUF type"),
        ("string-length", r"field general\.architecture: its string of \d+ bytes runs past"),
        ("key-length", r"key 0 \(\d+ bytes\) runs past the end of the file"),
    ],
    ids=["unknown-type", "string-length", "key-length"],
)
def test_a_gguf_header_length_or_type_past_the_file_is_named(
    edit: str, message: str, gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header scan names a value type GGUF lacks, a string length or a key length that
    runs past the end of the file."""
    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    data = bytearray(gguf_file.read_bytes())
    at = data.index(b"general.architecture")
    if edit == "type-13":
        data[at + 20] = 13
    elif edit == "string-length":
        data[at + 24 + 6] = 0x7F  # a high byte of the value's 8-byte length
    else:
        data[at - 8 + 6] = 0x7F  # a high byte of the key's 8-byte length
    (tmp_path / "edited.gguf").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=message):
        load(tmp_path / "edited.gguf")


def test_a_gguf_block_count_that_is_not_an_integer_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block count written as a string is named as such, not read as its first byte."""
    import gguf

    monkeypatch.setenv("SPECSTRAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        gguf.GGUFWriter,
        "add_block_count",
        lambda self, n: self.add_string("llama.block_count", str(n)),
    )
    path = tiny.save_gguf(tmp_path / "text.gguf")
    with pytest.raises(
        ModelLoadError, match=r"field llama\.block_count is not one integer \(STRING\)"
    ):
        load(path)


def test_a_config_with_fewer_layers_than_the_weights_is_refused(
    saved: Path, tmp_path: Path
) -> None:
    """config.json declaring one layer of the two the weights hold is refused naming the
    layer's weights, not loaded as a silently truncated model."""
    copy = shutil.copytree(saved, tmp_path / "model")
    config = json.loads((copy / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelLoadError, match=r"the weight files hold model\.layers\.1\..*has no place for"
    ):
        load(copy)


def test_bin_weights_beside_an_unrelated_safetensors_file_load(saved: Path, tmp_path: Path) -> None:
    """The size checks read the weights transformers reads: a pytorch_model.bin model with an
    unrelated small safetensors file beside it loads the same weights."""
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(saved, tmp_path / "model")
    torch.save(load_file(str(copy / "model.safetensors")), copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    save_file({"proj.weight": torch.zeros(8, 8)}, str(copy / "extra_head.safetensors"))
    got, want = _weights(load(copy)), _weights(load(saved))
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_tokenizer_wider_than_the_model_is_refused(tmp_path: Path) -> None:
    """Tokenizer files from a model with more ids than this one's embedding are refused."""
    narrow = tiny.model("llama", vocab_size=tiny.VOCAB - 8)
    directory = tiny.save_model(narrow, tmp_path / "narrow")
    with pytest.raises(
        ModelLoadError, match=rf"tokenizer has {tiny.VOCAB} ids but the model's embedding has "
    ):
        load(directory)


def test_tokenizer_files_that_cannot_be_read_are_named(saved: Path, tmp_path: Path) -> None:
    """A tokenizer.json cut short is named as unreadable, not as missing."""
    copy = shutil.copytree(saved, tmp_path / "model")
    text = (saved / "tokenizer.json").read_bytes()
    (copy / "tokenizer.json").write_bytes(text[: len(text) // 2])
    with pytest.raises(ModelLoadError, match=r"its tokenizer files \(tokenizer\.json, .*\) cannot"):
        load(copy)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": None}, r"load\(path=None\): path is a NoneType; pass a model directory"),
        ({"dtype": "float32"}, r"dtype='float32' is not a floating torch dtype; pass torch\."),
        ({"dtype": torch.int64}, r"dtype=torch\.int64 is not a floating torch dtype"),
        ({"device": "gpu"}, r"device='gpu' is not a device torch knows .*; pass 'cpu', 'cuda'"),
        ({"device": 0}, r"device=0 is a int; pass a string such as 'cpu'"),
        ({"device": "xpu:3"}, r"device='xpu:3': this machine has no xpu device"),
    ],
    ids=["path-none", "dtype-str", "dtype-int", "device-unknown", "device-int", "device-absent"],
)
def test_bad_loader_arguments_are_refused_before_any_work(
    kwargs: dict[str, object], message: str, saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load's arguments are checked before a file is read: each refusal names the argument."""
    import specstrat.hf.loader

    def unreachable(*args: object) -> None:
        raise AssertionError("a file was read before the arguments were checked")

    monkeypatch.setattr(specstrat.hf.loader, "_resolve", unreachable)
    with pytest.raises(InvalidConfig, match=message):
        load(**{"path": saved, **kwargs})  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_cuda_on_a_machine_without_it_is_refused(saved: Path) -> None:
    """device='cuda:7' without CUDA names the missing device and suggests the CPU."""
    with pytest.raises(InvalidConfig, match=r"device='cuda:7': this machine has no cuda device"):
        load(saved, device="cuda:7")
