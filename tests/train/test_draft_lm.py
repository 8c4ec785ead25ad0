"""Distilled draft LMs on a tiny 4-layer llama (no download): what a draft holds and shares with
its target, a seconds-long distillation that beats the untrained draft by a wide margin, the
file bound to its target, STANDALONE on the attached draft greedy-lossless in sync and overlap
(chain and tree), faults that leak nothing, and every refusal by name."""

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import specstrat
from specstrat import InvalidConfig, SpecAlgorithm
from specstrat.cli import main
from specstrat.errors import ModelLoadError
from specstrat.hf import HFCausalLM, HFModels, compare, generate_reference
from specstrat.hf.process_loader import HFLoader
from specstrat.models import AttentionBackend
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.strategies import TopkTree
from specstrat.train import (
    Attachers,
    DraftAttacher,
    DraftLM,
    DraftVocabLM,
    HeadAttacher,
    HeadConfig,
    HeadMismatch,
    TrainedDraftLM,
    attach_draft,
    attach_files,
    capture_sequences,
    check_draft_layers,
    default_draft_layers,
    default_prompts,
    draft_agreement,
    draft_for,
    draft_lm_metadata,
    generate,
    load_draft_lm,
    raw_model,
    reads_draft_lm,
    save_draft_lm,
    shipped_draft,
    train_draft_lm,
)
from specstrat.train.capture import draft_data
from tests.hf import tiny
from tests.train.conftest import LEARNABLE_INIT, save_untrained_head
from tests.train.faults import assert_fault_leaks_nothing

SHORT = [p for p in default_prompts() if len(p) < 400]
TRAIN, HELD = SHORT[:48], SHORT[48:68]
CONFIG = HeadConfig(
    kind="draft-lm",
    layers=(0,),
    draft_vocab=128,
    max_new_tokens=32,
    epochs=10,
    batch_size=8,
    lr=3e-3,
    held_out=0.15,
)
ALGOS: dict[str, SpecAlgorithm[Any]] = {
    "STANDALONE": specstrat.STANDALONE,
    "STANDALONE-tree": replace(specstrat.STANDALONE, tree=TopkTree(topk=2, num_steps=3)),
}


def _llama(seed: int = 0) -> Any:
    return tiny.model("llama", seed, initializer_range=LEARNABLE_INIT, num_hidden_layers=4)


@pytest.fixture(scope="module")
def target(tokenizer: Any) -> HFCausalLM:
    """The tiny 4-layer learnable llama, wrapped for the engine."""
    return HFCausalLM(_llama(), vocab_size=tiny.VOCAB, name="tiny-llama-4")


@pytest.fixture(scope="module")
def trained(target: HFCausalLM, tokenizer: Any) -> TrainedDraftLM:
    """A one-layer draft distilled with CONFIG from the target's own greedy responses."""
    return train_draft_lm(CONFIG, target, tokenizer, TRAIN, progress=False, source="pool")


@pytest.fixture(scope="module")
def draft_file(trained: TrainedDraftLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained draft, saved."""
    return save_draft_lm(tmp_path_factory.mktemp("draft") / "draft.safetensors", trained)


@pytest.fixture(scope="module")
def models(target: HFCausalLM, tokenizer: Any, draft_file: Path) -> HFModels:
    """The target with the saved draft attached."""
    return attach_draft(HFModels(target=target, tokenizer=tokenizer), draft_file)


def test_default_layers_are_the_first_middle_and_last() -> None:
    """30 layers give (0, 15, 29); a shallow target repeats none."""
    assert default_draft_layers(30) == (0, 15, 29)
    assert default_draft_layers(2) == (0, 1)
    assert default_draft_layers(1) == (0,)


@pytest.mark.parametrize("layers", [(), (0, 0), (2, 1), (4,), (-1,)])
def test_bad_draft_layers_are_refused(layers: tuple[int, ...]) -> None:
    """Draft layers must be distinct ascending indices inside the target's 4 layers."""
    with pytest.raises(InvalidConfig, match=r"must be distinct ascending indices in \[0, 3\]"):
        check_draft_layers(layers, 4)


def test_head_config_takes_one_layer_for_a_draft_lm_only() -> None:
    """A draft LM may start from one layer; a head needs two; an unknown kind is refused."""
    assert HeadConfig(kind="draft-lm", layers=(3,)).layers == (3,)
    with pytest.raises(InvalidConfig, match=r"layers=\(3,\) must be None .* at least 2"):
        HeadConfig(layers=(3,))
    with pytest.raises(InvalidConfig, match=r"HeadConfig\.kind='medusa' must be one of"):
        HeadConfig(kind="medusa")


def test_a_draft_shares_the_embedding_and_copies_layers_and_head_rows() -> None:
    """The draft reads the target's embedding storage, starts from copies of the named layers
    and the final norm, predicts the target's LM-head rows at d2t, and trains (and stores)
    only its layers and norm."""
    llama = _llama()
    d2t = torch.tensor([7, 3, 99, 0])
    draft = DraftLM.from_target(llama, (1, 3), d2t)
    ours, theirs = draft.model.get_decoder(), llama.get_decoder()
    assert ours.embed_tokens.weight.data_ptr() == theirs.embed_tokens.weight.data_ptr()
    for mine, x in zip(ours.layers, (1, 3), strict=True):
        for name, value in mine.state_dict().items():
            assert torch.equal(value, theirs.layers[x].state_dict()[name]), name
    rows = draft.model.get_output_embeddings().weight
    assert torch.equal(rows, llama.get_output_embeddings().weight[d2t])
    stored = set(draft.trainable())
    assert stored
    assert all(n.startswith(("model.layers.", "model.norm.")) for n in stored)
    assert {id(p) for p in draft.train_parameters()} == {
        id(p) for n, p in draft.model.named_parameters() if n in stored
    }


@pytest.mark.parametrize(
    ("d2t", "match"),
    [
        ([1, 400], r"d2t holds id 400, outside the target's vocabulary 0\.\.399"),
        ([-1, 3], r"d2t holds id -1, outside"),
        ([3, 5, 3], r"d2t repeats target ids \(1 repeats\)"),
        ([], r"d2t has shape \(0,\); pass a non-empty 1-D map"),
    ],
)
def test_a_bad_d2t_is_refused(d2t: list[int], match: str) -> None:
    """A draft vocabulary with an id outside the target's, a repeated id, or no id is refused
    naming it."""
    with pytest.raises(InvalidConfig, match=match):
        DraftLM.from_target(_llama(), (0,), torch.tensor(d2t, dtype=torch.int64))


def test_d2t_sits_with_the_weights() -> None:
    """The draft's d2t is on its weights' device (so agreement and the engine index with it)."""
    draft = DraftLM.from_target(_llama(), (0,), torch.arange(10))
    assert draft.get_buffer("d2t").device == next(draft.model.parameters()).device


def test_distillation_beats_the_untrained_draft_by_a_wide_margin(
    trained: TrainedDraftLM, target: HFCausalLM, tokenizer: Any
) -> None:
    """On held-out greedy generations the distilled draft's first draft agrees with the target
    far more often than the same layer undistilled (measured: 0.77 vs 0.02; asserted +0.4),
    and its τ at 5 tokens is higher by more than 1 (measured 3.3 vs 1.02)."""
    gens = generate(target, tokenizer, HELD, max_new_tokens=32)
    with raw_model(target) as lm:
        seqs = capture_sequences(lm, gens, layers=(0, 1), vocab_size=tiny.VOCAB, prompt_rows=True)
        held = draft_data(lm, seqs, layers=(0, 1), d2t=trained.draft.get_buffer("d2t"))
        fresh = DraftLM.from_target(lm, (0,), trained.draft.get_buffer("d2t"))
    ours, theirs = draft_agreement(trained.draft, held), draft_agreement(fresh, held)
    assert ours["anchors"] == theirs["anchors"] > 300
    assert ours["acceptance"][0] > theirs["acceptance"][0] + 0.4
    assert ours["tau"] > theirs["tau"] + 1.0
    assert trained.tau > 2.0
    assert len(trained.acceptance) == CONFIG.eval_depth


def test_the_file_round_trips_and_stores_only_what_the_target_lacks(
    trained: TrainedDraftLM, draft_file: Path, target: HFCausalLM
) -> None:
    """The loaded draft has the trained layers (float16-rounded) and the same facts; the file
    holds the layers, the norm and d2t only, with metadata saying how it was made."""
    loaded = load_draft_lm(draft_file, target)
    for name, value in trained.draft.trainable().items():
        assert torch.equal(loaded.draft.trainable()[name], value.half().float()), name
    assert (loaded.steps, loaded.tau, loaded.layers) == (trained.steps, trained.tau, (0,))
    meta = draft_lm_metadata(draft_file)
    assert meta["format"] == "specstrat-draft-lm/1"
    assert (meta["draft_vocab_size"], meta["data_source"]) == ("128", "pool")
    from safetensors import safe_open

    with safe_open(str(draft_file), framework="pt") as f:
        names = set(f.keys())
    assert names == {*trained.draft.trainable(), "d2t"}


def test_a_draft_for_another_target_is_refused(draft_file: Path, tokenizer: Any) -> None:
    """A draft distilled from the tiny llama is refused on another model, naming both."""
    other = HFCausalLM(_llama(seed=3), vocab_size=tiny.VOCAB, name="other")
    with pytest.raises(HeadMismatch, match=r"was distilled from target .* but target 'other'"):
        attach_draft(HFModels(target=other, tokenizer=tokenizer), draft_file)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, r"missing\.safetensors'?: no such file"),
        (b"not a draft", r"is not a readable safetensors file"),
    ],
)
def test_a_bad_draft_file_is_refused_naming_it(
    tmp_path: Path, content: bytes | None, match: str
) -> None:
    """A --draft that is missing or not a safetensors file is refused before any model loads."""
    path = tmp_path / "missing.safetensors"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=match):
        draft_for("smollm2", str(path), ["STANDALONE"])


def test_a_head_file_is_not_a_draft(tmp_path: Path) -> None:
    """A safetensors file of another format is refused naming both formats."""
    from safetensors.torch import save_file

    path = tmp_path / "head.safetensors"
    save_file({"x": torch.zeros(1)}, str(path), metadata={"format": "specstrat-eagle3-head/1"})
    with pytest.raises(ModelLoadError, match=r"not a specstrat draft LM \(format='specstrat-ea"):
        draft_lm_metadata(path)


@pytest.mark.parametrize("layers", ["5", "[1e400]", '["1"]', "[true]", "[9]"])
def test_a_draft_with_bad_layers_metadata_is_refused(
    layers: str, draft_file: Path, target: HFCausalLM, tmp_path: Path
) -> None:
    """Metadata layers that are not a list of the target's layer indices are refused naming
    the file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(draft_file), framework="pt") as f:
        meta, names = f.metadata(), f.keys()
        tensors = {k: f.get_tensor(k) for k in names}
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata={**meta, "layers": layers})
    with pytest.raises(ModelLoadError, match=r"bad\.safetensors'? (has metadata layers=|does not)"):
        load_draft_lm(path, target)


def test_a_draft_missing_a_tensor_is_refused(
    draft_file: Path, target: HFCausalLM, tmp_path: Path
) -> None:
    """A file that lost a layer's tensor is refused naming it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(draft_file), framework="pt") as f:
        meta, names = f.metadata(), f.keys()
        tensors = {k: f.get_tensor(k) for k in names}
    dropped = next(k for k in tensors if k.startswith("model.layers."))
    del tensors[dropped]
    path = tmp_path / "cut.safetensors"
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(ModelLoadError, match=rf"lacks tensors \['{dropped}'\]"):
        load_draft_lm(path, target)


def test_the_draft_scatters_into_the_targets_vocabulary(models: HFModels) -> None:
    """The engine's draft LM covers the target's 400 ids; ids outside d2t get the lowest
    float, so a draft never proposes them."""
    draft = models.draft
    assert isinstance(draft, DraftVocabLM)
    assert draft.shape.vocab_size == models.target.shape.vocab_size
    from specstrat.hf.attention_probe import Probe

    with torch.inference_mode():
        logits, _ = draft(torch.tensor([5, 9, 11]), torch.arange(3), Probe())
    outside = torch.ones(draft.shape.vocab_size, dtype=torch.bool)
    outside[draft.d2t] = False
    assert bool((logits[:, outside] == torch.finfo(logits.dtype).min).all())
    assert bool((logits[:, draft.d2t] > torch.finfo(logits.dtype).min).all())


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("name", sorted(ALGOS))
def test_standalone_with_the_draft_is_greedy_lossless(
    name: str, overlap: bool, models: HFModels
) -> None:
    """STANDALONE (chain and top-k tree) on the attached draft gives transformers' greedy
    generate token for token, in sync and overlap, and accepts most drafts on held-out chat
    prompts (the distribution it was distilled on)."""
    requests = [
        models.request(rid, n, messages=[{"role": "user", "content": HELD[i]}])
        for i, (rid, n) in enumerate([("a", 24), ("b", 17)])
    ]
    engine = Engine(ALGOS[name], models, EngineConfig(context_len=256, overlap=overlap))
    outputs = engine.run(requests)
    check = compare(models.target, requests, outputs, generate_reference(models.target, requests))
    assert check.lossless, check.line()
    stats = engine.stats
    assert sum(stats.accepted_by_position) > 0.5 * sum(stats.proposed_by_position)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_draft_failing_mid_run_leaks_nothing(overlap: bool, models: HFModels) -> None:
    """A draft LM that raises on its third forward ends the run naming the error, frees every
    slot and KV index, and a fresh engine on the same models is greedy-lossless."""
    draft = models.draft
    assert isinstance(draft, DraftVocabLM)
    calls = [0]

    class Failing(DraftVocabLM):
        def __call__(
            self, tokens: torch.Tensor, positions: torch.Tensor, attention: AttentionBackend
        ) -> tuple[torch.Tensor, torch.Tensor]:
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("draft fault injected")
            return super().__call__(tokens, positions, attention)

    broken = Failing(draft.inner, draft.d2t, draft.shape.vocab_size)
    ids = models.tokenizer("def wrap(text, width=70):\n    return text")["input_ids"]
    requests = [Request("a", ids[:12], 12), Request("b", ids[:5], 9)]
    config = EngineConfig(context_len=64, overlap=overlap)
    assert_fault_leaks_nothing(
        specstrat.STANDALONE,
        models,
        requests,
        config,
        "draft fault injected",
        broken_models=replace(models, draft=broken),
    )


def test_a_second_draft_is_refused(models: HFModels, draft_file: Path) -> None:
    """Models that already have a draft LM get no second one."""
    with pytest.raises(InvalidConfig, match=r"the models already have a draft LM"):
        attach_draft(models, draft_file)


@pytest.fixture(scope="module")
def head_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained (seeded) head for the 4-layer tiny llama, saved."""
    return save_untrained_head(_llama(), (0, 1), tmp_path_factory.mktemp("head"))


@pytest.mark.parametrize("head_first", [True, False], ids=["head-then-draft", "draft-then-head"])
def test_a_head_and_a_draft_are_both_replayed(
    head_first: bool, head_file: Path, draft_file: Path, tokenizer: Any
) -> None:
    """A head and a draft attached in either order are both recorded, in that order, in one
    picklable attacher; replayed on freshly loaded models (as the disaggregation prefill
    process does) it attaches both again."""

    def fresh() -> HFModels:
        return HFModels(target=HFCausalLM(_llama(), vocab_size=tiny.VOCAB), tokenizer=tokenizer)

    steps: list[Any] = [HeadAttacher(str(head_file)), DraftAttacher(str(draft_file))]
    steps = steps if head_first else steps[::-1]
    models = fresh()
    for step in steps:
        models = step(models)
    assert models.attach == Attachers(tuple(steps))
    loader = HFLoader("some/model", "float32", models.attach)
    assert pickle.loads(pickle.dumps(loader)) == loader
    replayed = models.attach(fresh())
    assert replayed.head is not None
    assert isinstance(replayed.draft, DraftVocabLM)
    assert replayed.attach == models.attach


def test_attach_files_records_the_draft_attacher(models: HFModels, draft_file: Path) -> None:
    """attach_files with only a draft records its DraftAttacher in models.attach."""
    plain = replace(models, draft=None, attach=None)
    attached = attach_files(plain, None, str(draft_file))
    assert attached.attach == DraftAttacher(str(draft_file))
    assert isinstance(attached.draft, DraftVocabLM)


def test_draft_for_picks_the_flag_then_the_shipped_draft_for_a_draft_lm_drafter(
    draft_file: Path,
) -> None:
    """--draft wins; without it STANDALONE on smollm2 gets the shipped draft, others none."""
    assert draft_for("smollm2", str(draft_file), ["NGRAM"]) == str(draft_file)
    assert draft_for("smollm2", None, ["NGRAM", "EAGLE"]) is None
    assert draft_for("/some/model", None, ["STANDALONE"]) is None
    shipped = shipped_draft("smollm2")
    assert shipped is not None, "the package ships no draft LM for smollm2"
    assert draft_for("smollm2", None, ["STANDALONE"]) == str(shipped)


def test_only_a_drafter_that_reads_the_draft_lm_gets_it() -> None:
    """Early exit and the block drafters declare a draft model of their own and get no shipped
    draft; a FirstMatch with a draft-LM member does."""
    from specstrat.hf.algorithms import EARLY_EXIT
    from specstrat.strategies import DraftModelDrafterFactory, FirstMatch, NgramDrafterFactory

    assert draft_for("smollm2", None, [EARLY_EXIT, "DFLASH", "DSPARK"]) is None
    composed = replace(
        specstrat.STANDALONE,
        name="LOOKUP_THEN_DRAFT",
        drafter=FirstMatch((NgramDrafterFactory(), DraftModelDrafterFactory())),
    )
    assert reads_draft_lm(composed)
    assert not reads_draft_lm(specstrat.DFLASH)


def test_each_trainer_refuses_the_other_kind(target: HFCausalLM, tokenizer: Any) -> None:
    """train_head refuses kind='draft-lm' and train_draft_lm kind='eagle3', before any work."""
    from specstrat.train import train_head

    with pytest.raises(InvalidConfig, match=r"train_head trains kind='eagle3'"):
        train_head(CONFIG, target, tokenizer, TRAIN)
    with pytest.raises(InvalidConfig, match=r"train_draft_lm trains kind='draft-lm'"):
        train_draft_lm(HeadConfig(), target, tokenizer, TRAIN)


def test_demo_and_bench_refuse_a_draft_on_the_embedded_models(
    draft_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--draft without --model is refused naming the flag and the fix, before any run."""
    with pytest.raises(SystemExit, match=r"--draft .* pass --model smollm2 or --model PATH"):
        main(["demo", "--draft", str(draft_file)])
    argv = ["bench", "--algo", "STANDALONE", "--draft", str(draft_file), "--requests", "1"]
    assert main(argv) == 2
    assert "specstrat bench: InvalidConfig: --draft" in capsys.readouterr().err


def test_bench_sets_transformers_assisted_generation_beside_standalone(
    draft_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --baseline hf` with STANDALONE and a draft LM adds hf-assisted at batch size 1
    (transformers' assisted generation with the same draft), lossless, drafting (τ > 1)."""
    import json

    model = tiny.save_model(_llama(), tmp_path / "tiny-4")
    argv = ["bench", "--model", str(model), "--algo", "STANDALONE", "--draft", str(draft_file)]
    argv += ["--baseline", "hf", "--requests", "1", "--max-new-tokens", "16", "--repeats", "1"]
    argv += ["--warmup", "0", "--draft-tokens", "3", "--json", "-"]
    assert main(argv) == 0
    rows = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert {"NONE", "hf-generate", "hf-prompt-lookup", "hf-assisted", "STANDALONE"} <= set(rows)
    assisted = rows["hf-assisted"]
    assert (assisted["batch_size"], assisted["draft_tokens"]) == (1, 3)
    assert assisted["lossless"] is True
    assert assisted["tau"] > 1.0
