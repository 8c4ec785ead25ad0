"""Every 0.3.0 public name and import path still works through 0.4.x; renamed ones warn with
their replacement, and renamed fields and keywords read through to the new names."""

import importlib
import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import specstrat
from specstrat import DraftAdmission, DraftStep, InvalidConfig, RelayPayload, TreeShape
from specstrat._deprecation import RemovedIn050
from specstrat.runtime import TransferBatch

PUBLIC_0_3_0: dict[str, list[str]] = json.loads(
    (Path(__file__).parent / "public_0_3_0.json").read_text()
)
NAMES = [(module, name) for module, names in PUBLIC_0_3_0.items() for name in names]


@pytest.mark.parametrize(("module", "name"), NAMES, ids=[f"{m}:{n}" for m, n in NAMES])
def test_every_0_3_0_public_name_still_imports(module: str, name: str) -> None:
    """Each name of a 0.3.0 module's __all__ is still there; if anything warns, it is the
    deprecation warning naming what replaced it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(module), name)
    assert value is not None or name in {"DraftT_co", "DraftT_contra"}
    for warning in caught:
        assert issubclass(warning.category, RemovedIn050), warning
        assert "deprecated since specstrat 0.4.0" in str(warning.message)


@pytest.mark.parametrize(
    ("module", "name", "replacement"),
    [
        ("specstrat", "EagleHeadDrafterFactory", "specstrat.strategies.EagleHeadDrafterFactory"),
        ("specstrat", "TopkTree", "specstrat.strategies.TopkTree"),
        ("specstrat.runtime", "ModelWorker", "internal now, with no public replacement"),
        ("specstrat.strategies.drafters", "DraftKVSlots", "DraftRows"),
    ],
)
def test_moved_names_warn_naming_the_new_place(module: str, name: str, replacement: str) -> None:
    """A moved name still resolves, with a RemovedIn050 warning naming where it went."""
    with pytest.warns(RemovedIn050, match=rf"{module}\.{name} is deprecated.*{replacement}"):
        getattr(importlib.import_module(module), name)


def test_a_moved_module_path_warns_and_serves_the_same_objects() -> None:
    """`specstrat.runtime.worker` is a shim: it warns once and holds the private module's
    classes, not copies."""
    import sys

    sys.modules.pop("specstrat.runtime.worker", None)
    with pytest.warns(RemovedIn050, match=r"module specstrat\.runtime\.worker is deprecated"):
        old = importlib.import_module("specstrat.runtime.worker")
    from specstrat.runtime._worker import ModelWorker

    assert old.ModelWorker is ModelWorker


def test_unknown_names_are_still_attribute_errors() -> None:
    """The deprecation __getattr__ serves only the listed names."""
    with pytest.raises(AttributeError, match=r"module 'specstrat' has no attribute 'Nope'"):
        specstrat.Nope  # type: ignore[attr-defined]  # noqa: B018


def _step(**kwargs: object) -> DraftStep:
    base: dict[str, object] = {
        "slots": (1,), "seq_lens": torch.tensor([3]), "max_nodes": 2,
        "sampling": (specstrat.GREEDY,),
    }  # fmt: skip
    return DraftStep(**{**base, **kwargs})  # type: ignore[arg-type]


def test_renamed_draft_step_fields_read_through_and_take_the_old_keywords() -> None:
    """DraftStep(last_tokens=, relay=) builds the new fields; .last_tokens and .relay read them."""
    payload = RelayPayload(seq_lens=torch.tensor([3]))
    with pytest.warns(RemovedIn050, match=r"DraftStep\(last_tokens=\.\.\.\).*bonus_tokens"):
        step = _step(last_tokens=torch.tensor([7]), payload=payload)
    assert step.bonus_tokens.tolist() == [7]
    with pytest.warns(RemovedIn050, match=r"DraftStep\.last_tokens is deprecated.*bonus_tokens"):
        assert step.last_tokens is step.bonus_tokens
    with pytest.warns(RemovedIn050, match=r"DraftStep\.relay is deprecated.*DraftStep\.payload"):
        assert step.relay is payload
    with pytest.warns(RemovedIn050, match=r"DraftStep\(last_tokens=\.\.\.\)"):
        moved = replace(step, last_tokens=torch.tensor([9]))  # type: ignore[call-arg]
    assert moved.bonus_tokens.tolist() == [9]


def test_renamed_admission_and_transfer_fields() -> None:
    """first_tokens (DraftAdmission, TransferBatch) is bonus_tokens, old keyword included."""
    ids = torch.tensor([4])
    with pytest.warns(RemovedIn050, match=r"DraftAdmission\(first_tokens=\.\.\.\)"):
        admission: DraftAdmission[None] = DraftAdmission(
            slots=(1,), first_tokens=ids, seq_lens=ids, hidden=None, draft_input=None
        )  # type: ignore[call-arg]
    assert admission.bonus_tokens is ids
    with pytest.warns(RemovedIn050, match=r"DraftAdmission\.first_tokens is deprecated"):
        assert admission.first_tokens is ids
    kv = torch.zeros(1, 1, 1, 1)
    batch = TransferBatch(("r",), ((1,),), ids, ids, kv, kv)
    with pytest.warns(RemovedIn050, match=r"TransferBatch\.first_tokens is deprecated"):
        assert batch.first_tokens is ids


def test_tree_shape_takes_num_draft_tokens_as_tokens_per_req() -> None:
    """TreeShape's verify width is tokens_per_req (T); the 0.3.0 keyword and field still work."""
    with pytest.warns(RemovedIn050, match=r"TreeShape\(num_draft_tokens=\.\.\.\)"):
        shape = TreeShape(topk=2, num_steps=2, num_draft_tokens=5)  # type: ignore[call-arg]
    assert shape == TreeShape(topk=2, num_steps=2, tokens_per_req=5)
    with pytest.warns(RemovedIn050, match=r"TreeShape\.num_draft_tokens is deprecated"):
        assert shape.num_draft_tokens == 5
    with pytest.warns(RemovedIn050, match=r"TreeShape\.chain\(num_draft_tokens=\.\.\.\)"):
        assert TreeShape.chain(num_draft_tokens=4) == TreeShape.chain(4)


def test_engine_internals_warn_and_point_to_the_public_api() -> None:
    """Engine.target (0.3.0) still reads, with a warning naming the public API to use."""
    from specstrat.runtime import EmbeddedModels, Engine

    engine = Engine("NGRAM", EmbeddedModels.load())
    with pytest.warns(RemovedIn050, match=r"Engine\.target is deprecated.*Engine API"):
        assert engine.target.device == engine.device


def test_warnings_point_at_the_users_line() -> None:
    """A renamed attribute, keyword, replace() and a moved name all warn at the caller's line,
    not inside specstrat or dataclasses (so default filters show them)."""
    step = _step(bonus_tokens=torch.tensor([7]), payload=RelayPayload())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step.last_tokens  # noqa: B018
        replace(step, last_tokens=torch.tensor([9]))  # type: ignore[call-arg]
        specstrat.TopkTree  # noqa: B018
    assert [Path(w.filename).name for w in caught] == ["test_deprecated_names.py"] * 3


def test_an_old_and_a_new_keyword_at_once_is_a_type_error() -> None:
    """Passing a renamed field both ways is refused, as Python refuses a repeated argument;
    TreeShape.chain needs its width."""
    with pytest.raises(TypeError, match=r"DraftStep\(\) got last_tokens= .* and bonus_tokens="):
        _step(bonus_tokens=torch.tensor([1]), last_tokens=torch.tensor([2]), payload=RelayPayload())
    with pytest.raises(TypeError, match=r"got num_draft_tokens= .* and tokens_per_req= at once"):
        TreeShape.chain(4, num_draft_tokens=5)
    with pytest.raises(TypeError, match=r"TreeShape.chain\(\) missing its argument tokens_per_req"):
        TreeShape.chain()
    with pytest.raises(InvalidConfig, match=r"tokens_per_req='4' must be an int >= 1"):
        TreeShape.chain("4")  # type: ignore[arg-type]


def test_tree_policies_take_the_old_keyword() -> None:
    """ChainTree and TopkTree answer tree_shape(num_draft_tokens=) with a warning."""
    from specstrat.strategies import ChainTree, TopkTree

    with pytest.warns(RemovedIn050, match=r"TopkTree.tree_shape\(num_draft_tokens=\.\.\.\)"):
        assert TopkTree(topk=2, num_steps=2).tree_shape(num_draft_tokens=5).tokens_per_req == 5
    with pytest.warns(RemovedIn050, match=r"ChainTree.tree_shape\(num_draft_tokens=\.\.\.\)"):
        assert ChainTree().tree_shape(num_draft_tokens=3) == TreeShape.chain(3)


def test_setting_an_old_engine_attribute_reaches_the_new_one() -> None:
    """engine.margin = ... (0.3.0) warns and sets the attribute the engine reads."""
    from specstrat.runtime import EmbeddedModels, Engine

    engine = Engine("NGRAM", EmbeddedModels.load())
    with pytest.warns(RemovedIn050, match=r"Engine\.margin is deprecated"):
        engine.margin = 20
    with pytest.warns(RemovedIn050):
        assert engine.margin == 20


def test_a_shim_serves_the_old_modules_other_names() -> None:
    """A 0.3.0 module path still has the names its module had outside __all__."""
    import sys

    sys.modules.pop("specstrat.runtime.models.model", None)
    with pytest.warns(
        RemovedIn050, match=r"specstrat\.runtime\.models\.model is deprecated.*internal"
    ):
        old = importlib.import_module("specstrat.runtime.models.model")
    from specstrat.runtime._models import model

    assert old.VOCAB == model.VOCAB
